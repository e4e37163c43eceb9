"""Start a real SGLang 0.5.23 server on 127.0.0.1 on a CPU, with or without a harness policy.

Runs in the harness's own environment and spawns ``.venv-sglang/bin/python -m
sglang.launch_server --device cpu`` (``adapters/sglang/setup_cpu_venv.sh`` builds the venv).
Why each piece (/work/shared/notes/sglang-cpu.md):

- ``SGLANG_USE_CPU_ENGINE=1`` and ``adapters/sglang/kernel_path`` first on ``PYTHONPATH``: the
  pure-torch ``sgl_kernel`` stand-in (the CPU kernel build is not on PyPI);
- ``adapters/sglang/plugin_path`` on ``PYTHONPATH`` (not for ``--stock``): SGLang's plugin
  loader finds the adapter there and hooks its scheduler (``adapters.sglang.plugin``);
- ``--max-total-tokens``: otherwise SGLang sizes the KV pool at ~0.72 x free RAM;
- ``--sleep-on-idle``: otherwise the idle scheduler busy-polls a whole core;
- ``--disable-overlap-schedule --schedule-policy fcfs --disable-radix-cache``: what the
  adapter requires (fresh counts each step, no re-sorting of the policy's admit order, no
  prefix hits the policy cannot see). ``--stock`` keeps the same flags, so a comparison
  differs only in who decides admission.

CLI::

    python -m adapters.sglang.launch --policy wait                  # foreground, Ctrl-C stops
    python -m adapters.sglang.launch --stock --detach --pidfile /tmp/s.pid   # prints the URL
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

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = Path(os.environ.get("SGLANG_VENV") or ROOT / ".venv-sglang")
DEFAULT_MODEL = Path(os.environ.get("TINY_MODEL_DIR") or ROOT / ".cache" / "tiny-llama")
KERNEL_PATH = ROOT / "adapters" / "sglang" / "kernel_path"
PLUGIN_PATH = ROOT / "adapters" / "sglang" / "plugin_path"
SERVED_NAME = "tiny-llama"
READY_MARK = ".harness-serve-ok"  # written by setup_cpu_venv.sh once the server imports


def sglang_python(venv: Path = DEFAULT_VENV) -> Path:
    """The interpreter of the SGLang CPU venv (raises LaunchError when setup has not run)."""
    py = Path(venv) / "bin" / "python"
    if not py.exists() or not (Path(venv) / READY_MARK).exists():
        raise LaunchError(f"no SGLang venv at {venv}: run adapters/sglang/setup_cpu_venv.sh")
    return py


def omp_cores(n: int | None = None) -> str:
    """The cores for the scheduler's OpenMP threads: all but one (``0-{n-2}``), as vLLM's CPU
    backend reserves one for its front end. SGLang's default binds every core of the NUMA
    node, so its tokenizer, detokenizer and HTTP processes preempt OpenMP threads that
    spin-wait on each other (on the loaded 2-core box, 80 requests at 5 req/s ran at 11
    output tok/s with both cores bound)."""
    n = n or os.cpu_count() or 1
    return "0" if n <= 2 else f"0-{n - 2}"


@dataclass
class SglangServerConfig:
    """How to start one server. Defaults suit the tiny model on a 2-core box."""

    policy: str | None = "vllm"  # None = SGLang's own scheduler (no adapter)
    policy_params: dict[str, Any] = field(default_factory=dict)
    model: Path = DEFAULT_MODEL
    venv: Path = DEFAULT_VENV
    max_total_tokens: int = 8192
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    sleep_on_idle: bool = True
    decode_log_interval: int = 40  # SGLang's default: a "Decode batch" log line every N steps
    log_path: Path | None = None
    port: int | None = None
    extra_args: Sequence[str] = ()
    ready_timeout_s: float = 300.0
    # a session (CFS autogroup) of its own: see adapters/server_process.py
    own_session: bool = False

    def command(self, port: int) -> list[str]:
        """The SGLang command line (exactly what is run)."""
        cmd = [
            str(sglang_python(self.venv)),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(self.model),
            "--served-model-name",
            SERVED_NAME,
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--enable-metrics",
            "--disable-overlap-schedule",
            "--schedule-policy",
            "fcfs",
            "--disable-radix-cache",
            "--decode-log-interval",
            str(self.decode_log_interval),
            "--skip-server-warmup",
        ]
        if self.sleep_on_idle:
            cmd.append("--sleep-on-idle")
        if self.max_running_requests is not None:
            cmd += ["--max-running-requests", str(self.max_running_requests)]
        if self.chunked_prefill_size is not None:
            cmd += ["--chunked-prefill-size", str(self.chunked_prefill_size)]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for k in ("HARNESS_POLICY", "HARNESS_POLICY_PARAMS", "SGLANG_PLUGINS", "PYTHONPATH"):
            env.pop(k, None)
        paths = [str(KERNEL_PATH), str(ROOT)]
        if self.policy is not None:
            paths.append(str(PLUGIN_PATH))
            env["HARNESS_POLICY"] = self.policy
            env["HARNESS_POLICY_PARAMS"] = json.dumps(self.policy_params)
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(paths),
                "SGLANG_USE_CPU_ENGINE": "1",
                # /health answers from the process state instead of generating one token:
                # a probe must not be a request the policy schedules (a WAIT gate would hold
                # it, and SGLang marks the server unhealthy after 20 s without an answer).
                "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false",
                "HF_HUB_OFFLINE": "1",
                "DO_NOT_TRACK": "1",
            }
        )
        env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", omp_cores())
        return env


class SglangServer(EngineServer):
    """A running SGLang server (launcher, tokenizer manager, scheduler, detokenizer)."""

    engine = "SGLang"


@contextlib.contextmanager
def running_sglang(cfg: SglangServerConfig) -> Iterator[SglangServer]:
    """Start SGLang, wait for health, yield the server, always stop it."""
    with running(SglangServer(cfg)) as server:
        yield server  # type: ignore[misc]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--policy", default="vllm", help="harness policy to host (default vllm)")
    g.add_argument("--stock", action="store_true", help="SGLang's own scheduler, no adapter")
    ap.add_argument("--policy-params", default="{}", help="JSON object of policy parameters")
    ap.add_argument("--max-total-tokens", type=int, default=8192, help="KV pool size in tokens")
    ap.add_argument("--max-running-requests", type=int, default=None)
    ap.add_argument("--chunked-prefill-size", type=int, default=None)
    ap.add_argument(
        "--no-sleep-on-idle",
        dest="sleep_on_idle",
        action="store_false",
        help="let the idle scheduler busy-poll (SGLang's default; costs a core)",
    )
    ap.add_argument("--device", default="cpu", choices=["cpu"], help="only cpu is launched here")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    add_process_args(ap)
    args = ap.parse_args(argv)
    try:
        params = parse_policy_params(args.policy_params)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = SglangServerConfig(
        policy=None if args.stock else args.policy,
        policy_params=params,
        model=args.model,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        chunked_prefill_size=args.chunked_prefill_size,
        sleep_on_idle=args.sleep_on_idle,
        port=args.port,
        log_path=args.log,
        ready_timeout_s=args.ready_timeout,
    )
    return serve(lambda: SglangServer(cfg), args)


if __name__ == "__main__":
    sys.exit(main())
