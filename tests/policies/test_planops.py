"""The column policies' per-decode passes give the same answers in C as in numpy (issue 13).

:mod:`harness.policies.planops` defines ten passes in numpy (SLAI's Eq. 8 deadlines with
their per-key cache and its ranked run order, WAIT's (type, stage) quota check, Nested WAIT's
stage groups, whether they hold until they empty, and its memory guard's blocks, MC-SF's
reached estimates and sum of peaks by key, RAD's "arrivals ascend" and its decode batch
oldest first) and runs them in C where
the optional extension ``harness.policies._planops`` was built. Here each C function meets its
numpy definition on random columns (return values, and every array the pass writes); whole
simulations of the policies that use them give the same token times and counters with either
set; the environment variable selects them; and the C code refuses bad input without writing.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import simulate
from harness.policies import make_policy, planops
from harness.policies.nested_wait import NestedWaitPolicy

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not planops.HAVE_C,
        reason="the C extension harness.policies._planops is not built (no C compiler at install)",
    ),
]

_NONE = np.zeros(0, dtype=np.int64)

PASSES = planops._PASSES  # every pass the module defines, in its order


def _c(name: str):
    from harness.policies import _planops

    return getattr(_planops, name)


def _py(name: str):
    return getattr(planops, f"{name}_py")


def _call_with(fn, args: list, i: int, value) -> None:
    """``fn(*args)`` with argument ``i`` replaced by ``value`` (one bad argument a call)."""
    fn(*[value if j == i else a for j, a in enumerate(args)])


def _positions(rng: np.random.Generator, R: int) -> np.ndarray | None:
    """None (every request), or a sorted or shuffled subset of 0..R-1."""
    if rng.random() < 0.3:
        return None
    pos = np.flatnonzero(rng.random(R) < 0.6)
    if rng.random() < 0.5:
        rng.shuffle(pos)
    return pos


@pytest.mark.parametrize("seed", range(60))
def test_deadlines_match_the_numpy_pass(seed: int) -> None:
    rng = np.random.default_rng(seed)
    R, K = int(rng.integers(0, 200)), 400
    key = rng.choice(K, size=R, replace=False).astype(np.int64)
    last = np.round(rng.uniform(0, 5, R), 3)
    tbt = rng.choice([0.1, 0.5, np.nan], size=R)
    cache_e = np.full(K, np.nan)
    cache_v = rng.uniform(0, 5, K)
    hit = rng.random(R) < (0.0 if seed % 4 == 0 else 1.0 if seed % 4 == 1 else 0.5)
    cache_e[key[hit]] = last[hit]  # deferred since their deadline was set: the cached value
    pos = _positions(rng, R)
    n = R if pos is None else len(pos)
    shift, now = float(rng.uniform(0, 0.3)), float(rng.uniform(0, 5))
    results = []
    for fn in (_c("deadlines"), _py("deadlines")):
        e, v, out = cache_e.copy(), cache_v.copy(), np.full(n + 2, -1.0)
        crit = fn(key, last, tbt, pos, e, v, 0.2, shift, now, out)
        results.append((crit, e, v, out))
    (ca, ea, va, oa), (cb, eb, vb, ob) = results
    assert ca == cb
    np.testing.assert_array_equal(oa, ob)  # bit for bit, NaN where NaN, the tail untouched
    np.testing.assert_array_equal(ea, eb)
    np.testing.assert_array_equal(va, vb)


@pytest.mark.parametrize("seed", range(60))
def test_type_stages_matches_the_numpy_pass(seed: int) -> None:
    rng = np.random.default_rng(seed)
    R, K, m = int(rng.integers(0, 120)), 300, int(rng.integers(1, 6))
    output = rng.integers(0, 6 if seed % 2 else 200, R).astype(np.int64)  # few stages: groups
    key = rng.choice(K, size=R, replace=False).astype(np.int64)
    type_k = rng.integers(0, m, K).astype(np.int64)
    if seed % 5 == 0 and R:
        type_k[key[int(rng.integers(0, R))]] = -1  # a newcomer whose type is not known yet
    quota = rng.integers(1, 4, m).astype(np.int64)
    pos = _positions(rng, R)
    got = _c("type_stages")(output, key, pos, type_k, quota)
    assert got == _py("type_stages")(output, key, pos, type_k, quota)
    assert got in (-1, 0, 1)


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("ahead", [0, 1, 2, 3])
def test_stage_groups_match_the_numpy_pass(seed: int, ahead: int) -> None:
    rng = np.random.default_rng(seed)
    pol = NestedWaitPolicy(
        edges=(10, 30, 60) if seed % 2 else (100, 200, 400, 800),
        thresholds=(4, 2, 1) if seed % 2 else (8, 4, 2, 1),
    )
    R = int(rng.integers(0, 150))
    output = rng.integers(0, 90 if seed % 2 else 1000, R).astype(np.int64)  # past the last edge
    max_tokens = output + rng.integers(1, 60 if seed % 3 else 5, R)
    pos = _positions(rng, R)
    args = (output, max_tokens, pos, pol._n_stage, pol._seg_a, pol._min_n, ahead)
    got = _c("stage_groups")(*args)
    assert got == _py("stage_groups")(*args)
    assert got in (0, 1) or (got & 2 and ahead & 1) or (got & 4 and ahead & 2)
    if got and ahead & 2:  # the promise's bit is stage_groups_hold's answer
        hold = _c("stage_groups_hold")(output, max_tokens, pos, _NONE, pol._seg_a, pol._min_n)
        assert bool(got & 4) is hold


def _groups_hold_stepwise(output, max_tokens, pos, entering, pol: NestedWaitPolicy) -> bool:
    """The promise's condition by brute force: step the groups one token at a time (all
    decode, finished ones leave) and count each stage's members against its n_i."""
    k = np.r_[output if pos is None else output[pos], np.zeros(len(entering), np.int64)]
    left = np.r_[(max_tokens - output) if pos is None else (max_tokens - output)[pos], entering]
    while True:
        k, left = k + 1, left - 1
        alive = left > 0
        k, left = k[alive], left[alive]
        if not len(k):
            return True
        stages, counts = np.unique(k, return_counts=True)
        if (counts > [pol.thresholds[pol.segment_of(int(x))] for x in stages]).any():
            return False


