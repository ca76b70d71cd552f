"""Inter-group admission: RollMux Alg. 1 and the random / most-idle baselines (RollMux §4.2).

:class:`InterGroupScheduler` keeps the co-execution groups of one cluster and decides, for each
arriving job, which group and exact nodes it is pinned to:

1. *Prune* groups that cannot take it (:data:`GROUP_FILTERS`, evaluated when a group changes):
   full groups (``max_group_size``) and saturated groups (``config.saturation``: by default
   ``T_load >= max_k slo_k T_solo_k``, the largest SLO budget; ``"paper"``: ``T_load >= T_cycle``,
   which with SLOs above 1 also prunes groups whose meta-iteration may still stretch).
2. For each remaining group evaluate *direct packing* (pin the job on the group's existing
   least-loaded rollout and training nodes, ``Δ = 0``) and *rollout scale-out* (share the
   group's least-loaded training nodes, add ``ceil(NR / gpus_per_node)`` new rollout nodes,
   ``Δ`` = their price).
3. Run each candidate through :data:`CANDIDATE_FILTERS` (small named functions over one
   precomputed :class:`Newcomer` record, each returning a :class:`Verdict` with its figures):
   capacity, the newcomer's O(1) SLO bound, memory, every member's node-load SLO bound
   (:func:`node_load_bound`, the one home of that rule). Reject a candidate that breaks *memory
   residency* (per node, the sum of the pinned jobs'
   :func:`rollmux.profiler.state_gb` must fit ``host_mem_gb``) or any member's *SLO*
   (``T_coexec_k <= slo_k * T_solo_k``, T_coexec from :func:`rollmux.intra_group.coexec_times`,
   i.e. the steady-state mean iteration time of the round-robin schedule simulated on worst-case
   profiles; a cheap lower bound ``max(T_solo_k, load of k's busiest node)`` rejects first
   without simulating).
4. Pick the minimum marginal cost; ties go to the most SLO slack (lowest
   ``max_k slowdown_k / slo_k``; ``SchedulerConfig.tie_break``), then to the earliest group.
   Compare with an isolated new group (its full price) and take the cheaper.

What differs between the policies (SLO check, saturation pruning, tiers, how the choice is made,
re-packing) is read from their :class:`rollmux.policies.PolicySpec`, never from their names.

Refusals are values: ``code="never"`` (the job can never fit: :data:`JOB_FILTERS` -- a non-finite
phase time, training state larger than a training GPU's HBM -- or state larger than every node of a
pool, more GPUs than the pool has, weights not fitting HBM, duplicate id) or
``code="retry_later"`` (no feasible placement now; the reason names the deciding filter of every
path: the groups' pruning or candidate filters and, for a new group, capacity = out of GPUs). The ``random`` and ``most-idle`` baselines
(RollMux §7.1) place into a random / the most idle memory-feasible, non-full group with
no SLO check, opening a new group only when none fits. Their placement inside the chosen group
(no simulation, only memory and node counts): *random* draws uniformly among all feasible
(group, strategy) pairs; *most-idle* takes the group with the largest idle node-time fraction and
packs directly when its chosen rollout nodes have idle time for the job's rollout
(``T_cycle - load >= T_roll``), else scales out.

Every decision carries its explanation (candidates with verdicts, pruned groups) and its
latency. Decisions are linear in the number of groups and cheap in practice: groups are classified
open / pruned when they change (not per decision); per-group ``T_load``/``T_cycle``, node loads and
memory are cached; the SLO check first applies a node-load lower bound, then simulates lazily by
branch and bound (cheapest tier first -- direct packing, Δ = 0; the scale-out tier is evaluated
only when no direct packing is feasible -- best optimistic bound first; candidates that cannot
win are reported as ``"skipped"``); the simulation is a recurrence memoised on the group's
structure. The chosen placement has the cost and SLO slack an exhaustive evaluation would pick
(property-tested).

Modules (one concern each; this package re-exports their public names, so ``from
rollmux.admission import InterGroupScheduler, SchedulerConfig, build_group, ...`` works):

==============================  ==========================================================
:mod:`~rollmux.admission.config`     scheduler settings (``configs/scheduler.yaml``)
:mod:`~rollmux.admission.rules`      the node-load rule, the SLO comparison, saturation
:mod:`~rollmux.admission.decisions`  newcomer, candidates, the decision record
:mod:`~rollmux.admission.groups`     node pools, group summaries, the index of open groups
:mod:`~rollmux.admission.filters`    job, candidate and group filters; the group's SLO bound
:mod:`~rollmux.admission.order`      the round-robin order search (group feasibility)
:mod:`~rollmux.admission.layouts`    the exact layout of a job set (the optimum's groups)
:mod:`~rollmux.admission.repack`     departure re-packing, neighbourhood re-optimisation
:mod:`~rollmux.admission.table_copy` the table's snapshot and copies that decide as the original
:mod:`~rollmux.admission.scheduler`  :class:`InterGroupScheduler` (decide, commit, depart)
==============================  ==========================================================

Source: RollMux §4.2, Alg. 1; §7.1 (baselines).
"""

from rollmux.admission.config import SchedulerConfig, load_scheduler_config
from rollmux.admission.decisions import PLUGINS, AdmissionDecision, Candidate, Newcomer
from rollmux.admission.filters import (CANDIDATE_FILTERS, GROUP_FILTERS, JOB_FILTERS, PASS, Filter, JobFilter, Verdict,
                                       capacity_filter, finite_profile_filter, group_size_filter, memory_filter,
                                       newcomer_slo_bound_filter, saturation_filter, slo_bound_filter,
                                       train_gpu_memory_filter)
from rollmux.admission.layouts import (build_group, job_layout_needs, layout_floor_usd_per_h, layout_row,
                                       training_pins_feasible)
from rollmux.admission.order import EXHAUSTIVE_ORDER_MAX, OrderChoice, best_round_robin_order
from rollmux.admission.rules import SLO_REL_TOL, breaks_slo, cadence_bound, is_saturated, node_load_bound, within
from rollmux.admission.scheduler import POLICIES, InterGroupScheduler

__all__ = [
    "AdmissionDecision", "CANDIDATE_FILTERS", "Candidate", "EXHAUSTIVE_ORDER_MAX", "Filter", "GROUP_FILTERS",
    "InterGroupScheduler", "JOB_FILTERS", "JobFilter", "Newcomer", "OrderChoice", "PASS", "PLUGINS", "POLICIES",
    "SLO_REL_TOL", "SchedulerConfig", "Verdict", "best_round_robin_order", "breaks_slo", "build_group",
    "capacity_filter", "finite_profile_filter", "group_size_filter", "is_saturated", "job_layout_needs",
    "layout_floor_usd_per_h", "layout_row", "load_scheduler_config", "memory_filter", "newcomer_slo_bound_filter",
    "cadence_bound", "node_load_bound", "saturation_filter", "slo_bound_filter", "train_gpu_memory_filter",
    "training_pins_feasible", "within",
]
