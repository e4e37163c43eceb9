"""The ``harness`` command. Each subcommand lives in its own module with a ``register(app)``.

Commands only parse flags, build a config and call one library function; errors that users
cause become one red line and exit code 2 (see :func:`harness.cli.errors.fail`).
"""

from __future__ import annotations

import gc
import importlib
import os

import numpy as np
import typer

app = typer.Typer(
    name="harness",
    help="Trace-replay benchmark harness and scheduler lab for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One line per command module; each defines register(app).
COMMAND_MODULES = (
    "replay",
    "simulate",
    "serve",
    "trace",
    "report",
    "sweep",
    "experiment",
    "bench",
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"harness.cli.{_name}").register(app)


@app.command()
def version() -> None:
    """Print the harness version."""
    from harness import __version__

    typer.echo(__version__)


@app.command()
def policies(
    params: bool = typer.Option(
        False, "--params", help="Also list each policy's parameters (for --param) and defaults."
    ),
) -> None:
    """List the scheduling policies every host can run, then the cluster routers."""
    from harness.policies.registry import available

    for name in available():
        if not params:
            typer.echo(name)
            continue
        doc, rows = policy_params(name)
        typer.echo(f"{name}: {doc}" if doc else name)
        for pname, default in rows:
            typer.echo(f"  --param {name}.{pname}={default}")
        if not rows:
            typer.echo("  (no parameters)")
    list_routers(params)


def list_routers(params: bool) -> None:
    """The cluster routers (``--router`` of ``serve --replicas`` and ``simulate --replicas``)."""
    from harness.routers.registry import available_routers, router_class

    typer.echo("routers:")
    for name in available_routers():
        if not params:
            typer.echo(f"  {name}")
            continue
        doc, rows = class_params(router_class(name))
        typer.echo(f"  {name}: {doc}" if doc else f"  {name}")
        for pname, default in rows:
            typer.echo(f"    --router-param {pname}={default}")
        if not rows:
            typer.echo("    (no parameters)")


def policy_params(name: str) -> tuple[str, list[tuple[str, str]]]:
    """(first docstring line, [(parameter, default as JSON-ish text)]) of a policy, read from
    its constructor so the list never drifts from the code."""
    from harness.policies.registry import policy_class

    return class_params(policy_class(name))


def class_params(cls: type) -> tuple[str, list[tuple[str, str]]]:
    """(first docstring line, [(parameter, default)]) of a policy or router class."""
    import inspect
    import json

    doc = (inspect.getdoc(cls) or "").splitlines()[0] if inspect.getdoc(cls) else ""
    rows = []
    for klass in cls.__mro__:  # a subclass taking **kwargs inherits its base's parameters
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        sig = inspect.signature(init)
        named = [
            p
            for p in sig.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        for p in named:
            if p.default is inspect.Parameter.empty:
                default = "REQUIRED"
            else:
                try:
                    default = json.dumps(p.default)
                except TypeError:
                    default = repr(p.default)
            if p.name not in (r[0] for r in rows):
                rows.append((p.name, default))
        if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            break
    return doc, rows


def _no_numpy_hugepages() -> None:
    """Stop numpy asking for transparent huge pages on its large arrays (``madvise``), for this
    process and the ones it starts, unless ``NUMPY_MADVISE_HUGEPAGE`` says otherwise. Why: with
    THP in ``madvise`` mode and defrag on ``madvise`` (a common kernel default), the first touch
    of such an array may compact memory to find a 2 MB page; the summary's short-lived 15-20M
    row arrays then spent more time in the kernel than in numpy (a 100k-request simulation on
    Azure-conversation lengths: 3.0 s of system time, 1.0 s without; user time unchanged)."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return  # numpy read the user's choice at import
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"  # children (servers, workers) import numpy anew
    core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1.26
    setter = getattr(core.multiarray, "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)


def main() -> None:
    _no_numpy_hugepages()
    try:
        app()
    finally:
        # The process exits next. Its interpreter's last full collection would walk every
        # object still alive (after a 100k-request simulation: ~0.14 s of a 10 s process) to
        # free memory the OS takes back anyway; frozen objects are left out of it. Exit
        # handlers, stream flushes and module teardown run as before.
        gc.freeze()


if __name__ == "__main__":
    main()
