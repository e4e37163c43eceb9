"""The kernel's C passes over its running arrays do what their Python versions do (issue 13).

``harness.engine._rows`` (optional C extension, built by setup.py where a compiler is present)
runs :class:`~harness.engine.fastsim.ArrayEngine`'s loops over its running arrays: retiring
finished requests (``_finish``), every running request decoding (``_decode``), rule 5 for a
few items (``_give``), counting the decodes that open a KV block (``_opening``), rule 2 and the
step's composition for a run order whose KV fits (``_grant``, then rule 5 for its grants in
``_apply``), the running set's fewest tokens left and prefilling count (``_recount``); and a
policy's block count of the columns (``KernelColumns.block_counts``); and an affine or context
cost model's step time and a fast-forwarded run's step ends (``_rows.step_time``,
``_rows.run_ends``: against the model's ``step_time`` and ``core.decode_run_ends``, bit for
bit); a lone prefill run's chunks (``_rows.prefill_chunks`` against ``_prefill_run``'s own
loop), rule 2's lone victim preempted by the grant pass itself (``_grant``), a
steady run's KV bound (``_rows.steps_fit`` against ``core.decode_steps_that_fit``), a
recompute preemption (``_preempt``), an admission (``_admit_head``), the every-position test
of a run order (``_rows.each_once`` against ``_lists_each_once_py``) and rule 5's rows written
into the chunk log (``ChunkLog.room``). Each
test here puts two
engines in the same random state (finished and unfinished requests, prefilling and decoding
ones, requests without a first token), runs the C method on one and the Python method on the
other, and compares every array and counter; then whole simulations with each set of methods
give the same token times; then the environment variable that selects them, and the C code's
answers to bad input.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
from engine_traces import poisson_trace

from harness.engine import fastsim
from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.engine.fastsim import ArrayEngine, Rows
from harness.engine.simresult import ChunkLog
from harness.engine.simulate import simulate
from harness.policies import make_policy
from harness.policies.columns import RunningColumns

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not fastsim.HAVE_C,
        reason="the C extension harness.engine._rows is not built (no C compiler at install)",
    ),
]

BS = 16
METHODS = (
    "_finish",
    "_decode",
    "_give",
    "_opening",
    "_grant",
    "_recount",
    "_sample",
    "_preempt",
    "_admit_head",
    "_few_items",
)


def _engine(rng: np.random.Generator, n_rows: int = 400, cap: int = 64) -> ArrayEngine:
    """An engine whose first R running slots hold random requests (some finished)."""
    P = rng.integers(1, 300, n_rows).tolist()
    M = rng.integers(1, 200, n_rows).tolist()
    rows = Rows(P, M)
    cfg = EngineConfig(kv_tokens=1 << 20, token_budget=2048, max_num_seqs=cap, block_size=BS)
    eng = ArrayEngine(
        2048, cfg, get_cost_model("a100-llama2-7b"), rows, ChunkLog(None, 1 << 30), cap
    )
    R = int(rng.integers(0, cap + 1))
    picked = rng.choice(n_rows, size=R, replace=False)
    for p, j in enumerate(picked.tolist()):
        m = M[j]
        o = int(rng.integers(0, m + 1))  # o == m: finished
        if rng.random() < 0.1:
            o = m + int(rng.integers(0, 3))  # past max_tokens: finished too
        prompt = P[j]
        # decoding (KV covers all but the last token), or prefilling / recomputing
        c = prompt + o - 1 if o > 0 and rng.random() < 0.7 else int(rng.integers(0, prompt + o))
        eng.IA[:, p] = (prompt, o, c, m, j)
        eng.FA[:, p] = (
            np.nan if o == 0 else rng.random() * 10,
            np.nan if o == 0 else 10 + rng.random(),
            rng.random(),
            np.nan if rng.random() < 0.5 else 0.1,
        )
        rows.state[j] = fastsim._RUNNING
    eng.R = R
    Pr, Or, Cr, Mr = eng.IA[:4, :R]
    eng.used = int(((Cr + BS - 1) // BS).sum())
    eng.sum_c = int(Cr.sum())
    eng.pm_total = int((Pr + Mr).sum())
    eng.min_left = int((Mr - Or).min()) if R else fastsim._NO_LEFT
    eng.npf = R - int(np.count_nonzero(fastsim.decoding_mask(Pr, Or, Cr)))
    return eng


def _state(eng: ArrayEngine) -> dict:
    rows = eng.rows
    return {
        "IA": eng.IA[:, : eng.R].copy(),
        "FA": eng.FA[:, : eng.R].copy(),
        "rows": [rows.Orow.copy(), rows.first.copy(), rows.last.copy(), rows.state.copy()],
        "scalars": (eng.R, eng.used, eng.sum_c, eng.pm_total, eng.min_left, eng.npf),
        "finished": (eng.finished_total, list(eng._finished_rows)),
        "chunks": (
            eng.chunks._req[: eng.chunks._n].copy(),
            list(eng.chunks._times),
            list(eng.chunks._counts),
        ),
    }


def _assert_same(a: dict, b: dict) -> None:
    np.testing.assert_array_equal(a["IA"], b["IA"])
    np.testing.assert_array_equal(a["FA"], b["FA"])  # NaN == NaN here
    for x, y in zip(a["rows"], b["rows"], strict=True):
        np.testing.assert_array_equal(x, y)
    assert a["scalars"] == b["scalars"]
    assert a["finished"] == b["finished"]
    np.testing.assert_array_equal(a["chunks"][0], b["chunks"][0])
    assert a["chunks"][1:] == b["chunks"][1:]


def _some_at_block_boundaries(eng: ArrayEngine) -> None:
    """Every third running request's computed tokens a multiple of the block."""
    eng.IA[2, : eng.R : 3] = BS * np.arange(len(eng.IA[2, : eng.R : 3]))


def _pair(seed: int) -> tuple[ArrayEngine, ArrayEngine]:
    """Two engines in the same state (built twice: a deep copy would detach the engine's
    row views from its arrays)."""
    pair = []
    for _ in range(2):
        eng = _engine(np.random.default_rng(seed))
        eng.hooks = object()  # type: ignore[assignment]  # _forget then keeps finished rows
        pair.append(eng)
    return pair[0], pair[1]


@pytest.mark.parametrize("seed", range(40))
def test_finish_retires_what_the_python_pass_retires(seed: int) -> None:
    c, py = _pair(seed)
    assert c._finish_c() == py._finish_py()
    _assert_same(_state(c), _state(py))


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("k", [1, 7])
def test_decode_advances_as_the_python_pass(seed: int, k: int) -> None:
    c, py = _pair(seed)
    R = c.R
    ends = [12.5 - 0.01 * (k - 1 - s) for s in range(k)]  # the run's step ends (k > 1)
    assert c._decode_c(R, k, 12.5, True, ends) == py._decode_py(R, k, 12.5, True, ends)
    _assert_same(_state(c), _state(py))  # the chunk log's rows and times too
    # without the block count the arrays move the same way (Python then answers 0)
    c._decode_c(R, 1, 13.0, False)
    py._decode_py(R, 1, 13.0, False)
    _assert_same(_state(c), _state(py))


