"""Host-agnostic scheduling policies. Every built-in module is imported here, once."""

from harness.policies import (  # noqa: F401
    class_priority,
    fastertransformer,
    mcsf,
    mcsf_baselines,
    nested_wait,
    orca,
    rad,
    sarathi,
    slai,
    vllm_v0,
    vllm_v1,
    wait,
)
from harness.policies.base import (
    BasePolicy,
    KVView,
    Plan,
    Policy,
    RequestView,
    StepReport,
    View,
)
from harness.policies.registry import available, make_policy, register

__all__ = [
    "BasePolicy",
    "KVView",
    "Plan",
    "Policy",
    "RequestView",
    "StepReport",
    "View",
    "available",
    "make_policy",
    "register",
]
