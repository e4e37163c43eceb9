"""`harness experiment NAME`: rerun a paper's main experiment in the simulator (issue 5)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("experiment")
    def experiment(
        name: str = typer.Argument(..., help="slai, wait, mcsf, stability, or 'list'"),
        full: bool = typer.Option(False, "--full", help="paper-sized run (slow) instead of small"),
        out: Path | None = typer.Option(
            None, "-o", "--out", help="output folder (default reports/experiments/NAME[-full])"
        ),
        seed: int | None = typer.Option(None, "--seed", help="override the experiment's seed"),
    ) -> None:
        """Reproduce a paper's experiment: one run dir per configuration + comparison table."""
        from harness.cli.errors import HarnessError, fail
        from harness.experiments import EXPERIMENTS, run_experiment

        if name == "list":
            for key, (_mod, desc) in EXPERIMENTS.items():
                typer.echo(f"{key:10s} {desc}")
            return
        if name not in EXPERIMENTS:
            fail(f"unknown experiment {name!r}; choose from: list, {', '.join(EXPERIMENTS)}")
        out_dir = out or Path("reports") / "experiments" / (f"{name}-full" if full else name)
        try:
            result = run_experiment(name, out_dir, full=full, seed=seed)
        except HarnessError as e:
            fail(str(e))
        except OSError as e:
            fail(f"cannot write under {out_dir}: {e.strerror or e}")
        typer.echo(result.markdown())
        typer.echo(f"comparison: {out_dir / 'comparison.md'} and {out_dir / 'comparison.json'}")
