"""Admission filters (RollMux Alg. 1, in the style of a scheduler-framework filter plugin): small
named functions returning a :class:`Verdict` with the figures behind it.

* :data:`JOB_FILTERS` ``check(job, profile, cluster)``: job-level, a rejection is a ``never`` refusal;
* :data:`CANDIDATE_FILTERS` ``check(group, newcomer, candidate)``: per placement, in order
  (capacity, the newcomer's O(1) SLO bound, memory residency (picks the nodes), every member's
  node-load SLO bound);
* :data:`GROUP_FILTERS` ``check(group, config)``: group pruning (full, saturated), evaluated when
  a group changes.

:func:`slo_bound` is the node-load lower bound over a whole candidate group (the optimum's
layouts use it before simulating). Source: RollMux §4.2, Alg. 1 lines 4 and 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from rollmux import profiler
from rollmux.admission.config import SchedulerConfig
from rollmux.admission.decisions import Candidate, Newcomer
from rollmux.admission.groups import GroupSummary, pick_nodes
from rollmux.admission.rules import breaks_slo, is_saturated, node_load_bound
from rollmux.models import ClusterSpec, GroupMember, JobSpec, PhaseProfile


@dataclass(frozen=True)
class Verdict:
    """A filter's answer: ``ok``, or the rejecting ``plugin`` (one of :data:`PLUGINS`) with a
    human-readable ``reason`` and the figures behind it (``numbers``, units in the keys)."""

    ok: bool
    plugin: str = ""
    reason: str = ""
    numbers: Mapping[str, float] = field(default_factory=dict)


PASS = Verdict(True)


def _no(plugin: str, reason: str, **numbers: float) -> Verdict:
    return Verdict(False, plugin, reason, numbers)


def capacity_filter(g: "GroupSummary", new: Newcomer, c: Candidate) -> Verdict:
    """The group has enough training nodes (and rollout nodes for direct packing); a scale-out
    has enough free rollout nodes in the cluster."""
    grp = g.group
    if new.train_nodes > len(grp.train_nodes):
        return _no("capacity", f"job needs {new.train_nodes} training nodes, group has {len(grp.train_nodes)}",
                   train_nodes_needed=new.train_nodes, train_nodes_in_group=len(grp.train_nodes))
    if c.strategy == "direct" and new.rollout_nodes > len(grp.rollout_nodes):
        return _no("capacity", f"job needs {new.rollout_nodes} rollout nodes, group has {len(grp.rollout_nodes)}",
                   rollout_nodes_needed=new.rollout_nodes, rollout_nodes_in_group=len(grp.rollout_nodes))
    if c.strategy == "scale_out" and new.free_rollout is None:
        return _no("capacity", f"cluster out of GPUs: no {new.rollout_nodes} free rollout nodes",
                   rollout_nodes_needed=new.rollout_nodes)
    return PASS


def newcomer_slo_bound_filter(g: "GroupSummary", new: Newcomer, c: Candidate) -> Verdict:
    """O(1) necessary condition before picking nodes (node-load rule on the newcomer alone): even
    on the group's least-loaded nodes, its own iteration would take at least their load plus its
    phases."""
    p = new.profile
    lb = g.t_sorted[new.train_nodes - 1] + p.t_train_node_s
    if c.strategy == "direct" and new.rollout_nodes <= len(g.r_sorted):
        lb = max(lb, g.r_sorted[new.rollout_nodes - 1] + p.t_roll_s)
    if breaks_slo(lb, p.t_solo_s, new.job.slo):
        return _no("slo", f"{new.job.job_id}: slowdown >= {lb / p.t_solo_s:.3f} > SLO {new.job.slo:.3f} "
                          "(load of the least-loaded nodes, lower bound)",
                   slowdown_lower_bound=lb / p.t_solo_s, slo=new.job.slo)
    return PASS


def memory_filter(g: "GroupSummary", new: Newcomer, c: Candidate) -> Verdict:
    """Memory residency: the newcomer's state fits the host memory of the least-loaded nodes it is
    pinned to (picks them: sets ``c.nodes``; scale-out takes the free rollout nodes)."""
    grp = g.group
    tn = pick_nodes(grp.train_nodes, new.train_nodes, g.loads, g.mem, new.train_state_gb, new.train_host_mem_gb)
    if tn is None:
        return _no("memory", f"fewer than {new.train_nodes} training nodes with {new.train_state_gb:.1f} GB of host memory free",
                   train_nodes_needed=new.train_nodes, state_gb=new.train_state_gb, host_mem_gb=new.train_host_mem_gb)
    if c.strategy == "direct":
        rn = pick_nodes(grp.rollout_nodes, new.rollout_nodes, g.loads, g.mem, new.rollout_state_gb, new.rollout_host_mem_gb)
        if rn is None:
            return _no("memory", f"fewer than {new.rollout_nodes} rollout nodes with {new.rollout_state_gb:.1f} GB of host memory free",
                       rollout_nodes_needed=new.rollout_nodes, state_gb=new.rollout_state_gb, host_mem_gb=new.rollout_host_mem_gb)
    else:  # scale_out: free_rollout is not None (capacity_filter)
        rn = list(new.free_rollout or ())
        c.new_nodes = tuple(rn)
    c.nodes, c.job_id = (tuple(rn), tuple(tn)), new.job.job_id
    c.base = (grp.members, new.job, new.profile)
    return PASS


def slo_bound_filter(g: "GroupSummary", new: Newcomer, c: Candidate) -> Verdict:
    """Node-load rule on every member of G' (the newcomer on its picked nodes added to the loads):
    rejects when a member's lower bound breaks its SLO; sets ``c.bound``, the optimistic
    ``max_k slowdown_k / slo_k`` branch and bound orders by (no simulation)."""
    p = new.profile
    rn, tn = c.nodes  # type: ignore[misc]
    add_r, add_t = p.t_roll_s, p.t_train_node_s
    new_loads = {n: g.loads.get(n, 0.0) + add_r for n in rn}
    for n in tn:
        new_loads[n] = g.loads[n] + add_t
    rows = [(new.job.job_id, p.t_solo_s, new.job.slo, node_load_bound(p.t_solo_s, new_loads.values()))]
    for jid, ts, slo, nodes, ml in g.info:
        rows.append((jid, ts, slo, node_load_bound(ts, [ml] + [v for n, v in new_loads.items() if n in nodes])))
    c.bound, v = _bound_verdict(rows)
    return v


@dataclass(frozen=True)
class Filter:
    """One admission filter: ``check(group, newcomer, candidate) -> Verdict``; ``slo_only``: run
    only for policies whose spec has ``slo_check`` (Alg. 1)."""

    name: str
    check: Callable[["GroupSummary", Newcomer, Candidate], Verdict]
    slo_only: bool = False


#: Per-candidate filters, in order (cheap first; the memory filter picks the nodes the later ones use).
CANDIDATE_FILTERS: tuple[Filter, ...] = (
    Filter("capacity", capacity_filter),
    Filter("newcomer_slo_bound", newcomer_slo_bound_filter, slo_only=True),
    Filter("memory", memory_filter),
    Filter("slo_bound", slo_bound_filter, slo_only=True),
)


def finite_profile_filter(job: JobSpec, prof: PhaseProfile, cluster: ClusterSpec) -> Verdict:
    """Defence in depth behind the input bounds: a phase time that is NaN, infinite or not > 0
    (rollout, training) / < 0 (sync) would make every cycle, load and slack meaningless: refuse."""
    for name in ("t_roll_s", "t_train_s", "t_sync_s"):
        t = getattr(prof, name)
        if not (isinstance(t, (int, float)) and math.isfinite(t) and (t >= 0 if name == "t_sync_s" else t > 0)):
            return _no("finite", f"phase time {name} = {t!r} s is not a finite positive number")
    return PASS


def train_gpu_memory_filter(job: JobSpec, prof: PhaseProfile, cluster: ClusterSpec) -> Verdict:
    """Training-GPU memory residency: the job's weights, gradients and optimizer state per training
    GPU (:func:`rollmux.profiler.train_gpu_state_gb`, at its precision and ZeRO stage) must fit one
    GPU's HBM (a necessary condition beside host memory; activations are not counted)."""
    need = profiler.train_gpu_state_gb(job)
    gpu = cluster.train_pool.node.gpu
    if need <= gpu.hbm_gb:
        return PASS
    w, g, o = profiler.TRAIN_GPU_BYTES_PER_PARAM[job.train_precision]
    total, have = (w + g + o) * job.model_params_b, gpu.hbm_gb * job.num_train_gpus
    return _no("train_gpu_memory",
               f"training GPU memory: {job.model_params_b:g}B params x {w + g + o:g} B/param "
               f"({job.train_precision}, AdamW, ZeRO-{job.zero_stage} over num_train_gpus={job.num_train_gpus}) = "
               f"{need:.1f} GB per training GPU exceeds the {gpu.hbm_gb:.1f} GB HBM of one {gpu.name} "
               f"(total {total:.0f} GB vs {have:.0f} GB); "
               + ("ask for more num_train_gpus or a smaller model" if job.zero_stage == 3
                  else "ask for more num_train_gpus, a higher zero_stage or a smaller model"),
               state_gb_per_gpu=need, hbm_gb=gpu.hbm_gb, state_gb_total=total, hbm_gb_total=have)


