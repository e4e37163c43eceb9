"""`harness sweep`: placeholder until its issue lands; register(app) adds nothing yet."""

import typer


def register(app: typer.Typer) -> None:
    return None
