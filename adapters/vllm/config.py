"""Which harness policy the vLLM adapter hosts, and with which parameters.

Sources, highest precedence first:

1. vLLM's additional config: ``--additional-config '{"harness_policy": "wait",
   "harness_policy_params": {"...": 1}}'`` (travels inside ``VllmConfig``, so it reaches the
   engine-core process without environment plumbing).
2. Environment: ``HARNESS_POLICY`` (name) and ``HARNESS_POLICY_PARAMS`` (a JSON object).
3. Default ``vllm`` (the harness's model of vLLM v1's own scheduler).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_POLICY = "vllm"


class AdapterConfigError(ValueError):
    """A bad policy name or parameter JSON; the message says which setting is wrong."""


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    """The resolved policy name, its keyword parameters, and where they came from."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    source: str = "default"


def _parse_params(raw: Any, where: str) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise AdapterConfigError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(raw, Mapping):
        raise AdapterConfigError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    return dict(raw)


def resolve_policy(
    additional_config: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> PolicyChoice:
    """Resolve the policy from vLLM's additional config, then the environment, then the default."""
    env = os.environ if env is None else env
    extra = dict(additional_config or {})
    if extra.get("harness_policy"):
        return PolicyChoice(
            name=str(extra["harness_policy"]),
            params=_parse_params(
                extra.get("harness_policy_params"), "additional_config.harness_policy_params"
            ),
            source="additional_config",
        )
    if env.get("HARNESS_POLICY"):
        return PolicyChoice(
            name=env["HARNESS_POLICY"],
            params=_parse_params(env.get("HARNESS_POLICY_PARAMS"), "HARNESS_POLICY_PARAMS"),
            source="env",
        )
    return PolicyChoice(name=DEFAULT_POLICY, params={}, source="default")


def build_policy(choice: PolicyChoice) -> Any:
    """Instantiate the chosen policy from the harness registry, with a one-line error if unknown."""
    from harness.policies.registry import UnknownPolicyError, make_policy

    try:
        return make_policy(choice.name, **choice.params)
    except UnknownPolicyError as e:
        raise AdapterConfigError(str(e)) from None
    except TypeError as e:
        raise AdapterConfigError(f"policy {choice.name!r}: bad parameters ({e})") from None
