"""User-facing errors: one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

_err = Console(stderr=True, highlight=False)


class HarnessError(Exception):
    """An error caused by the user's input or environment; its message is shown as one line."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` in red and exit with ``code``."""
    _err.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    raise typer.Exit(code)
