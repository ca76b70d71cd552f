"""The one policy registry: every policy name the scheduler, the simulator and the CLI know.

Each :class:`PolicySpec` says what a policy is (``kind``: a group-forming admission policy run by
:class:`rollmux.admission.InterGroupScheduler`, a per-job allocation, or the offline optimum),
how it chooses (``choose`` for group-forming policies, ``unit`` for per-job ones), whether its
candidates pass the SLO check and saturated groups are pruned (Alg. 1 only), whether it
re-packs after departures, and which policy's largest group the replay plots first. Code asks
the spec (``policy_spec(name).repacks``), never compares names.

Source: RollMux §4.2 Alg. 1 (``rollmux``), §7.1 baselines (Solo-D, colocated veRL, Gavel+,
random, most-idle), §7.5 "Opt" (``optimal``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

PolicyKind = Literal["scheduler", "per_job", "optimal"]


def group_number(group_id: Optional[str]) -> int:
    """Creation number of a group id ``group-<n>`` (orders ties by age; -1 if none)."""
    tail = (group_id or "").rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1


# --- how a group-forming policy chooses among the feasible candidates of one tier ------------------
# ``choose(sched, feasible, profile)``: ``sched`` is the InterGroupScheduler (duck-typed: its
# ``_groups``, ``_rng``, ``choose_min_cost``), ``feasible`` the candidates that passed every filter
# in evaluation order, ``profile`` the newcomer's planning profile. Returns the chosen candidate or
# None (then the next tier, then an isolated new group).


def choose_min_cost(sched: Any, feasible: list, profile: Any) -> Any:
    """Alg. 1 line 11: minimum marginal cost, ties to the most SLO slack (lazy simulation, branch
    and bound: :meth:`rollmux.admission.InterGroupScheduler.choose_min_cost`)."""
    return sched.choose_min_cost(feasible)


def choose_random(sched: Any, feasible: list, profile: Any) -> Any:
    """Random baseline: uniform among the feasible (group, strategy) pairs (RNG untouched if none)."""
    if not feasible:
        return None
    ordered = sorted(feasible, key=lambda c: (group_number(c.group_id), c.strategy))
    return sched._rng.choice(ordered)


def choose_most_idle(sched: Any, feasible: list, profile: Any) -> Any:
    """Most-idle baseline: the group with the largest idle node-time fraction; direct packing when
    its chosen rollout nodes have idle time for the job's rollout (``T_cycle - load >= T_roll``),
    else rollout scale-out."""
    if not feasible:
        return None
    g_idle = max((sched._groups[c.group_id] for c in feasible), key=lambda g: (g.idle_fraction, -group_number(g.group.group_id)))
    opts = {c.strategy: c for c in feasible if c.group_id == g_idle.group.group_id}
    d = opts.get("direct")
    fits = d is not None and all(g_idle.t_cycle - g_idle.loads.get(n, 0.0) >= profile.t_roll_s for n in d.placement.rollout_nodes)
    return d if (fits or "scale_out" not in opts) else opts["scale_out"]


@dataclass(frozen=True)
class PolicySpec:
    """One policy.

    Attributes:
        name: its name on the command line and in summary.json.
        description: one line, what it is.
        kind: ``"scheduler"`` (forms co-execution groups through InterGroupScheduler),
            ``"per_job"`` (each job alone on its own allocation) or ``"optimal"``.
        choose: scheduler kind: picks a candidate among a tier's feasible ones (see above).
        tiers: scheduler kind: the strategies evaluated together, tier by tier (a later tier only
            when no earlier one yields a choice).
        slo_check: candidates must keep every member's SLO (Alg. 1 line 10); otherwise the
            predicted slowdowns are computed for the chosen placement only.
        prune_saturated: saturated groups (``T_load >= T_cycle``) take no newcomer (Alg. 1 line 4).
        repacks: re-packs small groups after departures (``InterGroupScheduler.repack``).
        unit: per_job kind: the key of its allocation in :data:`rollmux.baselines.PER_JOB_UNITS`
            (``unit(job, cluster, realisation) -> baselines.Unit``); a name, so this registry stays
            below the baselines in the import graph.
        gantt_rank: order in which the replay looks for a group to draw (lower first; None: never).
        draws_random: ``choose`` draws from the scheduler's RNG (a what-if that is rolled back
            must restore its state; the others never touch it).
    """

    name: str
    description: str
    kind: PolicyKind
    choose: Optional[Callable[[Any, list, Any], Any]] = None
    tiers: tuple[tuple[str, ...], ...] = (("direct", "scale_out"),)
    slo_check: bool = False
    prune_saturated: bool = False
    repacks: bool = False
    unit: Optional[str] = None
    gantt_rank: Optional[int] = None
    draws_random: bool = False


REGISTRY: dict[str, PolicySpec] = {s.name: s for s in (
    PolicySpec("rollmux", "RollMux Alg. 1: prune saturated groups, direct packing / rollout scale-out, memory + SLO checks, "
               "min marginal cost", "scheduler", choose=choose_min_cost, tiers=(("direct",), ("scale_out",)),
               slo_check=True, prune_saturated=True, repacks=True, gantt_rank=0),
    PolicySpec("solo-d", "Solo-D: each job alone on its own rollout and training nodes (RollMux §7.1)", "per_job", unit="solo-d"),
    PolicySpec("colocated", "veRL-style colocation: each job alone on its training GPUs (RollMux §7.1)", "per_job",
               unit="colocated"),
    PolicySpec("gavel+", "Gavel+: per-job cheapest GPU type and count meeting the SLO, no interleaving (RollMux §7.1)",
               "per_job", unit="gavel+"),
    PolicySpec("random", "baseline: a random memory-feasible (group, direct|scale-out) placement, no SLO check; new group "
               "only if none fits", "scheduler", choose=choose_random, gantt_rank=3, draws_random=True),
    PolicySpec("most-idle", "baseline: the most idle memory-feasible group (direct if its idle rollout time fits, else "
               "scale-out), no SLO check", "scheduler", choose=choose_most_idle, gantt_rank=2),
    PolicySpec("optimal", "offline optimum: cheapest partition of the active jobs into feasible groups at every event "
               "(RollMux §7.5 Opt)", "optimal", gantt_rank=1),
)}

#: Every policy name, in registry order.
POLICY_NAMES: tuple[str, ...] = tuple(REGISTRY)
#: The group-forming policies (InterGroupScheduler's ``policy``).
SCHEDULER_POLICIES: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.kind == "scheduler")


def check_policy(name: str) -> str:
    """Return ``name`` if it is a known policy (:data:`REGISTRY`), else raise ValueError listing
    the known ones."""
    return policy_spec(name).name


def policy_spec(name: str, kind: Optional[PolicyKind] = None) -> PolicySpec:
    """The spec of ``name``; ValueError listing the known names (of ``kind`` when given) otherwise."""
    spec = REGISTRY.get(name)
    if spec is None or (kind is not None and spec.kind != kind):
        known = [n for n, s in REGISTRY.items() if kind is None or s.kind == kind]
        what = "admission policy" if kind == "scheduler" else "policy"
        raise ValueError(f"unknown {what} {name!r}; known policies: {', '.join(known)}")
    return spec
