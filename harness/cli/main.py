"""The ``harness`` command. Each subcommand lives in its own module with a ``register(app)``.

Commands only parse flags, build a config and call one library function; errors that users
cause become one red line and exit code 2 (see :func:`harness.cli.errors.fail`).
"""

from __future__ import annotations

import importlib

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
def policies() -> None:
    """List the scheduling policies every host can run."""
    from harness.policies.registry import available

    for name in available():
        typer.echo(name)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
