"""Fast tests of the SGLang CPU launcher's command line and environment, and of the pure-torch
``sgl_kernel`` stand-in (in the SGLang venv, when it exists)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from adapters.server_process import LaunchError
from adapters.sglang.launch import (
    KERNEL_PATH,
    PLUGIN_PATH,
    ROOT,
    SglangServerConfig,
    main,
    omp_cores,
    sglang_python,
)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / ".harness-serve-ok").write_text("")
    return tmp_path


def test_command_has_the_cpu_flags_the_adapter_needs(venv: Path) -> None:
    cfg = SglangServerConfig(policy="wait", venv=venv, max_total_tokens=4096)
    cmd = cfg.command(1234)
    assert cmd[:3] == [str(venv / "bin" / "python"), "-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for flag in (
        "--device cpu",
        "--host 127.0.0.1",
        "--port 1234",
        "--max-total-tokens 4096",
        "--disable-overlap-schedule",
        "--schedule-policy fcfs",
        "--disable-radix-cache",
        "--enable-metrics",
        "--sleep-on-idle",
    ):
        assert flag in joined, flag
    no_sleep = SglangServerConfig(venv=venv, sleep_on_idle=False).command(1)
    assert "--sleep-on-idle" not in no_sleep


def test_environment_puts_the_kernel_stand_in_first_and_the_plugin_only_with_a_policy(
    venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESS_POLICY", "stale")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = SglangServerConfig(policy="slai", policy_params={"token_budget": 64}, venv=venv)
    e = env.environment()
    assert e["PYTHONPATH"].split(os.pathsep) == [str(KERNEL_PATH), str(ROOT), str(PLUGIN_PATH)]
    assert e["HARNESS_POLICY"] == "slai" and json.loads(e["HARNESS_POLICY_PARAMS"]) == {
        "token_budget": 64
    }
    assert e["SGLANG_USE_CPU_ENGINE"] == "1"
    assert e["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    stock = SglangServerConfig(policy=None, venv=venv).environment()
    assert "HARNESS_POLICY" not in stock and str(PLUGIN_PATH) not in stock["PYTHONPATH"]
    assert e["SGLANG_CPU_OMP_THREADS_BIND"] == omp_cores()  # one core left for the front end
    assert (omp_cores(2), omp_cores(16)) == ("0", "0-14")
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "1")
    assert env.environment()["SGLANG_CPU_OMP_THREADS_BIND"] == "1"  # the user's choice wins


def test_missing_venv_and_bad_params_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(LaunchError, match="setup_cpu_venv.sh"):
        sglang_python(tmp_path / "nope")
    assert main(["--policy-params", "[1]"]) == 2
    assert capsys.readouterr().err.startswith("error: --policy-params")


SGL_PY = Path(os.environ.get("SGLANG_VENV") or ROOT / ".venv-sglang") / "bin" / "python"


@pytest.mark.skipif(not SGL_PY.exists(), reason=f"no SGLang venv at {SGL_PY}")
@pytest.mark.timeout(120)
def test_kernel_stand_in_matches_the_reference_and_names_missing_ops() -> None:
    code = """
import json, torch, sgl_kernel
from sgl_kernel import assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu
pool = torch.zeros((4, 10), dtype=torch.int32)
rows, st, en = torch.tensor([2, 0, 3]), torch.tensor([1, 0, 4]), torch.tensor([4, 2, 4])
loc = torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64)
assign_req_to_token_pool_cpu(rows, pool, st, en, loc, 10)
try:
    copy_all_layer_kv_cache_cpu(1, 2)
    err = None
except sgl_kernel.StandInKernelError as e:
    err = str(e)
print("K-JSON " + json.dumps({"pool": pool.tolist(), "err": err}))
"""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(KERNEL_PATH)}
    p = subprocess.run(
        [str(SGL_PY), "-c", code], env=env, capture_output=True, text=True, timeout=100
    )
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("K-JSON ")]
    assert line, p.stderr[-2000:]
    got = json.loads(line[0].removeprefix("K-JSON "))
    pool = got["pool"]
    assert pool[2][:5] == [0, 11, 12, 13, 0]  # row 2, slots 1..3 <- the first 3 locations
    assert pool[0][:3] == [21, 22, 0]  # row 0, slots 0..1 <- the next 2
    assert pool[3] == [0] * 10 and pool[1] == [0] * 10  # an empty range writes nothing
    assert "copy_all_layer_kv_cache_cpu" in got["err"] and "stand-in" in got["err"]
