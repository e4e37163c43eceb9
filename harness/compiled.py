"""The pure-Python modules the install compiles with Cython, and the import rule that runs each
one compiled only while its build matches its source.

Why: what is left of the simulator's time in the slower policies is Python between the C
passes, a few microseconds a step (its plans, the host's rules for them, their hooks), spread
over many functions. Cython compiles the same ``.py`` files into extensions that skip the
interpreter's dispatch: no second implementation, Python's semantics kept (annotations are
not read as C types, ``annotation_typing=False``), the same answers (the identity tests run
the compiled kernel against the interpreted reference host).

A built extension (``fastsim.cpython-311-x86_64-linux-gnu.so``) lies beside its ``.py`` and
Python's import takes it first, so an edited ``.py`` would silently run the old build. The
build (``setup.py``) records the SHA-256 of each source it compiled in :data:`RECORD`;
:class:`FreshBuilds`, first on ``sys.meta_path`` (``harness/__init__``), loads a listed module
from its source whenever the record does not match it, whenever there is no record, and
whenever ``HARNESS_INTERPRETED=1`` (for profilers that read Python frames, py-spy and
line_profiler, and for A/B runs). Stdlib only: ``setup.py`` reads :data:`MODULES` from here
before anything is installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# The simulator kernel and what it calls every step: the policies' plans and their column
# views, the row requests and waiting queues, the result types; and the summary's passes.
# Not: the engine core (the reference host the identity tests compare against stays
# interpreted) nor pydantic models (simulate.py: pydantic reads the class body).
MODULES: tuple[str, ...] = (
    "harness.engine.fastsim",
    "harness.engine.row_requests",
    "harness.engine.waiting_queue",
    "harness.engine.simresult",
    "harness.policies.base",
    "harness.policies.columns",
    "harness.policies.common",
    "harness.policies.planops",
    "harness.policies.thresholds",
    "harness.policies.vllm_v1",
    "harness.policies.vllm_v0",
    "harness.policies.sarathi",
    "harness.policies.orca",
    "harness.policies.fastertransformer",
    "harness.policies.class_priority",
    "harness.policies.wait",
    "harness.policies.nested_wait",
    "harness.policies.mcsf",
    "harness.policies.mcsf_baselines",
    "harness.policies.slai",
    "harness.policies.rad",
    "harness.results.metrics",
    "harness.results.chunklog",
    "harness.results.summary",
)

#: The build's record, in the ``harness`` package folder: ``{module: sha256 of its source}``,
#: one per interpreter ABI (the extensions' own suffix), so that a build for another Python in
#: the same checkout never vouches for this one's extensions.
RECORD = f"compiled{os.path.splitext(importlib.machinery.EXTENSION_SUFFIXES[0])[0]}.json"
#: Set to ``1`` to run every listed module from its ``.py``.
ENV = "HARNESS_INTERPRETED"


def source_of(module: str, root: str | os.PathLike[str] = ".") -> Path:
    """A listed module's ``.py`` under ``root`` (the folder holding ``harness/``)."""
    return Path(root, *module.split(".")).with_suffix(".py")


def source_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a source file's bytes: what a build is checked against."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_record(path: str | os.PathLike[str]) -> dict[str, str]:
    """A build record, or ``{}`` where there is none (or it cannot be read: then nothing
    counts as built)."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


class FreshBuilds:
    """Import a listed module from its source unless its extension was built from exactly
    that source (the record's digest) and ``interpreted`` is off. Everything else is left
    to the path finder (``None``), which prefers the extension. (A meta path finder by its
    ``find_spec``: importlib.abc's base class would cost ~9 ms of imports a process.)"""

    def __init__(
        self, record: str | os.PathLike[str], modules: Sequence[str], interpreted: bool
    ) -> None:
        self.record = Path(record)
        self.modules = frozenset(modules)
        self.interpreted = interpreted
        self._digests: dict[str, str] | None = None

    def digests(self) -> dict[str, str]:
        if self._digests is None:
            self._digests = read_record(self.record)
        return self._digests

    def invalidate_caches(self) -> None:
        """importlib.invalidate_caches(): read the record again (a rebuild in this process's
        lifetime)."""
        self._digests = None

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: object = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        leaf = fullname.rpartition(".")[2] + ".py"
        source = next(
            (s for s in (os.path.join(d, leaf) for d in path or ()) if os.path.isfile(s)), None
        )
        if source is None:
            return None
        if not self.interpreted and self.digests().get(fullname) == source_digest(source):
            return None  # the build is of this source: the path finder takes the extension
        return importlib.util.spec_from_file_location(fullname, source)


def install() -> FreshBuilds:
    """Put :class:`FreshBuilds` first on ``sys.meta_path`` (once)."""
    for finder in sys.meta_path:
        if isinstance(finder, FreshBuilds):
            return finder
    finder = FreshBuilds(Path(__file__).with_name(RECORD), MODULES, os.environ.get(ENV) == "1")
    sys.meta_path.insert(0, finder)
    return finder


def runs_compiled() -> list[str]:
    """The listed modules that run compiled in this process, imported or not (the benchmark's
    header): an extension is built and :class:`FreshBuilds` leaves it to the path finder."""
    finder = install()
    root = Path(__file__).resolve().parent.parent
    out = []
    for name in MODULES:
        src = source_of(name, root)
        built = any(
            src.with_suffix(suffix).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES
        )
        if built and src.is_file() and finder.find_spec(name, [str(src.parent)]) is None:
            out.append(name)
    return out
