"""Rollout request scheduling inside the rollout pool.

Pure policy, no Ray: request model (:mod:`.requests`), radix prefix index (:mod:`.radix`),
stage-1 resource budget (:mod:`.budget`), cold-start switch (:mod:`.coldstart`), policies
``fifo`` / ``prefix`` / ``mixed`` (:mod:`.policies`) and the scheduler (:mod:`.scheduler`).
Engines live in ``actors.rollout.engine``.
"""

from rollmux.rollout_sched.budget import EngineState, ResourceBudget, WindowBudget
from rollmux.rollout_sched.coldstart import ColdStartController
from rollmux.rollout_sched.config import (
    BudgetConfig,
    ColdStartConfig,
    IndexConfig,
    RolloutSchedConfig,
    SchedProfile,
    load_rollout_sched_config,
)
from rollmux.rollout_sched.policies import POLICIES, SchedulingPolicy, make_policy, register_policy
from rollmux.rollout_sched.radix import RadixPrefixIndex
from rollmux.rollout_sched.requests import Completion, Request, RequestClass, RequestType
from rollmux.rollout_sched.scheduler import (
    DispatchRecord,
    RolloutRequestScheduler,
    export_prometheus,
    short_wait_bound_windows,
)

__all__ = [
    "BudgetConfig", "ColdStartConfig", "ColdStartController", "Completion", "DispatchRecord", "EngineState",
    "IndexConfig", "POLICIES", "RadixPrefixIndex", "Request", "RequestClass", "RequestType", "ResourceBudget",
    "RolloutRequestScheduler", "RolloutSchedConfig", "SchedProfile", "SchedulingPolicy", "WindowBudget",
    "export_prometheus", "load_rollout_sched_config", "make_policy", "register_policy", "short_wait_bound_windows",
]