@dataclass(frozen=True)
class JobFilter:
    """A job-level filter, independent of any group: ``check(job, profile, cluster) -> Verdict``;
    a rejection is a ``never`` refusal (no placement can ever change it)."""

    name: str
    check: Callable[[JobSpec, PhaseProfile, ClusterSpec], Verdict]


#: Job-level filters, run before any group is looked at (after the duplicate-id check), in order.
JOB_FILTERS: tuple[JobFilter, ...] = (
    JobFilter("finite", finite_profile_filter),
    JobFilter("train_gpu_memory", train_gpu_memory_filter),
)


def group_size_filter(g: "GroupSummary", config: SchedulerConfig) -> Verdict:
    """A full group (``max_group_size`` members) takes no newcomer."""
    n, cap = len(g.group.members), config.max_group_size
    if n >= cap:
        return _no("group_size", f"group has {n} jobs (max_group_size={cap})", members=n, max_group_size=cap)
    return PASS


def saturation_filter(g: "GroupSummary", config: SchedulerConfig) -> Verdict:
    """Saturated groups take no newcomer (Alg. 1 line 4). ``config.saturation``: ``"paper"``:
    :func:`is_saturated` (``T_load >= T_cycle``, the longest solo time); ``"slo"``: the busiest
    node already holds the largest SLO budget of the members, ``T_load >= max_k slo_k T_solo_k``
    (equal to the paper's rule when every SLO is 1; with looser SLOs a meta-iteration may stretch
    beyond T_cycle and the per-candidate SLO filters decide); ``"off"``: no pruning."""
    if config.saturation == "off":
        return PASS
    cap = g.t_cycle if config.saturation == "paper" else max((ts * slo for _, ts, slo, _, _ in g.info), default=0.0)
    if is_saturated(g.t_load, cap):
        what = "T_cycle" if config.saturation == "paper" else "max SLO budget"
        return _no("saturation", f"saturated: T_load {g.t_load:.1f} s >= {what} {cap:.1f} s", t_load_s=g.t_load, t_cycle_s=cap)
    return PASS


