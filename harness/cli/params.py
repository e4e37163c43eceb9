"""``--param POLICY.NAME=VALUE``: parsed and checked against the policy registry, so that a
typo in a policy or parameter name is a one-line error listing the valid names instead of a
silently ignored setting or a Python ``TypeError`` (issue 14, point 4)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from typing import Annotated, Any

import typer


def parse_params(items: Iterable[str] | None) -> dict[str, dict[str, Any]]:
    """``["sarathi.order=spf"]`` -> ``{"sarathi": {"order": "spf"}}`` (values JSON when they
    parse, else strings). Raises ``ValueError`` naming the malformed item."""
    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        pol, dot, name = key.partition(".")
        if not sep or not dot or not pol or not name:
            raise ValueError(
                f"--param {item!r}: expected POLICY.NAME=VALUE (e.g. sarathi.order=spf)"
            )
        try:
            v: Any = json.loads(val)
        except ValueError:
            v = val
        out.setdefault(pol, {})[name] = v
    return out


def _accepted(cls: type) -> dict[str, inspect.Parameter] | None:
    """Keyword parameters of a policy's constructor, by name; None when it takes
    ``**kwargs``."""
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return None
    named = {}
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            named[p.name] = p
    return named


def check_params(params: dict[str, dict[str, Any]], policies: Iterable[str]) -> None:
    """Every ``--param`` names a policy of this run and a parameter that policy takes.

    Raises ``ValueError`` with one line listing the valid choices."""
    from harness.policies.registry import available, policy_class

    used = list(policies)
    known = available()
    for pol, kv in params.items():
        if pol not in known:
            raise ValueError(
                f"--param {pol}.{next(iter(kv))}: unknown policy {pol!r}; "
                f"choose from: {', '.join(known)}"
            )
        if pol not in used:
            raise ValueError(
                f"--param {pol}.{next(iter(kv))}: policy {pol!r} is not in this run "
                f"(--policy {','.join(used)})"
            )
        accepted = _accepted(policy_class(pol))
        if accepted is None:
            continue
        for name, value in kv.items():
            if name not in accepted:
                valid = ", ".join(accepted) or "(none)"
                raise ValueError(
                    f"--param {pol}.{name}: {pol} has no parameter {name!r}; valid: {valid}"
                )
            want = _wrong_kind(accepted[name], value)
            if want:
                raise ValueError(f"--param {pol}.{name}={value!r}: expected {want}")


def _wrong_kind(p: inspect.Parameter, value: Any) -> str | None:
    """What a scalar parameter takes, when ``value`` is not that (else None): a number
    (``null`` too where the default is None), or ``true``/``false``. Values parse as JSON,
    so ``none`` or ``1,5`` arrive as strings and would fail deep inside the policy."""
    default = p.default
    optional = str(p.annotation).replace(" ", "") in _NUMERIC_OPTIONAL
    numeric = optional or (isinstance(default, int | float) and not isinstance(default, bool))
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if numeric and not (is_number or (value is None and optional)):
        return "a number or null" if optional else "a number"
    if isinstance(default, bool) and not isinstance(value, bool):
        return "true or false"
    return None


_NUMERIC_OPTIONAL = {"float|None", "int|None", "Optional[float]", "Optional[int]"}


# Session options shared by `harness replay` and `harness simulate` (one declaration each).
SessionRate = Annotated[
    float | None, typer.Option(help="Sessions: arrivals per second (open loop).")
]
MaxActiveSessions = Annotated[
    int | None, typer.Option(help="Sessions: cap on sessions in progress.")
]
ThinkTime = Annotated[
    str | None,
    typer.Option(help="Sessions: think time, S | exp:MEAN | lognormal:MED:SIGMA | uniform:A:B"),
]
Patience = Annotated[
    float | None, typer.Option(help="Sessions: abandon when a call's TTFT exceeds S.")
]
MaxRetries = Annotated[int | None, typer.Option(help="Sessions: re-sends of a failed call.")]
RetryBackoff = Annotated[
    float | None, typer.Option(help="Sessions: first retry delay, s (doubles).")
]
MaxContext = Annotated[
    int | None, typer.Option(help="Sessions: model context, tokens (longer: not sent).")
]
