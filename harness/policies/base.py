"""The policy contract: the only thing a host and a scheduling policy share.

Every engine step a *host* (the discrete-event simulator, the built-in server, the vLLM or
SGLang adapter) builds a read-only :class:`View`, calls :meth:`Policy.schedule`, executes the
returned :class:`Plan` under the host semantics below, and reports the step back with
:meth:`Policy.on_step`. A policy never imports a host, so one implementation runs unchanged
in a simulated sweep and inside a GPU-backed vLLM server.

Token accounting follows vLLM v1 (anchors-engines.md §1.4): a request has ``num_tokens``
(prompt + generated output) and ``num_computed_tokens`` (tokens whose KV exists). A step
gives a request ``n <= num_tokens - num_computed_tokens`` tokens; when computed catches up
with ``num_tokens`` the request samples one new output token at the end of that step. So a
prefill chunk and a decode are the same operation, and recompute preemption is simply
``num_computed_tokens = 0`` (the re-prefill then covers prompt *and* generated output).

Host semantics (identical in every host; ``harness.engine.conformance`` tests them):

1. Apply ``plan.preempt`` in order: free the request's KV, set its computed tokens to 0,
   count a preemption, and put it at the front of ``waiting``.
2. Execute ``plan.run`` in order. Each item is clipped to the request's remaining tokens and to
   the budget left; KV blocks are allocated for it. When KV runs out the host preempts
   (recompute) from the *end of the run order* (the last-listed request still holding KV,
   possibly one already scheduled this step, possibly the requester itself) until the
   allocation fits.
3. If nothing was preempted in step 2, admit ``plan.admit`` in order while the token budget,
   ``max_num_seqs`` (requests holding KV) and KV allow; admission stops at the first item that
   does not fit (head-of-line, like vLLM).
4. Running requests not listed in ``plan.run`` are *paused*: they keep their KV.
5. The step's duration comes from the host (cost model or real GPU); then every scheduled
   request advances, samples a token if it caught up, and finishes at ``max_tokens``
   (ignore-EOS semantics), freeing its KV.

A plan that asks for more than the budget or caps is clipped, never exceeded.

Speed hints never change an answer: ``Plan.steady`` / ``Plan.hold`` let a host fast-forward
decode runs, and a policy whose plans are exactly the FCFS token-budget rule declares
:class:`BudgetRule` (``budget_rule()``) so a host may execute that rule by its own faster path.
A policy may also write its rule over the running set as arrays
(:class:`harness.policies.columns.ColumnPolicy`): its ``schedule`` is then derived from that,
and a host that keeps requests in arrays calls the column planner directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable


@runtime_checkable
class RequestView(Protocol):
    """What a policy may read about one request. Hosts expose their own objects through it.

    Policies must treat these objects as read-only; per-request policy state belongs in the
    policy (keyed by ``request_id``).
    """

    request_id: str
    arrival_s: float  # host clock, seconds
    num_prompt_tokens: int
    num_output_tokens: int  # generated so far
    num_computed_tokens: int  # tokens whose KV is held (0 after a recompute preemption)
    max_tokens: int  # the output length the request stops at (ignore-EOS)
    predicted_output_len: int | None  # known or predicted output length; None = unknown
    tier: str
    priority: int  # lower = more important (vLLM convention)
    ttft_slo_s: float | None
    tbt_slo_s: float | None
    first_token_s: float | None
    last_token_s: float | None
    num_preemptions: int

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated output tokens."""
        ...


def remaining_tokens(r: RequestView) -> int:
    """Tokens this request can be given in the next step (a decode is exactly 1)."""
    return r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens


def is_decoding(r: RequestView) -> bool:
    """True once the request has produced output and its KV covers everything but the last token."""
    return r.num_output_tokens > 0 and remaining_tokens(r) == 1


def prefill_remaining(r: RequestView) -> int:
    """Prompt (or recompute) tokens still to process before the next output token; 0 if decoding."""
    return 0 if is_decoding(r) else remaining_tokens(r)


