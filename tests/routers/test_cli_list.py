"""`harness policies` lists the routers too (issue 16), with their parameters under --params."""

from __future__ import annotations

from typer.testing import CliRunner

from harness.cli.main import app
from harness.routers import available_routers

runner = CliRunner()


def test_policies_lists_every_router():
    res = runner.invoke(app, ["policies"])
    assert res.exit_code == 0, res.output
    after = res.output.split("routers:", 1)[1].split()
    assert after == available_routers()


def test_policies_params_lists_router_params():
    res = runner.invoke(app, ["policies", "--params"])
    assert res.exit_code == 0, res.output
    assert "--router-param seed=0" in res.output
    assert "--router-param prefix_weight=3.0" in res.output