@pytest.mark.parametrize("seed", range(80))
def test_stage_groups_hold_match_the_numpy_pass_and_stepping(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pol = NestedWaitPolicy(
        edges=(10, 30, 60) if seed % 2 else (100, 200, 400, 800),
        thresholds=(4, 2, 1) if seed % 2 else (8, 4, 2, 1),
    )
    R = int(rng.integers(0, 40 if seed % 4 else 80))  # some with more grouped than 32 (qsort)
    # few stages make groups; some past the last edge; some finishing this step (1 left)
    output = rng.integers(0, 6 if seed % 3 else 900, R).astype(np.int64)
    max_tokens = output + rng.integers(1, 90 if seed % 5 else 3, R)
    pos = _positions(rng, R)
    entering = rng.integers(1, 90, int(rng.integers(0, 6))).astype(np.int64)
    args = (output, max_tokens, pos, entering, pol._seg_a, pol._min_n)
    got = _c("stage_groups_hold")(*args)
    assert got is _py("stage_groups_hold")(*args)
    assert got is _groups_hold_stepwise(output, max_tokens, pos, entering, pol)


def test_stage_groups_hold_answers_both_ways() -> None:
    # the random cases above are not all one answer
    pol = NestedWaitPolicy(edges=(10, 30, 60), thresholds=(4, 2, 1))
    out, none = np.array([5, 5], dtype=np.int64), np.zeros(0, dtype=np.int64)
    hold = _c("stage_groups_hold")
    # two at stage 5: in segment 1 (n=4) up to stage 9, segment 2 (n=2) up to 29, then n=1
    assert hold(out, np.array([30, 40], dtype=np.int64), None, none, pol._seg_a, pol._min_n)
    assert not hold(out, np.array([32, 40], dtype=np.int64), None, none, pol._seg_a, pol._min_n)
    # three entering at stage 0: the third outgrows segment 2's n=2 at stage 10 unless it
    # finishes first (10 tokens: stages 1..9); the second, segment 3's n=1 at stage 30
    three = np.array([10, 20, 40], dtype=np.int64)
    assert hold(none, none, None, three, pol._seg_a, pol._min_n)
    assert not hold(none, none, None, three + 1, pol._seg_a, pol._min_n)


@pytest.mark.parametrize("seed", range(40))
def test_segment_blocks_match_the_numpy_pass(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pol = NestedWaitPolicy()
    R = int(rng.integers(0, 200))
    prompt = rng.integers(1, 3000, R).astype(np.int64)
    output = rng.integers(0, 3000, R).astype(np.int64)
    bs = int(rng.choice([1, 16, 32]))
    args = (prompt, output, pol._seg_a, pol._edge_a, bs)
    assert _c("segment_blocks")(*args) == _py("segment_blocks")(*args)


@pytest.mark.parametrize("seed", range(20))
def test_arrays_and_other_buffers_read_alike(seed: int) -> None:
    """A plain ndarray is read directly where the build had numpy's headers; any other
    buffer (a memoryview, an ndarray subclass, a byte-swapped or strided array) goes through
    the buffer protocol: the same answers, the same refusals."""
    rng = np.random.default_rng(seed)
    pol = NestedWaitPolicy(edges=(10, 20, 40), thresholds=(6, 3, 1))
    R = int(rng.integers(1, 300))
    output = rng.integers(0, 60, R).astype(np.int64) % int(rng.integers(1, 8))
    mx = output + rng.integers(1, 80, R)
    prompt = rng.integers(1, 3000, R).astype(np.int64)

    class Sub(np.ndarray):
        pass

    for view in (memoryview, lambda a: a.view(Sub)):
        for ahead in range(4):
            args = (output, mx, None, pol._n_stage, pol._seg_a, pol._min_n, ahead)
            other = tuple(view(a) if isinstance(a, np.ndarray) else a for a in args)
            assert _c("stage_groups")(*other) == _c("stage_groups")(*args)
        args = (prompt, output, pol._seg_a, pol._edge_a, 16)
        other = tuple(view(a) if isinstance(a, np.ndarray) else a for a in args)
        assert _c("segment_blocks")(*other) == _c("segment_blocks")(*args)
    with pytest.raises(TypeError, match="int64"):
        _c("segment_blocks")(prompt.astype(">i8"), output, pol._seg_a, pol._edge_a, 16)
    with pytest.raises(ValueError, match="contiguous"):
        _c("segment_blocks")(np.repeat(prompt, 2)[::2], output, pol._seg_a, pol._edge_a, 16)


@pytest.mark.parametrize("seed", range(40))
def test_keyed_passes_match_the_numpy_ones(seed: int) -> None:
    rng = np.random.default_rng(seed)
    R, K = int(rng.integers(0, 200)), 500
    key = rng.choice(K, size=R, replace=False).astype(np.int64)
    table = rng.integers(0, 300, K).astype(np.int64)
    values = rng.integers(0, 300, R).astype(np.int64)
    reached = _c("keyed_reached")(values, key, table)
    assert reached == _py("keyed_reached")(values, key, table)
    assert _c("keyed_sum")(key, table) == _py("keyed_sum")(key, table)


@pytest.mark.parametrize("seed", range(40))
def test_ranked_order_matches_the_numpy_one(seed: int) -> None:
    """SLAI's run order: ties in the deadlines (broken by arrival, then running order), NaN
    deadlines (last, as numpy sorts them), more decodes than the C code's stack holds, the
    partial prefills' tokens as one int or an array."""
    rng = np.random.default_rng(seed)
    R = int(rng.integers(1, 600 if seed % 5 == 0 else 140))
    nd = int(rng.integers(1, R + 1))
    decodes = np.sort(rng.choice(R, nd, replace=False)).astype(np.int64)
    if seed % 2:
        rng.shuffle(decodes)
    lst = np.round(rng.random(nd) * 4) / 4  # many ties
    if seed % 3 == 0:
        lst[rng.random(nd) < 0.2] = np.nan
    arrival = np.round(rng.random(R) * 3) / 3
    ncrit = int(rng.integers(0, nd + 1))
    nc, nn = int(rng.integers(0, ncrit + 1)), int(rng.integers(0, nd - ncrit + 1))
    rest = np.setdiff1d(np.arange(R), decodes)
    part = rest[: int(rng.integers(0, min(3, len(rest)) + 1))].astype(np.int64)
    got = int(rng.integers(1, 500)) if seed % 4 else rng.integers(1, 500, len(part))
    n = nc + len(part) + nn
    outs = []
    for impl in (_c, _py):
        order, tok = np.full(n, -7, np.int64), np.full(n, -7, np.int64)
        assert (
            impl("ranked_order")(decodes, lst, arrival, part, got, nc, ncrit, nn, order, tok)
            is None
        )
        outs.append((order, tok))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("seed", range(12))
def test_ascending_matches_the_numpy_one(seed: int) -> None:
    """Sorted, with ties, one step down anywhere, a NaN anywhere, empty and single columns."""
    rng = np.random.default_rng(seed)
    for n in (0, 1, 2, 3, 50, 300):
        base = np.sort(np.round(rng.random(n) * 20) / 4)  # ties
        cases = [base]
        if n >= 2:
            down = base.copy()
            i = int(rng.integers(0, n - 1))
            down[i], down[i + 1] = down[i + 1] + 1.0, down[i]
            nan = base.copy()
            nan[int(rng.integers(0, n))] = np.nan
            cases += [down, nan, base[::-1].copy()]
        for v in cases:
            assert _c("ascending")(v) is _py("ascending")(v)


def test_ascending_at_the_float_lines_edges() -> None:
    inf = np.inf
    for v in (
        [-0.0, 0.0],
        [0.0, -0.0],
        [-inf, -1.0, inf],
        [inf, inf],
        [-1.0, -2.0],
        [-inf],
        [5e-324, -5e-324],
        [-5e-324, 0.0, 5e-324],
        [np.nan],
        [-inf, np.nan],
    ):
        a = np.array(v)
        assert _c("ascending")(a) is _py("ascending")(a), v


def test_ascending_refuses_other_columns() -> None:
    with pytest.raises(TypeError, match="float64"):
        _c("ascending")(np.arange(3, dtype=np.int64))
    with pytest.raises(ValueError, match="contiguous"):
        _c("ascending")(np.zeros(6)[::2])
    for other in (np.array(3.0), np.zeros((2, 2))):
        with pytest.raises(ValueError, match="1-D"):
            _c("ascending")(other)


@pytest.mark.parametrize("seed", range(40))
def test_oldest_decoding_matches_the_numpy_one(seed: int) -> None:
    """Decoding and prefilling requests mixed, arrivals with ties (a stable sort keeps their
    running order), -0.0 beside 0.0, a NaN (last, as numpy sorts), and sizes on both sides of
    the C code's insertion sort (12) and its stack buffer (256)."""
    rng = np.random.default_rng(seed)
    R = int(rng.choice([0, 1, 2, 5, 12, 13, 40, 256, 257, 600]))
    prompt = rng.integers(1, 50, R).astype(np.int64)
    output = rng.integers(0, 4, R).astype(np.int64)
    computed = prompt + output - 1  # decoding where output > 0
    later = rng.random(R) < 0.3
    computed[later] = (prompt[later] * rng.random(int(later.sum()))).astype(np.int64)  # not yet
    arrival = np.round(rng.random(R) * rng.choice([3, 1000])) / 2  # ties
    if R and seed % 4 == 1:
        arrival[int(rng.integers(0, R))] = np.nan
    if R > 1 and seed % 4 == 2:
        arrival[:2] = (-0.0, 0.0)
    outs = []
    for impl in (_c, _py):
        out = np.full(R + 3, -7, np.int64)
        m = impl("oldest_decoding")(prompt, output, computed, arrival, out)
        outs.append((m, out))
    assert outs[0][0] == outs[1][0]
    np.testing.assert_array_equal(outs[0][1], outs[1][1])  # past m: untouched by both


def test_oldest_decoding_refuses_bad_input_without_writing() -> None:
    od = _c("oldest_decoding")
    cols = [np.array([3, 4], np.int64), np.array([1, 1], np.int64), np.array([3, 4], np.int64)]
    arrival, out = np.array([1.0, 0.5]), np.full(2, -7, np.int64)
    assert od(*cols, arrival, out) == 2 and out.tolist() == [1, 0]
    out[:] = -7
    with pytest.raises(ValueError, match="length"):
        od(*cols, arrival, np.empty(1, np.int64))
    with pytest.raises(ValueError, match="length"):
        od(cols[0][:1], *cols[1:], arrival, out)
    with pytest.raises(TypeError, match="float64"):
        od(*cols, cols[0], out)
    with pytest.raises(TypeError, match="int64"):
        od(*cols, arrival, np.empty(2))
    with pytest.raises(ValueError, match="overlaps"):
        od(*cols, arrival, arrival.view(np.int64))  # out over arrival's bytes
    with pytest.raises(TypeError, match="5 arguments"):
        od(*cols, arrival)
    assert out.tolist() == [-7, -7]


def test_an_extension_without_every_pass_is_not_used(fresh_python) -> None:
    """An install built before a pass was added runs the numpy set, not a failing import."""
    code = "from harness.policies import planops as p; print(p.HAVE_C, p.ascending.__module__)"
    out = fresh_python(code, stale=("harness.policies._planops", "deadlines"))
    assert out == ["False", "harness.policies.planops"]


def test_ranked_order_refuses_bad_input_without_writing() -> None:
    ro = _c("ranked_order")
    decodes, lst = np.array([0, 2], dtype=np.int64), np.array([0.5, 0.1])
    arrival, part = np.zeros(4), np.array([3], dtype=np.int64)
    order, tok = np.full(4, -7, np.int64), np.full(4, -7, np.int64)
    args = [decodes, lst, arrival, part, 5, 1, 1, 1, order[:3], tok[:3]]

    def with_arg(i: int, value) -> None:
        _call_with(ro, args, i, value)

    with pytest.raises(TypeError, match="int64"):
        with_arg(0, decodes.astype(np.int32))
    with pytest.raises(TypeError, match="float64"):
        with_arg(1, lst.astype(np.float32))
    with pytest.raises(ValueError, match="lengths differ"):
        with_arg(1, lst[:1])
    with pytest.raises(ValueError, match="lengths differ"):
        with_arg(4, np.array([1, 2], dtype=np.int64))
    with pytest.raises(IndexError, match="position"):
        with_arg(0, np.array([0, 4], dtype=np.int64))
    for i, bad in ((5, 2), (6, 3), (7, 2), (5, -1), (8, order[:2]), (9, tok)):
        with pytest.raises(ValueError, match="counts"):
            with_arg(i, bad)
    with pytest.raises(ValueError, match="overlap"):
        with_arg(9, order[:3])
    with pytest.raises(ValueError, match="overlaps an input"):  # an output over an input
        ro(decodes, lst, arrival, order[:1], 5, 1, 1, 1, order[:3], tok[:3])
    frozen = tok[:3].copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        with_arg(9, frozen)
    with pytest.raises(TypeError, match="takes 10"):
        ro(*args[:9])
    assert (order == -7).all() and (tok == -7).all()
    ro(*args)  # the good call: decodes ranked by deadline, the critical one, the prefill, ...
    assert order[:3].tolist() == [2, 3, 0] and tok[:3].tolist() == [1, 5, 1]
    for counts, got in (((np.int64(1), np.int32(1), np.int64(1)), np.int64(6)), ((1, 1, 1), 6)):
        ro(decodes, lst, arrival, part, got, *counts, order[:3], tok[:3])  # numpy integers too
        assert order[:3].tolist() == [2, 3, 0] and tok[:3].tolist() == [1, 6, 1]


def _synthetic(n: int, rate: float, seed: int):
    from harness.workload import build_trace

    return build_trace(
        "synthetic",
        num_requests=n,
        rate=rate,
        seed=seed,
        quiet=True,
        input_len=200,
        output_len=150,
        range_ratio=0.9,
    )


@pytest.mark.parametrize(
    "policy, kw",
    [
        ("slai", {}),
        ("slai", {"prefill_order": "fcfs", "tier_priority": True, "max_decodes": 12}),
        # critical decodes past the decode cap, with admissions short of KV: ranked for them
        ("slai", {"max_decodes": 8, "offset_low": 50, "offset_high": 50}),
        ("wait", {}),
        ("wait", {"thresholds": (2, 1, 1, 1, 1)}),
        ("nested-wait", {}),
        ("nested-wait", {"edges": (40, 80, 160), "thresholds": (2, 1, 1)}),
        ("mcsf", {}),
        ("mcsf", {"noise_sigma": 0.5, "overrun_extra": 4}),
        ("rad", {}),
    ],
)
@pytest.mark.parametrize("kernel", ["auto", "core"])
@pytest.mark.parametrize("kv_tokens", [4000, 1 << 20])  # preemptions / none
def test_simulations_with_either_set_give_the_same_token_times(
    policy: str, kw: dict, kernel: str, kv_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    tr = _synthetic(300, 14.0, seed=5)
    cfg = EngineConfig(kv_tokens=kv_tokens, token_budget=512, max_num_seqs=48, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    runs, pols = [], []
    for impl in (_c, _py):
        for name in PASSES:
            monkeypatch.setattr(planops, name, impl(name))
        pol = make_policy(policy, **kw)
        runs.append(simulate(tr, pol, cost, cfg, kernel=kernel))
        pols.append(pol)
    a, b = runs
    assert a.num_steps == b.num_steps
    for field in ("status", "out_tokens", "first_s", "last_s", "chunk_req", "chunk_t"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.counters == b.counters
    assert vars(pols[0]).keys() == vars(pols[1]).keys()
    for name, value in vars(pols[0]).items():  # the policies' own counters
        if isinstance(value, int | float) and not isinstance(value, bool):
            assert value == vars(pols[1])[name], name


@pytest.mark.parametrize("value, expected", [("1", "py"), ("0", "c"), ("", "c")])
def test_the_environment_selects_the_passes(value: str, expected: str, fresh_python) -> None:
    code = (
        "from harness.policies import planops as p;"
        f"print(*[getattr(p, n).__module__ or 'c' for n in {PASSES!r}])"
    )
    out = fresh_python(code, HARNESS_PURE_PLANS=value)
    module = "harness.policies.planops" if expected == "py" else "harness.policies._planops"
    assert out == [module] * len(PASSES)


def test_bad_input_raises_and_writes_nothing() -> None:
    dl, ts, sg, sh, sb, kr, ks = (_c(n) for n in PASSES[:7])
    key = np.array([0, 1, 2], dtype=np.int64)
    last, tbt = np.array([1.0, 2.0, 3.0]), np.array([0.1, np.nan, 0.5])
    e, v, out = np.full(4, np.nan), np.zeros(4), np.zeros(3)
    args = [key, last, tbt, None, e, v, 0.2, 0.01, 2.0, out]

    def deadlines_with(i: int, value) -> None:
        _call_with(dl, args, i, value)

    with pytest.raises(TypeError, match="int64"):
        deadlines_with(0, key.astype(np.int32))
    with pytest.raises(TypeError, match="float64"):
        deadlines_with(1, last.astype(np.float32))
    with pytest.raises(ValueError, match="lengths differ"):
        deadlines_with(2, tbt[:2])
    with pytest.raises(IndexError, match="position"):
        deadlines_with(3, np.array([0, 3], dtype=np.int64))
    with pytest.raises(IndexError, match="key"):
        deadlines_with(0, np.array([0, 1, 4], dtype=np.int64))
    with pytest.raises(ValueError, match="out is shorter"):
        deadlines_with(9, np.zeros(2))
    ro = v.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        deadlines_with(5, ro)
    with pytest.raises(TypeError, match="takes 10"):
        dl(*args[:9])
    assert np.isnan(e).all() and not v.any() and not out.any()  # nothing written
    assert dl(*args) == 1  # the same call, well formed: (1 + 0.1) - 0.01 <= 2.0 only
    assert not np.isnan(e[:3]).any()

    out_, quota = np.array([3, 3, 4], dtype=np.int64), np.array([1, 2], dtype=np.int64)
    with pytest.raises(IndexError, match="key"):
        ts(out_, key, None, np.zeros(2, dtype=np.int64), quota)
    with pytest.raises(ValueError, match="type or stage"):
        ts(out_, key, None, np.full(3, 2, dtype=np.int64), quota)
    with pytest.raises(ValueError, match="lengths differ"):
        ts(out_[:2], key, None, np.zeros(3, dtype=np.int64), quota)
    assert ts(out_, key, None, np.zeros(3, dtype=np.int64), quota) == 0  # two at stage 3

    pol = NestedWaitPolicy(edges=(10, 20), thresholds=(2, 1))
    lim, seg, mn = pol._n_stage, pol._seg_a, pol._min_n
    mx = out_ + 5
    with pytest.raises(ValueError, match="shapes"):
        sg(out_, mx, None, lim, seg, mn.ravel(), True)
    with pytest.raises(ValueError, match="segment out of range"):
        sg(out_, mx, None, lim, seg + 5, mn, True)
    with pytest.raises(ValueError, match="negative stage"):
        sg(-out_, mx, None, lim, seg, mn, True)
    with pytest.raises(ValueError, match="no token left"):
        sg(out_, out_, None, lim, seg, mn, True)
    none = np.zeros(0, dtype=np.int64)
    with pytest.raises(ValueError, match="shapes"):
        sh(out_, mx, None, none, seg, mn.ravel())
    with pytest.raises(ValueError, match="segment out of range"):
        sh(out_, mx, None, none, seg + 5, mn)
    with pytest.raises(ValueError, match="negative stage"):
        sh(-out_, mx, None, none, seg, mn)
    with pytest.raises(ValueError, match="no token left"):
        sh(out_, out_, None, none, seg, mn)
    with pytest.raises(ValueError, match="no token left"):
        sh(out_, mx, None, np.array([0], dtype=np.int64), seg, mn)
    with pytest.raises(IndexError, match="position"):
        sh(out_, mx, np.array([3], dtype=np.int64), none, seg, mn)
    with pytest.raises(TypeError, match="int64"):
        sh(out_, mx, None, none.astype(np.int32), seg, mn)
    assert sh(out_, mx, None, none, seg, mn)  # two at stage 3 finish by stage 7 (n=2)
    assert not sh(out_, out_ + 8, None, none, seg, mn)  # ... or reach stage 10 (n=1)
    assert sh(out_[1:], out_[1:] + 8, None, none, seg, mn)  # one at stage 3
    with pytest.raises(ValueError, match="block size"):
        sb(out_, out_, seg, pol._edge_a, 0)
    with pytest.raises(ValueError, match="segment out of range"):
        sb(out_, out_, seg + 5, pol._edge_a, 16)
    with pytest.raises(IndexError, match="key"):
        kr(out_, np.array([0, 1, 9], dtype=np.int64), out_)
    with pytest.raises(ValueError, match="lengths differ"):
        kr(out_[:2], key, out_)
    with pytest.raises(IndexError, match="key"):
        ks(np.array([-1], dtype=np.int64), out_)
    with pytest.raises(TypeError, match="int64"):
        ks(key, out_.astype(np.float64))
