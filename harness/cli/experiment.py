"""`harness experiment NAME`: rerun a paper's main experiment in the simulator (issue 5)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("experiment")
    def experiment(
        name: str = typer.Argument(..., help="an experiment (see 'list'), or 'list'"),
        full: bool = typer.Option(False, "--full", help="paper-sized run (slow) instead of small"),
        out: Path | None = typer.Option(
            None, "-o", "--out", help="output folder (default reports/experiments/NAME[-full])"
        ),
        seed: int | None = typer.Option(None, "--seed", help="override the experiment's seed"),
        network: str | None = typer.Option(
            None,
            "--network",
            help="agents only: tandem, fork-join, rs, rs-reversed or all (default all)",
        ),
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
        if network is not None and name != "agents":
            fail(f"--network applies to the agents experiment only, not {name!r}")
        options = {"network": network} if network is not None else None
        sub = f"{name}-{network}" if network not in (None, "all") else name
        out_dir = out or Path("reports") / "experiments" / (f"{sub}-full" if full else sub)
        try:
            result = run_experiment(name, out_dir, full=full, seed=seed, options=options)
        except HarnessError as e:
            fail(str(e))
        except OSError as e:
            fail(f"cannot write under {out_dir}: {e.strerror or e}")
        typer.echo(result.markdown())
        typer.echo(f"comparison: {out_dir / 'comparison.md'} and {out_dir / 'comparison.json'}")