#: Group-level filters (pruning, evaluated when a group changes, not per decision), in order;
#: ``slo_only`` ones apply to policies with ``prune_saturated``.
GROUP_FILTERS: tuple[Filter, ...] = (
    Filter("group_size", group_size_filter),
    Filter("saturation", saturation_filter, slo_only=True),
)


# --- the node-load SLO bound of a whole group G' -----------------------------------------------------

def slo_bound(cand: Candidate, members: list[GroupMember], loads: dict[str, float]) -> Candidate:
    """Cheap necessary SLO condition: job k iterates once per meta-iteration on each of its nodes,
    so ``T_coexec_k >= max(T_solo_k, load of k's busiest node)``. Rejects on violation; sets
    ``cand.bound`` = the optimistic ``max_k slowdown_k / slo_k`` (for branch and bound)."""
    rows = [(m.spec.job_id, m.profile.t_solo_s, m.spec.slo,
             node_load_bound(m.profile.t_solo_s, [loads[n] for n in m.placement.rollout_nodes + m.placement.train_nodes]))
            for m in members]
    cand.members = members
    return _bound_rows(cand, rows)


def _bound_verdict(rows: list[tuple[str, float, float, float]]) -> tuple[float, "Verdict"]:
    """The node-load lower bound over ``rows`` = (job_id, T_solo_s, slo, lower bound of T_coexec_s)
    per member of G': (optimistic ``max_k slowdown_k / slo_k``, the SLO verdict)."""
    bad = [(jid, lb / ts, slo) for jid, ts, slo, lb in rows if breaks_slo(lb, ts, slo)]
    bound = max((lb / ts / slo for _, ts, slo, lb in rows), default=0.0)
    if not bad:
        return bound, PASS
    return bound, _no("slo", "; ".join(f"{jid}: slowdown >= {sd:.3f} > SLO {slo:.3f} (node-load lower bound)" for jid, sd, slo in bad),
                      slowdown_lower_bound=max(sd for _, sd, _ in bad), slo=min(slo for _, _, slo in bad), optimistic_score=bound)


def _bound_rows(cand: Candidate, rows: list[tuple[str, float, float, float]]) -> Candidate:
    """Apply :func:`_bound_verdict` to ``cand``: sets ``cand.bound``; rejects on violation."""
    cand.bound, v = _bound_verdict(rows)
    return cand if v.ok else cand.reject(v.plugin, v.reason, v.numbers)

