"""User-facing errors: one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

import typer
from rich.console import Console

# emoji=False and an escaped message: ":B:" or "[x]" in user input must print as typed (issue 20)
_err = Console(stderr=True, highlight=False, emoji=False)


class HarnessError(Exception):
    """An error caused by the user's input or environment; its message is shown as one line."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` in red and exit with ``code``."""
    from rich.markup import escape

    _err.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr (the run went on; the user should know why)."""
    from rich.markup import escape

    _err.print(f"[bold yellow]warning:[/] {escape(message)}", markup=True, soft_wrap=True)


def one_line(exc: BaseException, flags: Mapping[str, str] | None = None) -> str:
    """An error as one readable line; a pydantic ValidationError names the offending flag.

    ``flags`` maps config field names to the CLI flag that sets them, where they differ
    (e.g. ``{"policies": "policy"}``).
    """
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ()) if x != "__root__")
            msg = str(first.get("msg", exc)).removeprefix("Value error, ")
            flag = (flags or {}).get(loc, loc.replace("_", "-"))
            return f"--{flag}: {msg}" if loc else msg
        except (IndexError, TypeError, KeyError):
            pass
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
