"""The compiled hot modules (harness/compiled.py): a listed module runs compiled only while its
build matches its source; an edit, a missing record or HARNESS_INTERPRETED=1 runs the source."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import compiled

ROOT = Path(__file__).resolve().parents[1]


def _package(tmp_path: Path, record: dict[str, str] | None) -> tuple[Path, Path]:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    src = pkg / "hot.py"
    src.write_text("VALUE = 1\n")
    rec = tmp_path / compiled.RECORD
    if record is not None:
        rec.write_text(json.dumps(record))
    return src, rec


def test_a_build_of_this_source_is_left_to_the_path_finder(tmp_path: Path) -> None:
    src, rec = _package(tmp_path, None)
    rec.write_text(json.dumps({"pkg.hot": compiled.source_digest(src)}))
    finder = compiled.FreshBuilds(rec, ["pkg.hot"], interpreted=False)
    assert finder.find_spec("pkg.hot", [str(src.parent)]) is None


@pytest.mark.parametrize(
    ("record", "interpreted"),
    [
        ({"pkg.hot": "0" * 64}, False),  # the source was edited after the build
        (None, False),  # no record: nothing counts as built
        ({}, False),  # built without this module (its optional build failed)
        ("match", True),  # HARNESS_INTERPRETED=1
    ],
)
def test_otherwise_the_source_is_imported(
    tmp_path: Path, record: dict[str, str] | str | None, interpreted: bool
) -> None:
    src, rec = _package(tmp_path, None)
    if record == "match":
        record = {"pkg.hot": compiled.source_digest(src)}
    if record is not None:
        rec.write_text(json.dumps(record))
    finder = compiled.FreshBuilds(rec, ["pkg.hot"], interpreted=interpreted)
    spec = finder.find_spec("pkg.hot", [str(src.parent)])
    assert spec is not None
    assert spec.origin == str(src)
    assert isinstance(spec.loader, importlib.machinery.SourceFileLoader)


def test_unlisted_modules_and_a_missing_source_are_not_its_business(tmp_path: Path) -> None:
    src, rec = _package(tmp_path, {})
    finder = compiled.FreshBuilds(rec, ["pkg.hot", "pkg.gone"], interpreted=True)
    assert finder.find_spec("pkg.other", [str(src.parent)]) is None
    assert finder.find_spec("pkg.gone", [str(src.parent)]) is None


def test_an_unreadable_record_counts_as_no_build(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    assert compiled.read_record(tmp_path / "bad.json") == {}
    assert compiled.read_record(tmp_path / "list.json") == {}
    assert compiled.read_record(tmp_path / "missing.json") == {}


def test_the_list_names_modules_of_this_package() -> None:
    for name in compiled.MODULES:
        assert compiled.source_of(name, ROOT).is_file(), name
    assert len(set(compiled.MODULES)) == len(compiled.MODULES)


def _origins(env: dict[str, str]) -> dict[str, str]:
    code = (
        "import importlib, json\n"
        "from harness import compiled\n"
        "print(json.dumps({m: importlib.import_module(m).__spec__.origin"
        " for m in compiled.MODULES}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def test_this_install_runs_each_module_compiled_exactly_when_its_build_is_fresh() -> None:
    """In this checkout: every listed module whose record matches its source loads from the
    extension, every other one from its ``.py``; HARNESS_INTERPRETED=1 loads them all from
    source. (Where the install had no Cython or no compiler there is no record and every
    module is a source module: the second half still holds.)"""
    env = {k: v for k, v in os.environ.items() if k != compiled.ENV}
    record = compiled.read_record(ROOT / "harness" / compiled.RECORD)
    origins = _origins(env)
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for name, origin in origins.items():
        src = compiled.source_of(name, ROOT)
        fresh = record.get(name) == compiled.source_digest(src)
        assert origin.endswith(suffixes) == fresh, (name, origin)
    compiled_ones = {n for n, o in origins.items() if o.endswith(suffixes)}
    assert set(compiled.runs_compiled()) == compiled_ones  # what the benchmark's header counts
    interpreted = _origins({**env, compiled.ENV: "1"})
    assert all(o.endswith(".py") for o in interpreted.values()), interpreted