@pytest.mark.parametrize("seed", range(40))
def test_opening_counts_as_the_python_pass(seed: int) -> None:
    c, _ = _pair(seed)
    _some_at_block_boundaries(c)
    for R in sorted({0, c.R // 2, c.R}):
        assert c._opening_c(R) == c._opening_py(R)
    assert c._opening_c(c.R) > 0 or c.R == 0


@pytest.mark.parametrize("seed", range(40))
def test_the_kernels_block_counts_are_the_columns_answer(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastsim, "_COLUMNS", fastsim.KernelColumns)  # (under the pure kernel too)
    c, _ = _pair(seed)
    _some_at_block_boundaries(c)
    view = c._view(0.0, c.R).running
    assert type(view) is fastsim.KernelColumns
    plain = RunningColumns(*view)
    for bs in (1, 3, 16):
        assert view.block_counts(bs) == plain.block_counts(bs)
        comp = plain.computed
        held = int((-(-comp // bs)).sum())
        assert plain.block_counts(bs) == (held, int(np.count_nonzero(comp % bs == 0)))


@pytest.mark.parametrize("seed", range(40))
def test_give_applies_rule_5_as_the_python_pass(seed: int) -> None:
    c, py = _pair(seed)
    rng = np.random.default_rng(1000 + seed)
    R = c.R
    if R == 0:
        return
    # distinct positions, each granted at most its remaining tokens (the host's clip)
    ps = rng.choice(R, size=int(rng.integers(1, min(R, 6) + 1)), replace=False).tolist()
    items = []
    for p in ps:
        prompt, o, comp = (int(x) for x in c.IA[:3, p])
        rem = prompt + o - comp
        if rem > 0:
            items.append((p, int(rng.integers(1, rem + 1)), 0, 0))
    c._give_c(list(items), 20.0)
    py._give_py(list(items), 20.0)
    _assert_same(_state(c), _state(py))
    # (position, tokens) pairs, as the admissions pass them
    c._give_c(list(enumerate([1], start=0)), 21.0)
    py._give_py(list(enumerate([1], start=0)), 21.0)
    _assert_same(_state(c), _state(py))


@pytest.mark.parametrize("seed", range(60))
def test_few_grants_as_the_python_pass(seed: int) -> None:
    """Rule 2's grants for a short run order in C (``_rows.few``) against the Python loop:
    the same items, budget left, blocks and the step's composition (the attention work the
    same float); tokens an int or an array (some asking nothing or more than is left), the
    budget sometimes clipping, nothing written."""
    c, py = _pair(seed)
    rng = np.random.default_rng(2000 + seed)
    R = c.R
    if R == 0:
        return
    for _ in range(8):
        n = int(rng.integers(0, min(R, 6) + 1))
        order = rng.choice(R, size=n, replace=False).astype(np.int64)
        tok: np.ndarray | int
        if rng.random() < 0.4:
            tok = int(rng.integers(-1, 3))
        else:
            tok = rng.integers(-2, 400, n).astype(np.int64)
        budget = int(rng.choice([0, 1, 5, 50, 400, 4096]))
        got = c._few_items_c(order, tok, budget)
        want = py._few_items_py(order, tok, budget)
        assert got == want
        assert type(got[6]) is float and all(type(x) is int for item in got[0] for x in item)
    _assert_same(_state(c), _state(py))


def test_few_leaves_other_dtypes_to_the_python_pass() -> None:
    """Order or tokens that are not contiguous int64 arrays (a policy's int32 positions, a
    strided view, float tokens) are granted by the Python loop, not refused."""
    c, py = _pair(7)
    assert c.R >= 4
    order = np.array([3, 0, 2], dtype=np.int64)
    tok = np.array([1, 40, 2], dtype=np.int64)
    want = py._few_items_py(order, tok, 60)
    assert c._few_items_c(order.astype(np.int32), tok, 60) == want
    assert c._few_items_c(order, tok.astype(np.int32), 60) == want
    assert c._few_items_c(np.array([3, 9, 0, 9, 2])[::2], tok, 60) == want  # strided
    assert c._few_items_c(order, np.array([1, 9, 40, 9, 2])[::2], 60) == want
    assert c._few_items_c(order, tok.astype(np.float64), 60) == py._few_items_py(
        order, tok.astype(np.float64), 60
    )


def test_few_refuses_bad_input() -> None:
    from harness.engine import _rows

    eng = _engine(np.random.default_rng(5))
    R = eng.R
    order = np.array([0], dtype=np.int64)
    with pytest.raises(IndexError, match="position"):
        _rows.few(eng.IA, R, np.array([R], dtype=np.int64), 1, 10, BS)
    with pytest.raises(IndexError, match="position"):
        _rows.few(eng.IA, R, np.array([-1], dtype=np.int64), 1, 10, BS)
    with pytest.raises(ValueError, match="one item per position"):
        _rows.few(eng.IA, R, order, np.ones(2, dtype=np.int64), 10, BS)
    with pytest.raises(TypeError, match="int64"):
        _rows.few(eng.IA, R, order.astype(np.int32), 1, 10, BS)
    with pytest.raises(ValueError, match="block size"):
        _rows.few(eng.IA, R, order, 1, 10, 0)
    with pytest.raises(ValueError, match="R <= columns"):
        _rows.few(eng.IA, eng.IA.shape[1] + 1, order, 1, 10, BS)


@pytest.mark.parametrize("seed", range(30))
def test_preempt_evicts_and_closes_as_the_python_pass(seed: int) -> None:
    """One victim at the front, middle or end of the running set: the same rows, queue,
    KV and computed-token sums, the later slots shifted down (``_rows.preempt``)."""
    c, py = _pair(seed)
    rng = np.random.default_rng(3000 + seed)
    for _ in range(3):
        if c.R == 0:
            return
        v = int(rng.choice([0, c.R - 1, int(rng.integers(0, c.R))]))
        c._preempt_c(v)
        py._preempt_py(v)
        assert _queue(c) == _queue(py)
        _assert_same(_state(c), _state(py))
    # a position outside the running set, or a trace row outside the rows: nothing written
    from harness.engine import _rows

    rows = c.rows
    args = (rows.state, rows.Orow, rows.first, rows.last, rows.npre)
    before, queued = _state(c), _queue(c)
    with pytest.raises(IndexError, match="running set"):
        _rows.preempt(c.IA, c.FA, c.R, c.R, BS, *args)
    with pytest.raises(IndexError, match="running set"):
        _rows.preempt(c.IA, c.FA, c.R, -1, BS, *args)
    if c.R:
        j = int(c.IA[4, 0])
        c.IA[4, 0] = len(rows.state)
        with pytest.raises(IndexError, match="trace row"):
            _rows.preempt(c.IA, c.FA, c.R, 0, BS, *args)
        c.IA[4, 0] = j
        with pytest.raises(ValueError, match="npre"):  # npre of another length
            _rows.preempt(c.IA, c.FA, c.R, 0, BS, *args[:4], rows.npre[:-1])
        with pytest.raises(ValueError, match="block size"):
            _rows.preempt(c.IA, c.FA, c.R, 0, 0, *args)
    _assert_same(_state(c), before)
    assert _queue(c) == queued


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("with_meta", [False, True])
def test_admit_fills_the_slot_as_the_python_pass(seed: int, with_meta: bool) -> None:
    """The waiting head, or a named waiting row, into slot R: the same columns (arrival and
    TBT SLO from the request metadata when there is one), row state, KV and blocks."""
    from harness.engine.row_requests import RowMeta

    c, py = _pair(seed)
    rng = np.random.default_rng(4000 + seed)
    n = len(c.rows.P)
    if with_meta:
        tbt = [None if rng.random() < 0.5 else float(rng.random()) for _ in range(n)]
        arrival = np.sort(rng.random(n) * 100).tolist()
        for eng in (c, py):
            r = eng.rows
            meta = RowMeta([str(j) for j in range(n)], arrival, ["t"] * n, [0] * n, [None] * n,
                           tbt, None)  # fmt: skip
            eng.rows = Rows(r.P, r.M, meta)
            for name in ("Orow", "first", "last", "state", "npre"):  # in place: the views
                getattr(eng.rows, name)[:] = getattr(r, name)  # (Rows.c_rows) stay theirs
    idle = np.flatnonzero(c.rows.state != fastsim._RUNNING).tolist()
    rng.shuffle(idle)
    outputs = rng.integers(0, 3, len(idle[:6]))  # some preempted after a token or two
    for eng in (c, py):
        eng.waiting.extend(idle[:6])
        eng.rows.state[idle[:6]] = fastsim._WAITING
        eng.rows.Orow[idle[:6]] = outputs
    slots = c.IA.shape[1]
    for g, j in ((int(rng.integers(0, 600)), None), (0, idle[3]), (BS, None)):
        if slots == c.R:
            break
        assert c._admit_head_c(g, j) == py._admit_head_py(g, j)
        assert list(c.waiting) == list(py.waiting)
        _assert_same(_state(c), _state(py))
        np.testing.assert_array_equal(c.FA[2:, : c.R], py.FA[2:, : py.R])
    from harness.engine import _rows

    # errors: a row past the trace, lengths or metadata of another size, a negative first
    # chunk, no free slot; nothing written, the queue as it was
    r = c.rows
    rows_args = (r.state, r.Orow, r.first, r.last)
    before, queued = _state(c), _queue(c)
    bad = [
        (IndexError, "trace row", (c.R, n, 1, *rows_args, r.PM, r.AT)),
        (ValueError, "2 rows", (c.R, 0, 1, *rows_args, r.PM[:, :-1].copy(), r.AT)),
        (ValueError, "negative", (c.R, 0, -1, *rows_args, r.PM, r.AT)),
        (IndexError, "free slot", (slots, 0, 1, *rows_args, r.PM, r.AT)),
    ]
    if r.AT is not None:
        bad.append((ValueError, "2 rows", (c.R, 0, 1, *rows_args, r.PM, r.AT[:, :-1].copy())))
    for exc, match, (slot, j, g, *rest) in bad:
        if slot >= slots and match != "free slot":  # no free slot: that error first
            continue
        with pytest.raises(exc, match=match):
            _rows.admit(c.IA, c.FA, slot, j, g, BS, *rest)
    if c.waiting and slots > c.R:  # the host's call: the head stays queued after an error
        # (the C pass reads the lengths through c_PM: Rows.c_rows says why)
        c.rows.c_PM, good = memoryview(c.rows.PM[:, :-1].copy()), c.rows.c_PM
        with pytest.raises(ValueError, match="2 rows"):
            c._admit_head_c(1)
        c.rows.c_PM = good
    _assert_same(_state(c), before)
    assert _queue(c) == queued


@pytest.mark.parametrize("seed", range(40))
def test_each_once_is_the_bincount_test(seed: int) -> None:
    """``_rows.each_once`` against the Python test: permutations, a repeat, a missing
    position, the wrong length, a position past the end, none at all."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 50))
    perm = rng.permutation(n).astype(np.int64)
    cases = [perm, perm[:-1], np.arange(n + 1, dtype=np.int64)]
    if n > 1:
        cases += [np.r_[perm[:-1], perm[0]], np.r_[perm[:-1], n + 3], np.r_[perm[:-1], -1]]
    for order in cases:
        want = fastsim._lists_each_once_py(order, n)
        assert fastsim._lists_each_once_c(order, n) == want
        assert want == (len(order) == n and sorted(order.tolist()) == list(range(n)))
    # another dtype: the Python test answers
    assert fastsim._lists_each_once_c(perm.astype(np.int32), n)


def _array_pass(eng: ArrayEngine, order: np.ndarray, tok, budget: int):
    """execute_plan's array pass (rule 2, preempting from the tail when the KV runs short,
    then the composition), as before the C pass."""
    Pr, Or, Cr = eng.cols[:3]
    req = tok if isinstance(tok, np.ndarray) else np.full(len(order), tok, np.int64)
    Co, Oo = Cr[order], Or[order]
    rem = Pr[order] + Oo - Co
    want = np.minimum(np.maximum(req, 0), rem)
    sp, sg, left, _ = eng._run_items(order, want, Co, budget)
    if sp is not order:  # compacted
        Co, Oo = Cr[sp], Or[sp]
        rem = Pr[sp] + Oo - Co
    ran, n_decode, prefill, attn, kv_read = eng._composition(sg, Co, Oo, rem)
    return sp, sg, left, int(np.count_nonzero(ran)), n_decode, prefill, attn, kv_read


def _queue(eng: ArrayEngine) -> tuple:
    return list(eng.waiting), list(eng._evicted), eng.preempt_total, eng.rows.npre.tolist()


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("attn", [False, True])
def test_grant_and_its_rule_5_do_what_the_array_pass_does(seed: int, attn: bool) -> None:
    c, py = _pair(seed)
    c.use_attn = py.use_attn = attn
    rng = np.random.default_rng(2000 + seed)
    for _ in range(3):
        R = c.R
        if R == 0:
            return
        order = rng.permutation(R)[: int(rng.integers(1, R + 1))].astype(np.int64)
        if rng.random() < 0.5:
            tok = rng.integers(-2, 400, len(order)).astype(np.int64)
        else:
            tok = int(rng.choice([1, 16, 512]))
        budget = int(rng.choice([1, 37, 512, 1 << 20]))
        if rng.random() < 0.4:  # little KV left: the run may not fit, the tail is preempted
            c.used = py.used = c.total - int(rng.integers(0, 8))
        got = c._grant_c(order, tok, budget)
        want = _array_pass(py, order, tok, budget)
        assert got is not None
        np.testing.assert_array_equal(got[0], want[0])  # the scheduled positions
        np.testing.assert_array_equal(got[1], want[1])  # their grants
        assert got[2:] == want[2:]  # the attention float too, bit for bit
        assert (got[0] is order) == (want[0] is order)  # preempted, or not
        assert _queue(c) == _queue(py)
        _assert_same(_state(c), _state(py))
        before_out = c.IA[1].copy()  # outputs before rule 5: who emits is who gains one
        n_logged = c.chunks._n
        if len(got[0]):
            c._apply(got[0], got[1], 30.0 + seed, True)  # its emitted rows: into the chunk log
            py._apply(want[0], want[1], 30.0 + seed, False)
            emitted = c.IA[4, got[0]][c.IA[1, got[0]] > before_out[got[0]]]
            assert c.chunks._req[n_logged : c.chunks._n].tolist() == list(emitted)
            py._recount_py()  # the one pass recounted after its rule 5
            assert (c.min_left, c.npf) == (py.min_left, py.npf)
        c._recount_c()
        py._recount_py()
        _assert_same(_state(c), _state(py))
        c._evicted.clear()
        py._evicted.clear()


@pytest.mark.parametrize("seed", range(60))
def test_steps_fit_is_decode_steps_that_fit(seed: int) -> None:
    """A steady run's KV bound in C (``_rows.steps_fit``) against core.decode_steps_that_fit:
    requests at and past block boundaries, no room at all (negative free), room for every
    step (the shortcut), a bound found by the binary search, huge k_max, no requests."""
    from harness.engine import _rows
    from harness.engine.core import decode_steps_that_fit

    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 3, 40, 200]))
    bs = int(rng.choice([1, 4, 16, 128]))
    comp = rng.integers(0, 5000, n).astype(np.int64)
    comp[: n // 3] = bs * rng.integers(0, 40, n // 3)  # at a boundary
    for k_max in (1, 2, 3, bs, bs + 1, int(rng.integers(2, 4000)), 1 << 40):
        for free in (-3, -1, 0, 1, int(rng.integers(0, 50)), int(rng.integers(0, 5000)), 1 << 60):
            want = decode_steps_that_fit(comp, k_max, bs, free)
            assert _rows.steps_fit(comp, k_max, bs, free) == want, (k_max, free)


def test_steps_fit_refuses_bad_input() -> None:
    from harness.engine import _rows

    comp = np.array([3, 17], np.int64)
    # the two cross into a new block at steps 14 and 16; the first again at step 30
    assert _rows.steps_fit(comp, 40, 16, 2) == 29
    # numpy's sum in decode_steps_that_fit wraps past 2**63 here; the C sum stops at free
    assert _rows.steps_fit(np.full(200, 5, np.int64), 1 << 61, 16, -3) == 1
    with pytest.raises(ValueError, match="k_max"):
        _rows.steps_fit(comp, 0, 16, 2)
    assert _rows.steps_fit(comp, 1 << 62, 16, (1 << 62) - 1) == 1 << 62  # fastsim._NO_LEFT
    with pytest.raises(ValueError, match="k_max"):
        _rows.steps_fit(comp, (1 << 62) + 1, 16, 2)
    with pytest.raises(ValueError, match="free"):
        _rows.steps_fit(comp, 4, 16, 1 << 62)
    with pytest.raises(ValueError, match="positive"):
        _rows.steps_fit(comp, 4, 0, 2)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        _rows.steps_fit(np.array([-1], np.int64), 4, 16, 2)
    with pytest.raises(TypeError, match="int64"):
        _rows.steps_fit(comp.astype(np.int32), 4, 16, 2)
    with pytest.raises(TypeError, match="4 arguments"):
        _rows.steps_fit(comp, 4, 16)


def _one_block_short(seed: int) -> tuple[ArrayEngine, ArrayEngine, np.ndarray, np.ndarray] | None:
    """Two engines in the same state and a run order of every running position whose KV
    need is one block more than the free blocks (rule 2 then preempts from its tail: often
    its last item alone); None when the state has fewer than two running or the run opens
    no block."""
    c, py = _pair(seed)
    if c.R < 2:
        return None
    rng = np.random.default_rng(5000 + seed)
    order = rng.permutation(c.R).astype(np.int64)
    tok = rng.integers(1, 40, len(order)).astype(np.int64)
    Cr = c.IA[2]
    want = np.minimum(tok, c.IA[0][order] + c.IA[1][order] - Cr[order])
    need = int(((Cr[order] + want + BS - 1) // BS - (Cr[order] + BS - 1) // BS).sum())
    if need == 0:
        return None
    c.used = py.used = c.total - (need - 1)
    return c, py, order, tok


@pytest.mark.parametrize("seed", range(40))
def test_a_lone_victim_is_preempted_by_the_grant_pass_as_the_array_pass_does(seed: int) -> None:
    """KV one block short for the whole run order: rule 2 preempts from its tail; when its
    last item alone is enough, ``_rows.grant`` preempts it itself (the kept positions then
    shifted past its slot, written to the engine's buffer). State, queue and results are the
    array pass's."""
    case = _one_block_short(seed)
    if case is None:
        return
    c, py, order, tok = case
    got = c._grant_c(order, tok, 1 << 20)
    ref = _array_pass(py, order, tok, 1 << 20)
    assert got is not None
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert got[2:] == ref[2:]
    assert _queue(c) == _queue(py)
    _assert_same(_state(c), _state(py))
    assert (c.used, c.R) == (py.used, py.R)
    if py.preempt_total == 1:  # the lone victim (its blocks freed the one missing)
        assert got[0].base is c._kept and c.rows.npre.sum() == py.rows.npre.sum()


def test_the_grant_pass_preempts_a_lone_victim_in_some_states() -> None:
    """The lone-victim path of the test above is reached (not only longer tails or none)."""
    lone = 0
    for seed in range(40):
        case = _one_block_short(seed)
        if case is not None:
            c, _, order, tok = case
            c._grant_c(order, tok, 1 << 20)
            lone += c.preempt_total == 1
    assert lone >= 5


def test_grant_declines_a_run_order_that_names_a_position_twice() -> None:
    eng = next(e for e in map(_engine, map(np.random.default_rng, range(50))) if e.R >= 2)
    before = _state(eng)
    assert eng._grant_c(np.array([0, 1, 0], np.int64), 1, 1 << 20) is None
    # longer than the grants buffer (one item per running slot): only repeats make it so
    assert eng._grant_c(np.zeros(len(eng._grants) + 1, np.int64), 1, 1 << 20) is None
    assert eng._grant_c(np.array([0, 1], np.int32), 1, 1 << 20) is None  # not int64
    assert eng._grant_c(np.arange(4, dtype=np.int64)[::-1][:2], 1, 1 << 20) is None  # strided
    assert eng._grant_c(np.array([0, 1], np.int64), 1.0, 1 << 20) is None  # a float want
    _assert_same(_state(eng), before)


def test_the_grant_passes_reject_bad_input_and_write_nothing() -> None:
    from harness.engine import _rows

    eng = next(e for e in map(_engine, map(np.random.default_rng, range(50))) if e.R >= 2)
    IA, FA, R = eng.IA, eng.FA, eng.R
    rows = (*eng.rows.c_rows, eng.rows.c_npre)
    before = _state(eng)
    out, kept = np.empty(2, np.int64), np.empty(2, np.int64)
    two = np.array([0, 1], np.int64)

    def grant(*args: object, out: np.ndarray = out, kept: np.ndarray = kept, rows=rows):
        return _rows.grant(IA, FA, *args, out, kept, *rows)

    with pytest.raises(IndexError, match="position"):
        grant(R, np.array([0, R], np.int64), None, 1, 99, BS, 99, False)
    with pytest.raises(ValueError, match="R <= columns"):
        grant(IA.shape[1] + 1, two, None, 1, 99, BS, 99, False)
    with pytest.raises(ValueError, match="one item per position"):
        grant(R, two, np.ones(1, np.int64), 0, 99, BS, 99, False)
    with pytest.raises(ValueError, match="one item per position"):
        grant(R, two, None, 1, 99, BS, 99, False, out=out[:1])
    with pytest.raises(ValueError, match="block size"):
        grant(R, two, None, 1, 99, 0, 99, False)
    read_only = np.ones(2, np.int64)
    read_only.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        grant(R, two, None, 1, 99, BS, 99, False, out=read_only)
    with pytest.raises(TypeError, match="17 arguments"):
        _rows.grant(IA, FA, R, two, None, 1, 99, BS, 99, False, out, kept)
    # no KV free: the first of two prefills needs a block that only the second's three
    # free, so the second is the lone victim; its trace row out of range raises before
    # anything is written
    bad = IA.copy()
    bad[:, 0] = (10, 0, 0, 50, 0)  # prompt, outputs, computed, max_tokens, trace row
    bad[:, 1] = (3 * BS + 10, 0, 3 * BS, 50, len(eng.rows.P))
    written = bad.copy()
    with pytest.raises(IndexError, match="trace row"):
        _rows.grant(bad, FA, R, two, None, 1, 99, BS, 0, False, out, kept, *rows)
    # the buffers the preemption writes (taken only when there is one)
    victim = partial(_rows.grant, bad, FA, R, two, None, 1, 99, BS, 0, False, out)
    with pytest.raises(ValueError, match="kept_out"):
        victim(kept[:0], *rows)
    with pytest.raises((TypeError, BufferError, ValueError)):
        victim(read_only, *rows)
    with pytest.raises(ValueError, match="npre"):
        victim(kept, *rows[:4], eng.rows.npre[:-1])
    with pytest.raises(TypeError, match="int8"):
        victim(kept, eng.rows.Orow, *rows[1:])
    with pytest.raises(ValueError, match="FA's 4 rows"):
        _rows.grant(bad, FA[:3], R, two, None, 1, 99, BS, 0, False, out, kept, *rows)
    np.testing.assert_array_equal(bad, written)
    bad[4, 1] = 0  # in range (of rows of its own): the lone victim, preempted by the pass
    own = Rows([1], [1])
    got = _rows.grant(
        bad, FA.copy(), R, two, None, 1, 99, BS, 0, False, out, kept, *own.c_rows, own.c_npre
    )
    assert got[7:] == (1, 1, 3, 3 * BS, 0)  # kept 1 (granted: 1), its blocks, computed, row
    assert own.npre[0] == 1 and own.state[0] == fastsim._WAITING
    grants = np.ones(2, np.int64)
    log = np.zeros(4, np.int32)
    with pytest.raises(IndexError, match="position"):
        _rows.advance(IA, FA, R, np.array([R], np.int64), grants, 1.0, log, 0)
    with pytest.raises(ValueError, match="out of range"):
        _rows.advance(IA, FA, R, two, grants[:1], 1.0, log, 0)
    # the chunk log's buffer: int32, writable, with room for every position from the offset
    with pytest.raises(ValueError, match="room"):
        _rows.advance(IA, FA, R, two, grants, 1.0, log, 3)
    with pytest.raises(ValueError, match="room"):
        _rows.advance(IA, FA, R, two, grants, 1.0, log, -1)
    with pytest.raises(TypeError, match="int32"):
        _rows.advance(IA, FA, R, two, grants, 1.0, np.zeros(4, np.int64), 0)
    frozen = np.zeros(4, np.int32)
    frozen.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        _rows.advance(IA, FA, R, two, grants, 1.0, frozen, 0)
    with pytest.raises(ValueError, match="R <= columns"):
        _rows.recount(IA, IA.shape[1] + 1)
    _assert_same(_state(eng), before)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 100, 128, 129, 300, 1000])
def test_grant_sums_the_attention_work_as_numpy_does(n: int) -> None:
    # numpy sums a float array pairwise; the C pass must give the same float. A step's terms
    # are exact multiples of 0.5 at real sizes (any order gives the same sum), so the terms
    # here are made inexact: contexts of ~1e15 tokens
    from harness.engine import _rows

    rng = np.random.default_rng(n)
    IA = np.zeros((5, n), np.int64)
    IA[2] = rng.integers(10**14, 10**16, n)  # computed: prefilling, no output yet
    IA[0] = IA[2] + rng.integers(2, 5000, n)  # prompt
    IA[3] = 10
    order = rng.permutation(n).astype(np.int64)
    tok = rng.integers(1, 5000, n).astype(np.int64)
    out = np.empty(n, np.int64)
    rows = Rows([1] * n, [1] * n)
    got = _rows.grant(
        IA, np.zeros((4, n)), n, order, tok, 0, 1 << 40, 16, 1 << 60, True, out,
        np.empty(n, np.int64), *rows.c_rows, rows.c_npre,
    )  # fmt: skip
    Co = IA[2][order]
    pg = np.minimum(tok, IA[0][order] - Co)
    np.testing.assert_array_equal(out, pg)
    assert got[4] == float((pg * (Co + pg / 2)).sum())


@pytest.mark.parametrize("seed", range(40))
def test_recount_counts_as_the_python_pass(seed: int) -> None:
    c, py = _pair(seed)
    c._recount_c()
    py._recount_py()
    assert (c.min_left, c.npf) == (py.min_left, py.npf)


@pytest.mark.parametrize(
    "policy",
    ["vllm", "sarathi", "orca", "rad", "slai", "wait", "nested-wait", "mcsf", "mcsf-alpha"],
)
@pytest.mark.parametrize("kv_tokens", [3000, 1 << 20])  # preemptions / none
def test_simulations_with_either_pass_give_the_same_token_times(
    policy: str, kv_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    tr = poisson_trace(300, 12.0, seed=7, pmax=400, omax=300)
    cfg = EngineConfig(kv_tokens=kv_tokens, token_budget=512, max_num_seqs=48, block_size=BS)
    cost = get_cost_model("a100-llama2-7b")
    runs = []
    for impl in ("c", "py"):
        for m in METHODS:
            monkeypatch.setattr(ArrayEngine, m, getattr(ArrayEngine, f"{m}_{impl}"))
        columns = fastsim.KernelColumns if impl == "c" else RunningColumns
        monkeypatch.setattr(fastsim, "_COLUMNS", columns)
        monkeypatch.setattr(ArrayEngine, "_step_time_in_c", impl == "c")
        steps_fit = fastsim._rows.steps_fit if impl == "c" else fastsim.decode_steps_that_fit
        monkeypatch.setattr(fastsim, "_steps_fit", steps_fit)
        each_once = fastsim._lists_each_once_c if impl == "c" else fastsim._lists_each_once_py
        monkeypatch.setattr(fastsim, "lists_each_once", each_once)
        runs.append(simulate(tr, make_policy(policy), cost, cfg))
    a, b = runs
    assert a.counters["kernel"] == "fast"
    assert a.num_steps == b.num_steps
    np.testing.assert_array_equal(a.status, b.status)
    np.testing.assert_array_equal(a.out_tokens, b.out_tokens)
    np.testing.assert_array_equal(a.first_s, b.first_s)
    np.testing.assert_array_equal(a.last_s, b.last_s)
    np.testing.assert_array_equal(a.chunk_req, b.chunk_req)
    np.testing.assert_array_equal(a.chunk_t, b.chunk_t)
    np.testing.assert_array_equal(a.preemptions, b.preemptions)
    assert a.samples.keys() == b.samples.keys()
    for c in a.samples:  # the telemetry rows, column by column, their types too
        assert a.samples[c].dtype == b.samples[c].dtype
        np.testing.assert_array_equal(a.samples[c], b.samples[c])
    if kv_tokens == 3000 and policy in ("vllm", "sarathi"):
        assert a.counters["preemptions_total"] > 0  # the tight case does preempt


@pytest.mark.parametrize("value, expected", [("1", "py"), ("0", "c"), ("", "c")])
def test_the_environment_selects_the_passes(value: str, expected: str, fresh_python) -> None:
    code = (
        "from harness.engine import fastsim as f;"
        "from harness.engine.fastsim import ArrayEngine as A, _COLUMNS;"
        "print(*[getattr(A, m).__name__ for m in"
        f" {METHODS}],"
        " _COLUMNS.__name__, A._step_time_in_c, f._steps_fit.__name__,"
        " f.lists_each_once.__name__)"
    )
    out = fresh_python(code, HARNESS_PURE_KERNEL=value)
    columns = "KernelColumns" if expected == "c" else "RunningColumns"
    fit = "steps_fit" if expected == "c" else "decode_steps_that_fit"
    once = f"_lists_each_once_{expected}"
    assert out == [f"{m}_{expected}" for m in METHODS] + [
        columns,
        str(expected == "c"),
        fit,
        once,
    ]


@pytest.mark.parametrize("seed", range(40))
def test_one_victim_is_preempted_as_the_mask_pass_preempts(seed: int) -> None:
    """_preempt_tail's one-victim path (its slot closed, the later positions shifted) leaves
    the state and returns the positions that the general path's mask and cumsum give."""
    rng = np.random.default_rng(seed)
    fast, slow = _pair(seed)
    if fast.R < 2:
        return
    order = rng.permutation(fast.R)[: int(rng.integers(2, fast.R + 1))].astype(np.int64)
    if seed % 3 == 0:  # an array-pass order naming the victim earlier too (the mask path)
        order[int(rng.integers(0, len(order) - 1))] = order[-1]
    grant = rng.integers(0, 3, len(order)).astype(np.int64)
    k = len(order) - 1
    sp, sg = fast._preempt_tail(order, grant, k)
    # the general path: evict, mask, positions after compaction by cumsum, retire
    slow._evict(int(order[k]))
    alive = np.ones(slow.R, dtype=bool)
    alive[order[k:]] = False
    ran = grant[:k] > 0
    want_sp = (np.cumsum(alive) - 1)[order[:k][ran]]
    slow._retire(alive)
    np.testing.assert_array_equal(sp, want_sp)
    np.testing.assert_array_equal(sg, grant[:k][ran])
    _assert_same(_state(fast), _state(slow))
    assert list(fast.waiting) == list(slow.waiting) and fast.preempt_total == 1


@pytest.mark.parametrize("seed", range(60))
def test_a_prefill_runs_chunks_in_c_are_the_python_loops(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_prefill_run with its chunks in C (``_rows.prefill_chunks``, the completing one too
    where its token leaves the request running) and without: the same end time, state,
    telemetry rows and counters, over long prompts,
    recomputed requests, chunks the KV stops, runs cut by ``until`` and the sample block's
    growth (4096 rows a start)."""
    monkeypatch.setattr(ArrayEngine, "_step_time_in_c", True)  # (also under the pure kernel)
    rng = np.random.default_rng(seed)
    fast, slow = _pair(seed)
    assert fast._chunks is not None and fast._chunks.func.__name__ == "prefill_chunks"
    models = _models_in_c()  # each model's terms (the presets', a floor, every context term)
    _, terms = models[seed % len(models)]
    for eng in (fast, slow):
        eng._step_time = partial(fastsim._rows.step_time, *terms)
    fast._chunks = partial(fastsim._rows.prefill_chunks, *terms)
    slow._chunks = None
    if fast.R == 0:
        return
    p = int(rng.integers(0, fast.R))
    o = int(rng.integers(1, 5)) if seed % 3 == 0 else 0  # recomputed: outputs so far
    prompt = int(rng.integers(1, 20000))
    c = int(rng.integers(0, prompt + o))
    tok = [int(rng.integers(1, 700)), 1 << 62, 0, -3][seed % 8 // 2]
    tok = tok if seed % 5 else int(rng.integers(1, 64))  # small chunks: many steps
    cap = int(rng.integers(1, 4096))
    until = [np.inf, float(rng.random() * 2)][seed % 2]
    spare = int(rng.integers(0, 400)) if seed % 4 == 1 else 1 << 20  # KV runs short
    # the sample block fills during the run (rows before it: zeros)
    fill = int(rng.integers(1, 5)) if seed % 6 == 2 else None
    reports: list[list] = [[], []]
    for eng, got in zip((fast, slow), reports, strict=True):
        eng.hooks = SimpleNamespace(on_step=got.append)  # type: ignore[assignment]
        eng.rows.meta = SimpleNamespace(ids=[f"r{j}" for j in range(len(eng.rows.P))])  # type: ignore[assignment]
        old = -(-int(eng.IA[2, p]) // BS)
        eng.IA[:3, p] = (prompt, o, c)
        if seed % 7 < 4:  # a state between steps (nobody at max_tokens), and p's first token
            # leaves it running: the completing chunk runs in C too
            R = eng.R
            eng.IA[3, :R] = np.maximum(eng.IA[3, :R], eng.IA[1, :R] + 2)
            eng._recount_py()
        eng.used += -(-c // BS) - old
        eng.sum_c = int(eng.IA[2, : eng.R].sum())
        eng.total = eng.used + spare
        eng.steps_total = eng.calls = 0
        eng.budget_cap = cap
        if fill is not None:
            eng._S[:] = 0.0
            eng._ns = eng._S.shape[1] - fill
    ends = [eng._prefill_run(1.5, p, tok, until) for eng in (fast, slow)]
    assert ends[0] == ends[1]
    assert reports[0] == reports[1]  # the policy hears of the same steps
    _assert_same(_state(fast), _state(slow))
    a, b = fast.samples, slow.samples
    for col in a:
        np.testing.assert_array_equal(a[col], b[col])
    counters = ("_ns", "steps_total", "calls", "stall", "steady", "used", "total")
    assert [getattr(fast, x) for x in counters] == [getattr(slow, x) for x in counters]


def test_prefill_chunks_refuses_bad_input_and_writes_nothing() -> None:
    from harness.engine import _rows
    from harness.engine.costmodel import step_terms

    coef, table = step_terms(get_cost_model("a100-llama2-7b"))
    S = np.zeros((10, 8))
    # n, t, until, computed, whole, output, tok, cap, block, used, total, waiting, running,
    # preempted, last_ok
    ok = (0, 0.0, 1e9, 0, 100, 0, 16, 512, BS, 0, 100, 3, 2, 1, 0)
    t, c, used, k, last = _rows.prefill_chunks(coef, table, S, *ok)
    # 6 chunks of 16; the 7th completes (the caller's)
    assert (c, used, k, last) == (96, 6, 6, 0) and t == S[0, 5]
    assert S[3, :6].tolist() == [16.0] * 6 and S[6, 5] == 6 / 100
    # with last_ok the 7th runs too (4 tokens, a 7th block); computed stays before it
    S7 = np.zeros((10, 8))
    t7, c7, used7, k7, last7 = _rows.prefill_chunks(coef, table, S7, *ok[:-1], 1)
    assert (c7, used7, k7, last7) == (96, 7, 7, 4) and t7 == S7[0, 6] > t
    np.testing.assert_array_equal(S7[:, :6], S[:, :6])
    assert S7[3, 6] == 4.0 and S7[5, 6] == 7 * BS
    before = S.copy()
    with pytest.raises(TypeError, match="18 arguments"):
        _rows.prefill_chunks(coef, table, S, *ok[:-1])
    with pytest.raises(ValueError, match="n <= columns"):
        _rows.prefill_chunks(coef, table, S, 9, *ok[1:])
    with pytest.raises(ValueError, match="10 rows"):
        _rows.prefill_chunks(coef, table, np.zeros((9, 8)), *ok)
    with pytest.raises(ValueError, match="used <= total"):
        _rows.prefill_chunks(coef, table, S, *ok[:9], 101, *ok[10:])
    with pytest.raises(ValueError, match="positive"):
        _rows.prefill_chunks(coef, table, S, *ok[:8], 0, *ok[9:])
    with pytest.raises(ValueError, match="2\\*\\*53"):
        _rows.prefill_chunks(coef, table, S, *ok[:3], -1, *ok[4:])
    with pytest.raises(TypeError, match="4 or 6"):
        _rows.prefill_chunks(coef[:3], table, S, *ok)
    with pytest.raises(TypeError):
        _rows.prefill_chunks(coef, table, S, 0, "t", *ok[2:])
    np.testing.assert_array_equal(S, before)
    full = _rows.prefill_chunks(coef, table, S, 8, *ok[1:])  # no room: nothing runs
    assert full == (0.0, 0, 0, 0, 0)
    huge = _rows.prefill_chunks(coef, table, np.zeros((10, 8)), 0, *ok[1:6], 1 << 70, *ok[7:])
    assert huge[1:] == (0, 0, 0, 0)  # all it has left is the completing chunk: the caller's
    # a budget past int64 is no limit; a KV past 2**53 tokens is the Python loop's (its
    # telemetry doubles would round here): nothing raised, nothing run
    assert _rows.prefill_chunks(coef, table, np.zeros((10, 8)), *ok[:7], 1 << 70, *ok[8:])[3] == 6
    big = (*ok[:9], 0, 1 << 60, *ok[11:])
    assert _rows.prefill_chunks(coef, table, np.zeros((10, 8)), *big)[1:] == (0, 0, 0, 0)
    edge = (*ok[:9], (1 << 53) // BS - 3, (1 << 53) // BS, *ok[11:])  # room for 2 blocks
    assert _rows.prefill_chunks(coef, table, np.zeros((10, 8)), *edge)[2:] == (
        (1 << 53) // BS - 1,
        2,
        0,
    )


def test_sample_writes_the_row_the_python_pass_writes() -> None:
    """Both passes' telemetry rows, column by column, through the block's growth (4096
    rows a start), with the float line's awkward values (a ratio that rounds, -0.0)."""
    rng = np.random.default_rng(11)
    pair = _pair(5)
    passes = (ArrayEngine._sample_c, ArrayEngine._sample_py)
    for i in range(5000):
        end = float(rng.random() * 1e4) if i % 7 else -0.0
        t = end - float(rng.exponential()) if i % 11 else end
        k, pre, dec = (int(x) for x in rng.integers(0, 1 << 40, 3))
        used = int(rng.integers(0, 1 << 30))
        waiting, running, preempted = (int(x) for x in rng.integers(0, 1 << 50, 3))
        for eng, sample in zip(pair, passes, strict=True):
            eng.used, eng.total = used, (1 << 30) + 7
            eng.waiting.clear()
            eng.waiting.extend(range(waiting % 50))
            eng.R, eng.preempt_total = running, preempted
            sample(eng, end, t, k, pre, dec)
    a, b = (eng.samples for eng in pair)
    assert len(a["t_s"]) == 5000
    for c in a:
        assert a[c].dtype == b[c].dtype
        np.testing.assert_array_equal(a[c], b[c])
        assert np.signbit(a[c]).tolist() == np.signbit(b[c]).tolist()
    # Python's true division of the integers (exact below 2**53 as the C pass's doubles)
    total = (1 << 30) + 7
    assert a["kv_usage"].tolist() == [u / total for u in (a["kv_used_tokens"] // BS).tolist()]


def test_sample_refuses_bad_input_and_writes_nothing() -> None:
    from harness.engine import _rows

    S = np.zeros((10, 8))
    ok = (0, 1.0, 0.5, 1, 2, 3, 4, BS, 100, 5, 6, 7)
    _rows.sample(S, *ok)
    assert S[:, 0].tolist() == [1.0, 1, 0.5, 2, 3, 4 * BS, 4 / 100, 5, 6, 7]
    before = S.copy()
    with pytest.raises(ValueError, match="n < columns"):
        _rows.sample(S, 8, *ok[1:])
    with pytest.raises(ValueError, match="n < columns"):
        _rows.sample(S, -1, *ok[1:])
    for shape in [(9, 8), (5, 16), (16, 5), (80,), (10, 8, 1)]:  # 10 rows, nothing else
        with pytest.raises(ValueError, match="10 rows"):
            _rows.sample(np.zeros(shape), *ok)
    with pytest.raises(TypeError, match="float64"):
        _rows.sample(np.zeros((10, 8), np.float32), *ok)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        _rows.sample(S, *ok[:4], -1, *ok[5:])
    with pytest.raises(ValueError, match="positive"):
        _rows.sample(S, *ok[:7], 0, *ok[8:])
    with pytest.raises(ValueError, match="positive"):
        _rows.sample(S, *ok[:8], 0, *ok[9:])
    with pytest.raises(ValueError, match="used \\* block"):
        _rows.sample(S, *ok[:6], 1 << 50, 1 << 4, *ok[8:])
    with pytest.raises(TypeError):  # the first bad argument's error, nothing after it
        _rows.sample(S, 0, "end", 0.5, None, *ok[4:])
    with pytest.raises(TypeError, match="13 arguments"):
        _rows.sample(S, *ok[:-1])
    read_only = S.copy()
    read_only.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        _rows.sample(read_only, *ok)
    np.testing.assert_array_equal(S, before)
    _rows.sample(S, np.int64(1), np.float64(2.0), 1.5, *map(np.int64, ok[3:]))  # numpy's
    assert S[:, 1].tolist() == [2.0, 1, 0.5, 2, 3, 4 * BS, 4 / 100, 5, 6, 7]


def test_an_extension_missing_a_pass_is_not_used(fresh_python) -> None:
    """An install not rebuilt since a pass was added: the Python passes run."""
    code = (
        "from harness.engine import fastsim as f; print(f.HAVE_C, f.ArrayEngine._sample.__name__)"
    )
    assert fresh_python(code, stale=("harness.engine._rows", "finish")) == ["False", "_sample_py"]


def test_an_extension_built_before_a_pass_changed_is_not_used(fresh_python) -> None:
    """An install whose passes all exist but one's arguments changed since (``_rows._ABI``
    older than fastsim's): the Python passes run, none is called with what it does not take."""
    code = (
        "import sys, types, importlib; real = importlib.import_module('harness.engine._rows');"
        "old = types.ModuleType('harness.engine._rows'); old.__dict__.update("
        "{k: v for k, v in vars(real).items() if k != '_ABI'});"
        "sys.modules['harness.engine._rows'] = old; sys.modules['harness.engine']._rows = old;"
        "from harness.engine import fastsim as f; print(f.HAVE_C, real._ABI == f._ROWS_ABI)"
    )
    assert fresh_python(code) == ["False", "True"]


def test_bad_input_raises_and_writes_nothing() -> None:
    from harness.engine import _rows

    eng = _engine(np.random.default_rng(3))
    rows = eng.rows
    IA, FA = eng.IA, eng.FA
    with pytest.raises(ValueError, match="shapes"):
        _rows.finish(IA[:4].copy(), FA, eng.R, BS, rows.state, rows.Orow, rows.first, rows.last)
    with pytest.raises(ValueError, match="shapes"):
        _rows.finish(IA, FA, 0, BS, rows.state, rows.Orow[:-1], rows.first, rows.last)
    with pytest.raises(ValueError, match="running count"):
        _rows.finish(IA, FA, IA.shape[1] + 1, BS, rows.state, rows.Orow, rows.first, rows.last)
    with pytest.raises(TypeError, match="int64"):
        _rows.finish(IA.astype(np.int32), FA, 0, BS, rows.state, rows.Orow, rows.first, rows.last)
    with pytest.raises(TypeError, match="float64"):  # the right size, the wrong type
        _rows.finish(IA, IA[:4].copy(), 0, BS, rows.state, rows.Orow, rows.first, rows.last)
    with pytest.raises(TypeError, match="int8"):
        _rows.finish(IA, FA, 0, BS, rows.state.astype(np.uint8), rows.Orow, rows.first, rows.last)
    out = np.zeros(4 * IA.shape[1], dtype=np.int32)
    with pytest.raises(ValueError, match="block size"):
        _rows.decode(IA, FA, 0, 1, 1.0, 0, out, 0)
    with pytest.raises(ValueError, match="running count"):
        _rows.decode(IA, FA, IA.shape[1] + 1, 1, 1.0, BS, out, 0)
    with pytest.raises(ValueError, match="steps must be positive"):
        _rows.decode(IA, FA, 0, 0, 1.0, BS, out, 0)
    with pytest.raises(ValueError, match="room"):  # k steps of every running row past its end
        _rows.decode(IA, FA, IA.shape[1], 5, 1.0, BS, out, 0)
    with pytest.raises(TypeError, match="int32"):
        _rows.decode(IA, FA, 0, 1, 1.0, BS, out.astype(np.int64), 0)
    with pytest.raises(ValueError, match="5 rows"):
        _rows.opening(IA, IA.shape[1] + 1, BS)
    with pytest.raises(ValueError, match="block size"):
        _rows.opening(IA, 0, 0)
    with pytest.raises(TypeError, match="int64"):
        _rows.blocks(FA[0], BS)
    with pytest.raises(ValueError, match="block size"):
        _rows.blocks(IA[2], -1)
    # a finished request whose trace row is out of range: an error, nothing retired
    IA[1, 0], IA[3, 0], IA[4, 0] = 5, 5, len(rows.state)
    R = max(eng.R, 1)
    before = (IA.copy(), FA.copy(), rows.state.copy())
    with pytest.raises(IndexError):
        _rows.finish(IA, FA, R, BS, rows.state, rows.Orow, rows.first, rows.last)
    np.testing.assert_array_equal(IA, before[0])
    np.testing.assert_array_equal(rows.state, before[2])
    # give: a position past the arrays, or an item that is not a tuple; nothing written
    log = np.zeros(4, np.int32)
    with pytest.raises(IndexError):
        _rows.give(IA, FA, [(0, 1), (IA.shape[1], 1)], 1.0, log, 0)
    with pytest.raises(TypeError):
        _rows.give(IA, FA, [(0, 1), [1, 1]], 1.0, log, 0)
    with pytest.raises(ValueError, match="room"):
        _rows.give(IA, FA, [(0, 1), (1, 1)], 1.0, log, 3)
    np.testing.assert_array_equal(IA, before[0])
    np.testing.assert_array_equal(FA, before[1])
    # read-only arrays are refused (the passes write in place)
    ro = IA.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _rows.decode(ro, FA, 0, 1, 1.0, BS, np.zeros(4, dtype=np.int32), 0)
    out_ro = np.zeros(IA.shape[1], dtype=np.int32)
    out_ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _rows.decode(IA, FA, 1, 1, 1.0, BS, out_ro, 0)
    np.testing.assert_array_equal(IA, before[0])  # nothing decoded


def _models_in_c() -> list:
    """``(model, step_terms(model))`` for every preset the C step time covers, an affine model
    with a floor and a context model with each term switched on."""
    from harness.engine.costmodel import AffineCostModel, ContextCostModel, presets, step_terms

    got = [get_cost_model(name) for name in presets()]
    got.append(AffineCostModel(base_s=1e-3, per_token_s=3e-5, per_decode_s=2e-5, floor_s=5e-3))
    got.append(
        ContextCostModel(
            base_s=1.5e-3,
            per_token_s=6e-5,
            per_decode_s=1e-5,
            per_kv_s=4e-7,
            per_kv_lo_s=2.5e-7,
            kv_sat_batch=8,
            floor_s=9e-3,
            per_prefill_attn_s=3e-9,
            per_prefill_step_s=4e-3,
        )
    )
    return [(m, terms) for m in got if (terms := step_terms(m)) is not None]


@pytest.mark.parametrize("seed", range(3))
def test_step_time_is_the_cost_models_float(seed: int) -> None:
    """``_rows.step_time`` gives each affine or context model's ``step_time``, bit for bit:
    prefill or not, decode counts within and past the rate table, steps under the floor."""
    from harness.engine import _rows

    rng = np.random.default_rng(seed)
    models = _models_in_c()
    for model, terms in models:
        for _ in range(3000):
            P = int(rng.integers(1, 9000)) if rng.random() < 0.5 else 0
            D = int(rng.integers(0, 400)) if rng.random() < 0.9 else 0
            K = int(rng.integers(0, 1 << 22))
            A = float(rng.random() * P * 4000) if P else 0.0
            want = (
                model.step_time(P, D, K, prefill_attn=A)
                if model.uses_prefill_attn
                else model.step_time(P, D, K)
            )
            got = _rows.step_time(*terms, P, D, K, A)
            assert type(got) is float and got == want, (model.name, P, D, K, A)
    assert len(models) >= 6  # the context and affine presets and the two above


@pytest.mark.parametrize("seed", range(3))
def test_run_ends_are_decode_run_ends_floats(seed: int) -> None:
    """``_rows.run_ends`` gives :func:`core.decode_run_ends`'s ends, bit for bit: short runs
    (its scalar loop) and long ones (its cumsum), cut by ``until`` or by ``k_max``."""
    from harness.engine import _rows
    from harness.engine.core import decode_run_ends

    rng = np.random.default_rng(seed)
    cut = whole = 0
    for model, terms in _models_in_c():
        for _ in range(600):
            now = float(rng.random() * 1e3)
            k_max = int(rng.choice([2, 3, 31, 32, 33, 200, 3000]))
            D = int(rng.integers(1, 400))
            K = int(rng.integers(0, 1 << 22))
            until = now + float(rng.choice([0.0, rng.random() * 0.05, rng.random() * 20, 1e9]))
            if rng.random() < 0.3:  # a step that would start exactly at until: not run
                whole_run = decode_run_ends(model, now, k_max, D, K, 1e18).tolist()
                until = whole_run[int(rng.integers(0, len(whole_run)))]
            want = decode_run_ends(model, now, k_max, D, K, until).tolist()
            got = _rows.run_ends(*terms, now, k_max, D, K, until)
            assert type(got) is list and got == want, (model.name, now, k_max, D, K, until)
            cut += len(got) < k_max
            whole += len(got) == k_max
    assert cut > 100 and whole > 100  # both bounds were met


def test_step_terms_only_for_the_models_whose_arithmetic_is_known() -> None:
    from harness.engine.costmodel import (
        AffineCostModel,
        ContextCostModel,
        JitteredCostModel,
        step_terms,
    )

    class Slower(ContextCostModel):
        def step_time(self, *a, **k):  # type: ignore[no-untyped-def]
            return 2 * super().step_time(*a, **k)

    class SlowerRuns(AffineCostModel):
        def decode_affine(self, decode_seqs: int) -> tuple[float, float]:
            fixed, rate = super().decode_affine(decode_seqs)
            return 2 * fixed, rate

    class Batched(AffineCostModel):
        def _kv_rate_of(self, decode_seqs: int) -> float:
            return self.per_kv_s / max(1, decode_seqs)

    class NoAttention(ContextCostModel):
        uses_prefill_attn = False  # the kernel then passes no attention work

    assert step_terms(get_cost_model("staircase")) is None
    assert step_terms(get_cost_model("piecewise")) is None
    base = get_cost_model("a100-llama2-7b")
    assert step_terms(JitteredCostModel(base, [1.0, 1.1], [0.9, 1.0])) is None
    assert step_terms(Slower()) is None
    assert step_terms(SlowerRuns(base_s=1e-3)) is None
    assert step_terms(Batched(base_s=1e-3)) is None
    assert step_terms(NoAttention()) is None
    assert step_terms(AffineCostModel(base_s=float("nan"))) is None
    assert step_terms(AffineCostModel(base_s=float("inf"))) is None
    assert step_terms(AffineCostModel(base_s=1)) is None  # an int: Python's int arithmetic
    coef, table = step_terms(AffineCostModel(base_s=1e-3, per_kv_s=2e-7))
    assert coef == (1e-3, 0.0, 0.0, 0.0) and table == (2e-7,)
    coef, table = step_terms(base)
    assert len(coef) == 6 and len(table) == base.kv_sat_batch + 1


def test_the_engine_times_its_steps_in_c_only_for_those_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.engine.costmodel import JitteredCostModel

    monkeypatch.setattr(ArrayEngine, "_step_time_in_c", True)  # (also under the pure kernel)

    def engine(model):  # type: ignore[no-untyped-def]
        cfg = EngineConfig(kv_tokens=1 << 16, token_budget=512, max_num_seqs=8, block_size=BS)
        return ArrayEngine(512, cfg, model, Rows([5], [5]), ChunkLog(None, 1 << 20), 1)

    base = get_cost_model("a100-llama2-7b")
    fast = engine(base)
    assert fast._step_time.func.__name__ == "step_time"  # the C function, its terms bound
    assert fast._step_time(100, 3, 900, 6000.0) == base.step_time(100, 3, 900, prefill_attn=6000.0)
    assert fast._run_end_times.func.__name__ == "run_ends"
    assert fast._chunks.func.__name__ == "prefill_chunks"
    jittered = engine(JitteredCostModel(base, [1.0, 1.1], [0.9, 1.0]))
    assert jittered._chunks is None
    assert jittered._step_time.__func__ is ArrayEngine._step_time
    assert jittered._run_end_times.__func__ is ArrayEngine._run_end_times


def test_step_time_refuses_bad_input() -> None:
    from harness.engine import _rows
    from harness.engine.costmodel import step_terms

    coef, table = step_terms(get_cost_model("a100-llama2-7b"))
    assert _rows.step_time(coef, table, 1, 2, 3, 0.5) > 0
    with pytest.raises(TypeError, match="6 arguments"):
        _rows.step_time(coef, table, 1, 2, 3)
    with pytest.raises(TypeError, match="4 or 6"):
        _rows.step_time(coef[:5], table, 1, 2, 3, 0.0)
    with pytest.raises(TypeError, match="4 or 6"):
        _rows.step_time(list(coef), table, 1, 2, 3, 0.0)
    with pytest.raises(TypeError, match="4 or 6"):
        _rows.step_time(coef, (), 1, 2, 3, 0.0)
    with pytest.raises(TypeError, match="floats"):
        _rows.step_time((1, 2.0, 3.0, 4.0), table, 1, 2, 3, 0.0)
    with pytest.raises(TypeError, match="floats"):
        _rows.step_time(coef, (1,), 1, 2, 3, 0.0)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        _rows.step_time(coef, table, -1, 2, 3, 0.0)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        _rows.step_time(coef, table, 1, 2, 1 << 53, 0.0)
    with pytest.raises(TypeError):
        _rows.step_time(coef, table, 1.5, 2, 3, 0.0)
    with pytest.raises(TypeError):
        _rows.step_time(coef, table, 1, 2, 3, "x")
    assert _rows.run_ends(coef, table, 0.0, 3, 2, 10, 1e9) == decode_run_ends_of(coef, table)
    with pytest.raises(TypeError, match="7 arguments"):
        _rows.run_ends(coef, table, 0.0, 3, 2, 10)
    with pytest.raises(ValueError, match="at least 1"):
        _rows.run_ends(coef, table, 0.0, 0, 2, 10, 1e9)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        _rows.run_ends(coef, table, 0.0, 3, -2, 10, 1e9)
    with pytest.raises(TypeError, match="4 or 6"):
        _rows.run_ends((), table, 0.0, 3, 2, 10, 1e9)
    with pytest.raises(TypeError):
        _rows.run_ends(coef, table, "now", 3, 2, 10, 1e9)
    with pytest.raises(OverflowError, match="2\\*\\*53"):  # K + j * D would not be exact
        _rows.run_ends(coef, table, 0.0, 1 << 20, 1 << 40, 10, 1e9)
    assert len(_rows.run_ends(coef, table, 0.0, 2, (1 << 52), (1 << 52) - 1, 1e300)) == 2


def test_the_stale_build_check_names_every_pass() -> None:
    """fastsim._PASSES lists every function of the extension, so an install built before
    one was added is not half used (the module's docstring)."""
    from harness.engine import _rows

    public = {n for n in dir(_rows) if not n.startswith("_")}
    assert public == set(fastsim._PASSES)


def decode_run_ends_of(coef: tuple, table: tuple) -> list[float]:
    """The three-step run of 2 decodes from 10 KV tokens at 0.0, by hand."""
    fixed = max(coef[3], coef[0] + coef[1] * 2 + coef[2] * 2)
    acc, out = 0.0, []
    for j in range(3):
        acc += fixed + table[2] * (10 + 2 * j)
        out.append(0.0 + acc)
    return out
