"""A pure-torch stand-in for SGLang's CPU ``sgl_kernel``, enough to serve on a CPU without AMX.

Why it exists: sglang 0.5.23's CPU path (``SGLANG_USE_CPU_ENGINE=1``) imports ops from
``sgl_kernel`` at module level (``srt/mem_cache/allocation.py``,
``kernels/ops/kvcache/cache_move.py``, ...). PyPI's ``sglang-kernel`` wheel is CUDA-only and
the CPU build is not published, so without *some* ``sgl_kernel`` the server does not start.
On a CPU without AMX, SGLang takes its pure-torch paths anyway (``cpu_has_amx_support()`` in
``srt/utils/common.py`` is False, layers use ``forward_native``, attention falls back to the
``torch_native`` backend), and the only op it then calls at run time is the KV-pool
bookkeeping :func:`assign_req_to_token_pool_cpu` (``assign_req_to_token_pool_func`` in
``srt/mem_cache/allocation.py``). It is implemented here in torch with the CPU kernel's
semantics; every other name imports (SGLang imports many it never calls on this path) but
raises :class:`StandInKernelError` naming the op the moment it is called, so a code path
that needs a real kernel fails loudly instead of computing something wrong.

Put the folder holding this package (``adapters/sglang/kernel_path``) first on ``PYTHONPATH``
of the SGLang server (``adapters.sglang.launch`` does). Nothing here imports the harness.
"""

from __future__ import annotations

from typing import Any

import torch

__version__ = "0.0.0+harness-cpu-stand-in"
PROVIDED = ("assign_req_to_token_pool_cpu",)


class StandInKernelError(NotImplementedError):
    """SGLang called a kernel op that the stand-in does not provide."""


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of ``req_to_token``.

    For request i, with ``n_i = end_i - start_i`` and the slots packed back to back in
    ``out_cache_loc`` (``off_i`` = sum of the earlier ``n``):
    ``req_to_token[req_pool_indices[i], start_i:end_i] = out_cache_loc[off_i:off_i + n_i]``
    (the semantics of SGLang's Triton ``assign_req_to_token_pool`` kernel, same file).
    """
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    off = 0
    for row, s, e in zip(rows, starts, ends, strict=True):
        n = int(e) - int(s)
        if n <= 0:
            continue
        if int(e) > pool_len:
            raise ValueError(f"assign_req_to_token_pool_cpu: end {e} beyond row length {pool_len}")
        req_to_token[int(row), int(s) : int(e)] = out_cache_loc[off : off + n].to(
            req_to_token.dtype
        )
        off += n


def _missing(name: str) -> Any:
    def op(*_a: Any, **_kw: Any) -> Any:
        raise StandInKernelError(
            f"sgl_kernel.{name} was called, but the harness's CPU stand-in "
            f"(adapters/sglang/kernel_path) provides only {', '.join(PROVIDED)}; "
            "this SGLang code path needs the real CPU kernel build (sglang-kernel-cpu)"
        )

    op.__name__ = op.__qualname__ = name
    return op


def __getattr__(name: str) -> Any:
    """Every other op: importable (``from sgl_kernel import x``), raises when called."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)
