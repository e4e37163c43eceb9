"""Independent runs as Ray tasks, results gathered into the driver's output folder.

Simulations and simulated sweep points are embarrassingly parallel: each is a pure function
of its config (seeded), so a task computes exactly what the driver would have, bit for bit.
A task runs in the driver's working directory when that exists on its host (relative output
paths mean the same), writes its run directories there, and, when it ran on another host
(another Ray node), sends them back packed so the driver writes them into the usual output
folder. Results come back in submission order.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from harness.distributed import connect


def _pack(paths: list[Path], root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in paths:
            tar.add(p, arcname=str(Path(p).resolve().relative_to(root)))
    return buf.getvalue()


def _unpack(blob: bytes, root: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(root, filter="data")


def _run_task(fn: Callable[[Any], Any], item: Any, cwd: str, driver_node: str) -> Any:
    """Body of one Ray task: ``fn(item)`` in the driver's cwd; pack the run dirs it returns
    when this node is not the driver's."""
    import ray

    if os.path.isdir(cwd):
        os.chdir(cwd)
    result = fn(item)
    node = ray.get_runtime_context().get_node_id()
    if node == driver_node:
        return result, None
    return result, _pack(_paths_in(result), Path(cwd))


def _paths_in(result: Any) -> list[Path]:
    """Run directories named in a task's result (a Path, or lists/tuples holding Paths)."""
    if isinstance(result, Path):
        return [result]
    if isinstance(result, list | tuple):
        return [p for r in result for p in _paths_in(r)]
    return []


def ray_map(
    fn: Callable[[Any], Any], items: Iterable[Any], *, address: str = "auto", num_cpus: float = 1
) -> Iterator[Any]:
    """``map(fn, items)`` with every call a Ray task (all submitted at once, ``num_cpus``
    each); yields results in order as they are ready. ``fn`` must be importable by the
    workers (a module-level function or a ``functools.partial`` of one)."""
    ray = connect(address)
    task = ray.remote(num_cpus=num_cpus, max_retries=0)(_run_task)
    cwd = os.getcwd()
    node = ray.get_runtime_context().get_node_id()
    refs = [task.remote(fn, item, cwd, node) for item in items]
    done = 0
    try:
        for ref in refs:
            result, blob = ray.get(ref)
            done += 1
            if blob is not None:
                _unpack(blob, Path(cwd))
            yield result
    finally:
        # stopped early (error, Ctrl-C): drop what has not been gathered. Only those: a
        # cancel racing a finished task's reply aborted the driver (Ray 2.x task_manager
        # "Tried to complete task that was not pending", seen with sweeps from three threads).
        for ref in refs[done:]:
            ray.cancel(ref)


def mapper(address: str | None) -> Callable[..., Iterable[Any]]:
    """``map`` without Ray (``address`` None), else :func:`ray_map` on ``address``."""
    if address is None:
        return map

    def _m(fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterable[Any]:
        return ray_map(fn, items, address=address)

    return _m


def simulate_each_policy(cfg: Any, address: str) -> list[Path]:
    """``harness simulate --ray``: one Ray task per policy (each replays the same seeded
    trace, so every run is the one ``run_simulation(cfg)`` writes); run dirs in policy
    order. Each run's config echo lists only its own policy."""
    from harness.engine.simulate import run_simulation

    one = [cfg.model_copy(update={"policies": [p]}) for p in cfg.policies]
    return [d for dirs in ray_map(run_simulation, one, address=address) for d in dirs]
