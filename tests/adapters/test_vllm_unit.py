"""Fast tests of the vLLM adapter's vLLM-free parts: policy choice, request view, step log,
and the launcher's command line. (The parts that import vLLM run in test_vllm_conformance.py
and test_vllm_cpu.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from adapters.vllm import SCHEDULER_CLS
from adapters.vllm.config import AdapterConfigError, build_policy, resolve_policy
from adapters.vllm.launch import VllmServerConfig
from adapters.vllm.steplog import StepLog, read_step_log, step_log_samples
from adapters.vllm.view import VllmRequestView
from harness.policies.base import RequestView, remaining_tokens


def test_policy_from_env_with_params() -> None:
    c = resolve_policy(None, {"HARNESS_POLICY": "sarathi", "HARNESS_POLICY_PARAMS": '{"x": 1}'})
    assert (c.name, c.params, c.source) == ("sarathi", {"x": 1}, "env")


def test_additional_config_wins_over_env() -> None:
    extra = {"harness_policy": "wait", "harness_policy_params": {"thresholds": [2]}}
    c = resolve_policy(extra, {"HARNESS_POLICY": "sarathi"})
    assert (c.name, c.params, c.source) == ("wait", {"thresholds": [2]}, "additional_config")


def test_default_policy_is_vllm() -> None:
    c = resolve_policy({}, {})
    assert (c.name, c.source) == ("vllm", "default")
    assert build_policy(c).name == "vllm"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"HARNESS_POLICY": "x", "HARNESS_POLICY_PARAMS": "{bad"}, "not valid JSON"),
        ({"HARNESS_POLICY": "x", "HARNESS_POLICY_PARAMS": "[1]"}, "expected a JSON object"),
    ],
)
def test_bad_params_one_clear_error(env: dict[str, str], needle: str) -> None:
    with pytest.raises(AdapterConfigError, match=needle):
        resolve_policy(None, env)


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(AdapterConfigError, match="unknown policy 'nope'.*slai"):
        build_policy(resolve_policy(None, {"HARNESS_POLICY": "nope"}))


def _fake_request(**kw: object) -> SimpleNamespace:
    base = dict(
        request_id="r1",
        arrival_time=1000.5,
        priority=1,
        num_prompt_tokens=10,
        num_output_tokens=0,
        num_computed_tokens=0,
        max_tokens=4,
        num_preemptions=0,
        sampling_params=SimpleNamespace(extra_args={"tier": "paid", "tbt_slo_ms": 50}),
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_view_reads_live_vllm_accounting() -> None:
    req = _fake_request()
    v = VllmRequestView(req, origin=1000.0)
    assert isinstance(v, RequestView)
    assert (v.arrival_s, v.tier, v.priority, v.tbt_slo_s) == (0.5, "paid", 1, 0.05)
    assert v.ttft_slo_s == 2.0  # not in the request: default paid tier (tiers.py)
    assert remaining_tokens(v) == 10
    req.num_computed_tokens, req.num_output_tokens = 10, 1  # after the prefill step
    assert (v.num_tokens, remaining_tokens(v)) == (11, 1)
    req.num_computed_tokens, req.num_preemptions = 0, 1  # recompute preemption
    assert (remaining_tokens(v), v.num_preemptions) == (11, 1)


def test_view_without_xargs() -> None:
    v = VllmRequestView(_fake_request(sampling_params=None, priority=None), origin=0.0)
    assert (v.tier, v.priority, v.ttft_slo_s, v.tbt_slo_s) == ("default", 0, None, None)


def test_step_log_round_trip_and_fit_rows(tmp_path: Path) -> None:
    p = tmp_path / "s" / "steps.jsonl"
    log = StepLog(p)
    row = {"duration_s": 0.01, "prefill_tokens": 5, "decode_tokens": 2, "kv_tokens": 40}
    log.write(row)
    log.write(row | {"duration_s": 0.02})
    log.close()
    with p.open("a") as fh:
        fh.write('{"truncated": ')  # a killed server's last partial line
    rows = read_step_log(p)
    assert [r["duration_s"] for r in rows] == [0.01, 0.02]
    s = step_log_samples(rows)[0]
    assert s["step_duration_s"] == 0.01 and s["kv_used_tokens"] == 40 and s["source"] == "engine"
    assert not StepLog(None).enabled


def test_fit_rows_charge_the_gap_between_back_to_back_steps() -> None:
    """The simulator has no time between steps, so a step followed at once by the next one
    costs its period; one followed by idle time costs only its own duration."""
    step = {"prefill_tokens": 0, "decode_tokens": 1, "kv_tokens": 10}
    rows = [
        step | {"t_s": 1.000, "duration_s": 0.0020},
        step | {"t_s": 1.0023, "duration_s": 0.0020},  # 0.3 ms host gap, then this step
        {"kind": "request", "request_id": "a"},  # request lines are not steps
        step | {"t_s": 2.0, "duration_s": 0.0030},  # after a second of idle
        step | {"t_s": 2.003, "duration_s": 0.0040},  # clock skew: period < duration
    ]
    costs = [r["step_duration_s"] for r in step_log_samples(rows)]
    assert costs == pytest.approx([0.0023, 0.0020, 0.0030, 0.0040])


def _fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".harness-ok").write_text("")
    return venv


def test_launch_command_adapter_vs_stock(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path)
    cfg = VllmServerConfig(policy="wait", policy_params={"a": 1}, venv=venv, kv_blocks=64)
    cmd = cfg.command(8123)
    assert cmd[cmd.index("--scheduler-cls") + 1] == SCHEDULER_CLS
    assert "--no-async-scheduling" in cmd and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--max-model-len") + 1] == str(63 * 32)  # one request fits the KV
    env = cfg.environment()
    assert env["HARNESS_POLICY"] == "wait" and json.loads(env["HARNESS_POLICY_PARAMS"]) == {"a": 1}
    stock = VllmServerConfig(policy=None, venv=venv).command(8123)
    assert "--scheduler-cls" not in stock and "--no-async-scheduling" not in stock
    assert "HARNESS_POLICY" not in VllmServerConfig(policy=None, venv=venv).environment()
    assert "--enforce-eager" not in cmd  # vLLM's default: compiled
    assert "--enforce-eager" in VllmServerConfig(venv=venv, enforce_eager=True).command(8123)


def test_launch_without_setup_says_what_to_run(tmp_path: Path) -> None:
    from adapters.vllm.launch import LaunchError

    with pytest.raises(LaunchError, match="scripts/vllm-cpu/setup.sh"):
        VllmServerConfig(venv=tmp_path / "none").command(1)


def test_request_lines_are_kept_apart_from_steps(tmp_path: Path) -> None:
    from adapters.vllm.steplog import request_row, requests_only, steps_only

    view = VllmRequestView(_fake_request(num_output_tokens=4, num_computed_tokens=13), 1000.0)
    view.first_token_s, view.last_token_s = 0.7, 0.9
    view.engine_arrival_s = 0.503  # the engine core got it 3 ms after the API server's stamp
    log = StepLog(tmp_path / "log.jsonl")
    log.write(
        {
            "kind": "step",
            "duration_s": 0.01,
            "prefill_tokens": 1,
            "decode_tokens": 0,
            "kv_tokens": 1,
        }
    )
    log.write(request_row(view, 0.95))
    log.close()
    rows = read_step_log(tmp_path / "log.jsonl")
    assert len(steps_only(rows)) == 1 and len(step_log_samples(rows)) == 1
    (req,) = requests_only(rows)
    assert (req["arrival_s"], req["first_token_s"], req["output_tokens"]) == (0.5, 0.7, 4)
    assert req["engine_arrival_s"] == 0.503
    assert req["tier"] == "paid"


def test_vllm_venv_subprocess_keeps_documented_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """TINY_MODEL_DIR / VLLM_VENV (scripts/vllm-cpu/setup.sh) reach the vLLM-venv process."""
    from vllm_testlib import ROOT, vllm_venv_env

    monkeypatch.setenv("TINY_MODEL_DIR", "/elsewhere/tiny")
    monkeypatch.setenv("VLLM_VENV", "/elsewhere/venv")
    monkeypatch.setenv("SOME_SECRET", "x")
    env = vllm_venv_env()
    assert env["TINY_MODEL_DIR"] == "/elsewhere/tiny" and env["VLLM_VENV"] == "/elsewhere/venv"
    assert env["PYTHONPATH"] == str(ROOT) and "SOME_SECRET" not in env