class KVView(NamedTuple):
    """KV-cache state in blocks; token figures are derived so policies can think in tokens.

    (Immutable; a NamedTuple because a host builds one every step, issue 13.)"""

    block_size: int
    total_blocks: int
    used_blocks: int

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.total_blocks * self.block_size

    @property
    def free_tokens(self) -> int:
        return self.free_blocks * self.block_size

    @property
    def usage(self) -> float:
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens of KV."""
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class View:
    """The read-only state handed to :meth:`Policy.schedule` once per step."""

    now: float
    waiting: Sequence[RequestView]  # no KV held: new (arrival order) or preempted (front)
    running: Sequence[RequestView]  # holding KV: prefilling, decoding or paused
    kv: KVView
    token_budget: int  # max tokens in one step (vLLM max_num_batched_tokens)
    max_num_seqs: int  # max requests holding KV at once (vLLM max_num_seqs)
    last_step_s: float | None = None  # duration of the previous step, if any


@dataclass(slots=True)
class Plan:
    """An ordered step plan. Items are ``(request_id, tokens)``.

    ``run``: running requests to step (1 for a decode, n for a prefill chunk), in priority
    order (the tail is the first preemption victim). ``admit``: waiting requests to start,
    with the size of their first chunk. ``preempt``: running requests to evict first.

    ``steady``: the policy promises that, until the next arrival, finish or preemption, it
    would return exactly "every running request decodes one token, nothing else". The
    simulator may then fast-forward identical decode steps in closed form without calling
    the policy (seed-stability.md §2 makes such runs common under any work-conserving
    policy). Leave it False when unsure: it is only a speed hint.

    ``hold`` (with ``steady``): arrivals would not change the plan either (it ignores the
    waiting queue, e.g. FasterTransformer while anyone decodes), so the simulator may
    fast-forward past arrivals too, up to the next finish or KV boundary. Without ``steady``
    a host ignores it (a column plan's ``prefill_run`` or ``steady_decodes`` gives it a
    meaning of its own there, read only by the vectorised kernel).

    ``then_steady``: the policy promises that its plan for every following step, for as long
    as nothing arrives, nothing waits, every running request decodes (no prefill left),
    nothing is preempted, their next blocks fit and they fit the token budget (the host checks
    each of these), is "every running request decodes one token, nothing else" and
    ``steady`` (and again ``then_steady``), finishes or not. A simulator may then run those
    steps without calling the policy; it still hears of each step (``on_step``), unless
    the policy hears only of changes (:func:`hears_changes_only`). Another
    speed hint: a host may ignore it (the servers and adapters do), and a policy must leave
    it False unless nothing it keeps would make that plan differ.
    """

    run: list[tuple[str, int]] = field(default_factory=list)
    admit: list[tuple[str, int]] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    steady: bool = False
    hold: bool = False
    then_steady: bool = False


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """A policy's declaration that its plans are exactly the *FCFS token-budget rule*.

    The rule, under the host semantics above (rules 1-5), every step:

    * ``run``: every running request, decoding ones first (1 token each), then the others (a
      partial prefill or a recompute) in running order, each granted its remaining tokens
      clipped to the budget left (0 once it is spent: still listed, so KV preemption takes
      victims from the tail of this order); no ``preempt``;
    * ``admit``: ``waiting`` in the host's queue order (preempted first, then arrivals), each
      ``min(remaining, budget left)`` while budget and seats last (head-of-line on KV);
    * ``steady`` when every running request decodes and nobody is admitted.

    The budget is ``min(View.token_budget, budget)``. vLLM v1's default scheduler and FCFS
    Sarathi-Serve are this rule (anchors-engines.md §1.4; seed-stability.md §2.3). A host may
    execute a declared rule by a faster path of its own (the vectorised simulator kernel),
    without calling the policy's hooks, so only a policy whose ``schedule``, ``on_arrival``
    and ``on_step`` are the declaring class's (or no-ops) counts: see :func:`declared_rule`.
    """

    budget: int | None = None


def _owner(cls: type, attr: str) -> type | None:
    """The class in ``cls``'s MRO that defines ``attr``."""
    for k in cls.__mro__:
        if attr in vars(k):
            return k
    return None


