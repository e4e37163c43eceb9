"""docker-compose.yml for a GPU box: valid against the Compose spec, and wired as documented.

Two validators: the Compose specification JSON schema (vendored in ``docker/`` from Debian's
``docker-compose`` 1.29 package, ``compose/config/compose_spec.json``) through ``jsonschema``,
and, where installed, ``docker-compose config -q`` itself. The entry scripts are run with a
stub ``python3``/``harness`` on PATH to check the command lines they build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "docker" / "compose-spec.schema.json"
ENV_EXAMPLE = ROOT / ".env.example"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_matches_the_compose_spec_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft201909Validator(schema).validate(_compose())  # raises with the bad path


def test_schema_rejects_a_broken_compose() -> None:
    """The validator is not vacuous: an unknown key and a bad depends_on condition fail."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    bad = _compose()
    bad["services"]["harness"]["depends_on"]["vllm"]["condition"] = "when_ready"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft201909Validator(schema).validate(bad)
    bad = _compose()
    bad["services"]["vllm"]["gpus_please"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft201909Validator(schema).validate(bad)


def test_compose_wiring() -> None:
    svc = _compose()["services"]
    assert set(svc) - {"sglang"} == {"vllm", "harness"}  # sglang: profile-gated
    vllm, harness = svc["vllm"], svc["harness"]
    dev = vllm["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    assert "/health" in " ".join(vllm["healthcheck"]["test"])
    assert any(v.startswith("./adapters:") for v in vllm["volumes"])
    assert any(v.startswith("./harness:") for v in vllm["volumes"])
    assert harness["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert any(v.startswith("./reports:") for v in harness["volumes"])
    for key in ("SCHEDULER_POLICY", "MODEL", "VLLM_PORT"):
        assert key in ENV_EXAMPLE.read_text()
    assert "${SCHEDULER_POLICY" in vllm["environment"]["SCHEDULER_POLICY"]
    assert "${MODEL" in vllm["environment"]["MODEL"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_config(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text(
        ENV_EXAMPLE.read_text().replace("SCHEDULER_POLICY=slai", "SCHEDULER_POLICY=wait")
    )
    base = ["docker-compose", "--project-directory", str(ROOT), "-f", str(COMPOSE)]
    base += ["--env-file", str(env_file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "VLLM_"))}
    quiet = subprocess.run([*base, "config", "-q"], capture_output=True, text=True, env=env)
    assert quiet.returncode == 0, quiet.stderr
    full = subprocess.run([*base, "config"], capture_output=True, text=True, env=env, check=True)
    resolved = yaml.safe_load(full.stdout)["services"]
    assert resolved["vllm"]["environment"]["SCHEDULER_POLICY"] == "wait"
    assert resolved["harness"]["environment"]["TARGET"] == "http://vllm:8000"


def _stub_bin(tmp: Path, name: str) -> Path:
    """A fake executable that records its argv (one per line) and environment."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / name
    stub.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" >> "{tmp}/{name}.args"\n'
        f'env | grep ^HARNESS_ >> "{tmp}/{name}.env" || true\n'
    )
    stub.chmod(0o755)
    return bin_dir


def _run_entry(script: str, tmp: Path, env: dict[str, str], stub: str) -> list[str]:
    bin_dir = _stub_bin(tmp, stub)
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **env}
    subprocess.run(["bash", str(ROOT / "docker" / script)], env=full_env, check=True, timeout=30)
    return (tmp / f"{stub}.args").read_text().splitlines()


def test_vllm_entry_hosts_the_policy(tmp_path: Path) -> None:
    env = {"MODEL": "m", "SCHEDULER_POLICY": "wait", "SCHEDULER_POLICY_PARAMS": '{"a": 1}'}
    argv = _run_entry("vllm-entry.sh", tmp_path, env, "python3")
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    i = argv.index("--scheduler-cls")
    assert argv[i + 1] == "adapters.vllm.scheduler.HarnessScheduler"
    assert "--no-async-scheduling" in argv
    got = (tmp_path / "python3.env").read_text()
    assert "HARNESS_POLICY=wait" in got and 'HARNESS_POLICY_PARAMS={"a": 1}' in got


def test_vllm_entry_stock_has_no_adapter(tmp_path: Path) -> None:
    env = {"MODEL": "m", "SCHEDULER_POLICY": "stock", "NUM_GPU_BLOCKS": "900"}
    argv = _run_entry("vllm-entry.sh", tmp_path, env, "python3")
    assert "--scheduler-cls" not in argv and "--no-async-scheduling" not in argv
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "900"


def test_harness_entry_replays_then_reports(tmp_path: Path) -> None:
    env = {"TRACE": "sharegpt", "TARGET": "http://vllm:8000", "RATE": "4", "RUN_NAME": "x"}
    argv = _run_entry("harness-entry.sh", tmp_path, env, "harness")
    assert argv[0] == "replay" and argv[argv.index("--target") + 1] == "http://vllm:8000"
    assert argv[argv.index("--out") + 1] == "/work/reports/x"
    assert "report" in argv and argv[-1] == "/work/reports/x/report.html"
