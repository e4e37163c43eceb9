"""The ``sglang`` docker-compose service and the PYTHONPATH-only plugin entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SGL_PY = Path(os.environ.get("SGLANG_VENV", ROOT / ".venv-sglang")) / "bin" / "python"


def _service() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["sglang"]


def _mounted_pythonpath(svc: dict) -> str:
    """The container's PYTHONPATH with /opt/harness mapped back onto this checkout."""
    return svc["environment"]["PYTHONPATH"].replace("/opt/harness", str(ROOT))


def test_sglang_service_wiring() -> None:
    svc = _service()
    assert svc["image"].startswith("lmsysorg/sglang:") and "v0.5.23" in svc["image"]
    assert svc["profiles"] == ["sglang"]  # never started by a plain `up`
    assert svc["entrypoint"] == ["python3", "-m", "sglang.launch_server"]
    cmd = svc["command"]
    for flag in ("--disable-overlap-schedule", "--enable-metrics", "--disable-radix-cache"):
        assert flag in cmd
    assert cmd[cmd.index("--schedule-policy") + 1] == "fcfs"
    assert "./adapters:/opt/harness/adapters:ro" in svc["volumes"]
    assert "./harness:/opt/harness/harness:ro" in svc["volumes"]
    env = svc["environment"]
    assert "${SCHEDULER_POLICY" in env["HARNESS_POLICY"]
    assert "/health" in " ".join(svc["healthcheck"]["test"])
    dev = svc["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]


def test_entry_point_is_found_through_pythonpath_alone() -> None:
    """What SGLang's load_plugins() does (importlib.metadata entry points), in a fresh
    interpreter whose only extra path is the container's PYTHONPATH."""
    code = (
        "import json; from importlib.metadata import entry_points;"
        "eps = entry_points(group='sglang.srt.plugins');"
        "f = [e for e in eps if e.name == 'harness'][0].load();"
        "print(json.dumps([e.value for e in eps] + [f.__module__ + ':' + f.__name__]))"
    )
    env = dict(os.environ, PYTHONPATH=_mounted_pythonpath(_service()))
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr[-1500:]
    got = json.loads(p.stdout)
    assert got == ["adapters.sglang.plugin:register", "adapters.sglang.plugin:register"]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(not SGL_PY.exists(), reason=f"no sglang venv at {SGL_PY} (setup_cpu_venv.sh)")
def test_compose_command_parses_with_sglang_0_5_23_server_args() -> None:
    """sglang's own argparse (ServerArgs.add_cli_args) accepts the compose command line."""
    cmd = [str(c).replace("${MAX_NUM_SEQS:-256}", "256") for c in _service()["command"]]
    cmd = [c.replace("${MAX_NUM_BATCHED_TOKENS:-2048}", "2048") for c in cmd]
    cmd = [c.replace("${MODEL:-meta-llama/Llama-2-7b-hf}", "m") for c in cmd]
    code = (
        "import argparse, json, sys; from sglang.srt.server_args import ServerArgs;"
        "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p);"
        "a = p.parse_args(json.loads(sys.argv[1]));"
        "print(json.dumps([a.disable_overlap_schedule, a.schedule_policy,"
        " a.disable_radix_cache, a.enable_metrics, a.max_running_requests,"
        " a.chunked_prefill_size]))"
    )
    p = subprocess.run(
        [str(SGL_PY), "-c", code, json.dumps(cmd)], capture_output=True, text=True, timeout=110
    )
    assert p.returncode == 0, p.stderr[-1500:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [True, "fcfs", True, True, 256, 2048]