def declared_rule(policy: object) -> BudgetRule | None:
    """The :class:`BudgetRule` ``policy`` declares through its ``budget_rule()`` hook, or None.

    A declaration counts only if it still describes the policy: a subclass that overrides
    ``schedule`` (or adds ``on_arrival`` / ``on_step`` behaviour) without declaring again
    inherits no rule, so it is planned through ``schedule`` like any other policy.
    """
    hook = getattr(policy, "budget_rule", None)
    if hook is None:
        return None
    rule = hook()
    if not isinstance(rule, BudgetRule):
        return None
    cls = type(policy)
    owner = _owner(cls, "budget_rule")
    for name in ("schedule", "on_arrival", "on_step"):
        o = _owner(cls, name)
        if o is not owner and o is not BasePolicy:
            return None
    return rule


class StepReport(NamedTuple):
    """What the host tells the policy (and telemetry) after each step or fast-forwarded run.

    ``num_steps > 1`` means the host fast-forwarded that many identical decode steps after a
    ``steady`` plan; token and time fields then cover all of them.

    Immutable, built once a step: a NamedTuple, which a host makes in ~0.3 µs (a frozen
    dataclass's ``__init__`` took ~3 µs, ~2% of a hooked policy's simulation, issue 13).
    """

    start_s: float
    duration_s: float
    num_steps: int
    prefill_tokens: int
    decode_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    kv_used_blocks: int
    preempted: tuple[str, ...] = ()
    admitted: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy. Construct with keyword parameters; hosts call the three hooks."""

    name: str

    def on_arrival(self, request: RequestView, now: float) -> None:
        """A request joined ``waiting`` (not called again after a preemption)."""

    def schedule(self, view: View) -> Plan:
        """Return this step's plan. Called once per step, never concurrently."""
        ...

    def on_step(self, report: StepReport) -> None:
        """The step (or fast-forwarded run of steps) just executed."""


_OnStep = Callable[[Any, "StepReport"], None]


def hears_changes_only(on_step: _OnStep) -> _OnStep:
    """Mark a policy's ``on_step`` as reading only a report's ``preempted``, ``admitted`` and
    ``finished`` ids, so that a host may skip the reports of steps where all three are empty
    (issue 13: the policy hears only of what changed; ~40% of RAD's reports). The mark
    belongs to the function: a subclass that overrides ``on_step`` hears every step again
    unless it marks its own. It covers what the marked ``on_step`` calls too (a waiting
    queue's ``on_step``): a subclass that swaps such a part for one reading other fields must
    override ``on_step`` unmarked."""
    on_step.hears_changes_only = True  # type: ignore[attr-defined]
    return on_step


def reports_changes_only(policy: object) -> bool:
    """Whether ``policy``'s ``on_step`` (its class's, or one set on the object) is marked
    :func:`hears_changes_only`."""
    return getattr(getattr(policy, "on_step", None), "hears_changes_only", False) is True


class BasePolicy:
    """Convenience base: no-op hooks and parameter echo for run.json. Subclassing is optional."""

    name: str = "base"

    def on_arrival(self, request: RequestView, now: float) -> None:  # noqa: D102
        return None

    def schedule(self, view: View) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_step(self, report: StepReport) -> None:  # noqa: D102
        return None

    def budget_rule(self) -> BudgetRule | None:
        """Optional speed hint: the :class:`BudgetRule` this policy's plans follow, or None."""
        return None

    def params(self) -> dict[str, Any]:
        """Parameters worth recording in run.json (public attributes by default)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}
