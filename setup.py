"""Build of the optional C extensions; the project's metadata is in pyproject.toml.

- ``harness.loadgen._sse_scan``: the load generator's SSE byte scan (issue 18);
- ``harness.engine._rows``: the simulator kernel's scalar loops over its running arrays
  (issue 13);
- ``harness.policies._planops``: the column policies' per-decode passes (issue 13);
- ``harness.results._chunkgroup``: the summary's grouping of the chunk log by request
  (issue 13);
- ``harness.results._orderstats``: the summary's percentiles by radix selection (issue 13);
- the pure-Python modules :data:`harness.compiled.MODULES` (the simulator kernel, the
  policies, the summary's passes), compiled from their ``.py`` by Cython where it is present
  (a build requirement in pyproject.toml), with a record of the sources built
  (:data:`harness.compiled.RECORD`) so that an edited ``.py`` runs from source until the next
  build (issue 13).

``optional=True``: where an extension cannot be compiled (no compiler, no Python headers)
the install still succeeds and its module uses the pure-Python code that does the same
(:mod:`harness.loadgen.fastscan`, :mod:`harness.engine.fastsim`,
:mod:`harness.policies.planops`, :mod:`harness.results.chunklog`,
:mod:`harness.results.metrics`).
"""

import importlib.util
import json
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The kernel's and the policies' C passes repeat Python's float arithmetic operation by
# operation (step times, attention work, deadlines): a fused multiply-add would round once
# where Python rounds twice (aarch64 compilers fuse by default), so none is allowed.
_EXACT = [] if sys.platform == "win32" else ["-ffp-contract=off"]


def _load_compiled_py():  # harness/compiled.py is stdlib only: readable before any install
    spec = importlib.util.spec_from_file_location("_harness_compiled", "harness/compiled.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_COMPILED = _load_compiled_py()


def _numpy_api() -> dict:
    """Build options for reading numpy arrays directly (numpy's headers, a build requirement in
    pyproject.toml), where numpy is importable: ``_planops`` then skips numpy's buffer export,
    which formats a dtype string on every call, for the arrays it can read as they are. Without
    it the extension reads every array through the buffer protocol."""
    try:
        import numpy
    except ImportError:
        return {}
    return {
        "include_dirs": [numpy.get_include()],
        "define_macros": [("HARNESS_NUMPY_API", "1")],
    }


# Each compiled module's source digest as this build read it, before Cython did: the record
# names these, never a digest taken after the compile (an edit saved meanwhile would be
# recorded as built).
_BUILT_FROM: dict[str, str] = {}


def _cython_extensions() -> list[Extension]:
    """The listed modules as Cython extensions; none without Cython or with
    ``HARNESS_COMPILE=0`` (the engine tiers' installs: they need the package importable, and
    a second build into the same folders at once would only race the first).

    Cython regenerates a module's C when the ``.py`` is newer; file times can say "fresh" for
    other content (a copy that keeps times, a second builder), so a module whose generated C
    was not made from this very source (its digest beside the C) is regenerated."""
    if os.environ.get("HARNESS_COMPILE") == "0":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    # no debug info: it does not change the code, and it was ~40% of the compile time (the
    # kernel's generated C: 42 s against 25 s at -O3); -O1 instead would cost ~4% more
    # kernel instructions
    flags = _EXACT if sys.platform == "win32" else [*_EXACT, "-g0"]
    build_dir = "build/cython"
    fresh, stale = [], []
    for m in _COMPILED.MODULES:
        src = _COMPILED.source_of(m)
        digest = _BUILT_FROM[m] = _COMPILED.source_digest(src)
        ext = Extension(m, [str(src)], extra_compile_args=flags, optional=True)
        made_from = os.path.join(build_dir, src.with_suffix(".c.source-sha256"))
        try:
            with open(made_from) as f:
                made_fresh = f.read().strip() == digest
        except OSError:
            made_fresh = False
        if made_fresh:
            fresh.append(ext)
        else:
            stale.append((ext, made_from, digest))
    directives = {
        "language_level": 3,
        "binding": True,  # functions keep their signatures and attributes
        "annotation_typing": False,  # annotations stay hints: Python's semantics
    }
    out = []
    # a module Cython rejects is left out (exclude_failures): it runs from its source
    for group, force in (([e for e, _, _ in stale], True), (fresh, False)):
        if group:
            out += cythonize(
                group,
                build_dir=build_dir,  # generated C stays out of the source folders
                compiler_directives=directives,
                force=force,
                exclude_failures=True,
                quiet=True,
            )
    made = {e.name for e in out}
    for ext, made_from, digest in stale:
        if ext.name in made:  # its C was just generated from this source
            with open(made_from, "w") as f:
                f.write(digest)
    return out


class BuildRecordingSources(build_ext):
    """build_ext on every core, every extension compiled afresh (a built module newer than
    its C says nothing of which C: the editable install builds in a fresh folder anyway),
    then the record of the sources the compiled modules were built from
    (:data:`harness.compiled.RECORD`: module -> SHA-256) beside them."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1
        self.force = True
        self._built: set[str] = set()

    def build_extension(self, ext: Extension) -> None:
        super().build_extension(ext)  # raises where it failed (an optional one: skipped)
        self._built.add(ext.name)

    def run(self) -> None:
        super().run()
        built = {m: d for m, d in _BUILT_FROM.items() if m in self._built}
        if not built:
            return  # nothing compiled here: a record from an earlier build stays as true as it was
        path = os.path.join(
            os.path.dirname(self.get_ext_fullpath("harness.compiled")), _COMPILED.RECORD
        )
        # entries of modules not built now stay: each names the source its extension was
        # built from, which a changed source no longer matches
        record = _COMPILED.read_record(path)
        for m, digest in built.items():
            if _COMPILED.source_digest(_COMPILED.source_of(m)) == digest:
                record[m] = digest
            else:  # edited while it compiled: the build is of the earlier text
                record.pop(m, None)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        os.replace(tmp, path)


setup(
    cmdclass={"build_ext": BuildRecordingSources},
    ext_modules=[
        Extension(
            "harness.loadgen._sse_scan",
            sources=["harness/loadgen/_sse_scan.c"],
            optional=True,
        ),
        Extension(
            "harness.engine._rows",
            sources=["harness/engine/_rows.c"],
            extra_compile_args=_EXACT,
            optional=True,
        ),
        Extension(
            "harness.policies._planops",
            sources=["harness/policies/_planops.c"],
            extra_compile_args=_EXACT,
            optional=True,
            **_numpy_api(),
        ),
        Extension(
            "harness.results._chunkgroup",
            sources=["harness/results/_chunkgroup.c"],
            optional=True,
        ),
        Extension(
            "harness.results._orderstats",
            sources=["harness/results/_orderstats.c"],
            optional=True,
        ),
        *_cython_extensions(),
    ],
)
