"""The per-job baselines the simulator compares RollMux with, and the unit every policy is seen as.

Every policy is seen by the simulator as a set of *units* (:class:`Unit`): a provisioned
allocation (GPUs of each pool, $/h) and the realised iteration time of each job it runs.

* **Solo-D** (:func:`solo_unit`): each job alone on its own NR rollout + NT training GPUs
  (a one-member co-execution group; slowdown 1). RollMux §7.1 "Solo Disaggregation".
* **Colocated, veRL-style** (:func:`colocated_unit`): each job alone on its NT training GPUs,
  which also run its rollout (no rollout GPUs, in-cluster resharding instead of cross-cluster
  sync). RollMux §7.1 "Co-location (veRL)".
* **Gavel+** (:func:`gavel_choice`): job-level heterogeneity-aware choice of GPU types and counts
  (disaggregated H20+H800 or colocated H800, counts x{0.5, 1, 2}) minimising $ per iteration
  subject to the job's SLO against Solo-D; no phase interleaving. RollMux §7.1 "Gavel+"
  (Narayanan et al., OSDI '20, adapted to RL phases).

Phase times on other hardware (colocated, Gavel+): a job planned with measured times
(``spec.measured``) keeps them, each phase scaled by the roofline ratio
``estimate(other hardware) / estimate(its own hardware)`` of :mod:`rollmux.profiler`.

The offline optimum and the re-exports of these names are :mod:`rollmux.baselines`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional

from rollmux import profiler
from rollmux.models import ClusterSpec, GPUType, JobSpec, PhaseProfile



@dataclass(frozen=True)
class Unit:
    """One provisioned allocation of a policy and the jobs it runs (constant between events).

    Attributes:
        key: stable id (group id, ``solo:<job>``, ...).
        job_ids: the jobs it runs.
        cost_usd_per_h: price of its GPUs, $/h.
        rollout_gpus / train_gpus: GPUs it holds in each pool.
        iter_time_s: realised iteration time of each member, seconds (co-execution time).
        rollout_busy_gpus / train_busy_gpus: GPUs busy on average (busy GPU-seconds per second);
            the rest of ``*_gpus`` is the dependency bubble.
        staleness: per asynchronous member, the share of its rollouts per staleness ``{s:
            fraction}`` in this unit (:mod:`rollmux.staleness`); synchronous members are absent.
    """

    key: str
    job_ids: tuple[str, ...]
    cost_usd_per_h: float
    rollout_gpus: int
    train_gpus: int
    iter_time_s: dict[str, float]
    rollout_busy_gpus: float
    train_busy_gpus: float
    staleness: Mapping[str, Mapping[int, float]] = field(default_factory=dict)


def _without_measured(job: JobSpec) -> JobSpec:
    return job.model_copy(update={"measured": None}) if job.measured is not None else job


def profile_on(job: JobSpec, cluster: ClusterSpec, **hw) -> PhaseProfile:
    """Worst-case phase times of ``job`` on other hardware (``hw``: :func:`profiler.estimate`
    overrides). Measured times are scaled per phase by the roofline ratio (module docstring).

    Raises ValueError when the model does not fit on the given GPUs (from the profiler).
    """
    bare = _without_measured(job)
    alt = profiler.estimate(bare, cluster, **hw)
    if job.measured is None:
        return alt
    ref = profiler.estimate(bare, cluster)
    m = job.measured

    def scale(mv: float, a: float, r: float) -> float:
        return mv * a / r if r > 0 else a

    return PhaseProfile(
        t_roll_s=scale(m.t_roll_s, alt.t_roll_s, ref.t_roll_s),
        t_train_s=scale(m.t_train_s, alt.t_train_s, ref.t_train_s),
        t_sync_s=scale(m.t_sync_s, alt.t_sync_s, ref.t_sync_s),
    )


def planning_profile(job: JobSpec, cluster: ClusterSpec) -> PhaseProfile:
    """The worst-case profile admission plans with (``job.measured`` when given)."""
    return profiler.estimate(job, cluster)


# --- Solo-D ---------------------------------------------------------------------------------------


def solo_unit(job: JobSpec, profile: PhaseProfile, cluster: ClusterSpec) -> Unit:
    """Solo-D: the job alone on ceil(NR/8) rollout and ceil(NT/8) training nodes; slowdown 1.

    Busy time (:func:`rollmux.occupancy.occupancy`, GPU-weighted): the job's NR GPUs during
    rollout, its NT GPUs during training and sync (the sync holds the senders,
    :mod:`rollmux.round_robin`); the rest of its whole nodes idles. Source: RollMux §7.1 Solo-D.
    """
    from rollmux.occupancy import occupancy

    rn = job.nodes_needed("rollout", cluster.rollout_pool.node)
    tn = job.nodes_needed("train", cluster.train_pool.node)
    rgpn, tgpn = cluster.rollout_pool.node.gpus_per_node, cluster.train_pool.node.gpus_per_node
    rg, tg = rn * rgpn, tn * tgpn
    t = profile.t_solo_s
    # one iteration's records (phases back to back; the job's GPUs spread over its nodes): busy GPUs
    # are GPU-weighted, so a job on 4 of a node's 8 GPUs leaves the other 4 idle
    recs = [dict(pool="rollout", node=f"r{i}", start_s=0.0, end_s=profile.t_roll_s, gpus=min(rgpn, job.num_rollout_gpus / rn))
            for i in range(rn)]
    # an asynchronous job's training overlaps its next rollout: it ends the iteration either way
    t0 = profile.t_roll_s if profile.max_staleness == 0 else t - profile.t_train_node_s
    recs += [dict(pool="train", node=f"t{i}", start_s=t0, end_s=t, gpus=min(tgpn, job.num_train_gpus / tn))
             for i in range(tn)]
    occ = occupancy(recs, {"rollout": {f"r{i}": rgpn for i in range(rn)}, "train": {f"t{i}": tgpn for i in range(tn)}},
                    window=(0.0, t))
    return Unit(
        key=f"solo:{job.job_id}",
        job_ids=(job.job_id,),
        cost_usd_per_h=rn * cluster.rollout_pool.node.price_usd_per_h + tn * cluster.train_pool.node.price_usd_per_h,
        rollout_gpus=rg,
        train_gpus=tg,
        iter_time_s={job.job_id: t},
        rollout_busy_gpus=occ["rollout"].busy_gpu_s / t,
        train_busy_gpus=occ["train"].busy_gpu_s / t,
        staleness=_own_staleness(job, profile),
    )


def _own_staleness(job: JobSpec, profile: PhaseProfile) -> dict[str, dict[int, float]]:
    """A per-job unit's :attr:`Unit.staleness`: an asynchronous job alone on its own GPUs (rollout
    and training apart: :func:`rollmux.intra_group.solo_staleness`; colocated, one after the other:
    every version is published before the next rollout, so ``bounded`` uses the newest and
    ``exact`` the one ``k`` behind)."""
    if job.max_staleness == 0:
        return {}
    if profile.max_staleness == 0:
        return {job.job_id: {job.max_staleness if job.staleness_mode == "exact" else 0: 1.0}}
    from rollmux.intra_group import solo_staleness
    from rollmux.models import GroupMember, Placement

    pl = Placement(job_id=job.job_id, rollout_nodes=("rollout-0",), train_nodes=("train-0",))
    return {job.job_id: solo_staleness(GroupMember(spec=job, profile=profile, placement=pl))}


# --- Colocated (veRL-style) -----------------------------------------------------------------------


def colocated_profile(job: JobSpec, cluster: ClusterSpec, num_gpus: Optional[int] = None) -> PhaseProfile:
    """Phase times with rollout *and* training on ``num_gpus`` (default NT) training-pool GPUs."""
    n = num_gpus or job.num_train_gpus
    return profile_on(
        job, cluster, rollout_gpu=cluster.train_pool.node.gpu, num_rollout_gpus=n, num_train_gpus=n, colocated=True
    )


def colocated_unit(job: JobSpec, cluster: ClusterSpec) -> Unit:
    """Colocated: the job alone on its NT H800 GPUs (whole nodes), phases back to back.

    The training pool is busy all the time (no dependency bubble, but rollout runs on
    compute-optimised GPUs); no rollout GPUs. Source: RollMux §7.1 "Co-location (veRL)".
    """
    node = cluster.train_pool.node
    tn = job.nodes_needed("train", node)
    g = tn * node.gpus_per_node
    p = colocated_profile(job, cluster, g)
    return Unit(
        key=f"coloc:{job.job_id}",
        job_ids=(job.job_id,),
        cost_usd_per_h=tn * node.price_usd_per_h,
        rollout_gpus=0,
        train_gpus=g,
        iter_time_s={job.job_id: p.t_solo_s},
        rollout_busy_gpus=0.0,
        train_busy_gpus=float(g),
        staleness=_own_staleness(job, p),
    )


# --- Gavel+ ---------------------------------------------------------------------------------------

GAVEL_SCALES: tuple[float, ...] = (0.5, 1.0, 2.0)


@dataclass(frozen=True)
class GavelChoice:
    """Gavel+'s allocation for one job.

    Attributes:
        kind: ``"disaggregated"`` (rollout on the rollout pool) or ``"colocated"``.
        rollout_gpus / train_gpus: GPUs of each pool (``rollout_gpus == 0`` when colocated).
        profile: phase times on that allocation, seconds.
        cost_usd_per_h: its price, $/h.
        usd_per_iteration: cost x iteration time, $ (the objective).
        meets_slo: iteration time <= SLO x Solo-D iteration time.
    """

    kind: str
    rollout_gpus: int
    train_gpus: int
    profile: PhaseProfile
    cost_usd_per_h: float
    usd_per_iteration: float
    meets_slo: bool


def gavel_options(job: JobSpec, cluster: ClusterSpec) -> list[GavelChoice]:
    """Every allocation Gavel+ considers for ``job`` (infeasible model fits are skipped)."""
    rgpu: GPUType = cluster.rollout_pool.node.gpu
    tgpu: GPUType = cluster.train_pool.node.gpu
    solo = planning_profile(job, cluster).t_solo_s
    out = []
    for a, b in itertools.product(GAVEL_SCALES, GAVEL_SCALES):
        nr, nt = max(1, round(job.num_rollout_gpus * a)), max(1, round(job.num_train_gpus * b))
        try:
            p = profile_on(job, cluster, num_rollout_gpus=nr, num_train_gpus=nt) if (a, b) != (1.0, 1.0) else planning_profile(job, cluster)
        except ValueError:
            continue
        c = nr * rgpu.price_usd_per_h + nt * tgpu.price_usd_per_h
        out.append(GavelChoice("disaggregated", nr, nt, p, c, c * p.t_solo_s / 3600.0, p.t_solo_s <= job.slo * solo * (1 + 1e-9)))
    for b in GAVEL_SCALES:
        n = max(1, round(job.num_train_gpus * b))
        try:
            p = colocated_profile(job, cluster, n)
        except ValueError:
            continue
        c = n * tgpu.price_usd_per_h
        out.append(GavelChoice("colocated", 0, n, p, c, c * p.t_solo_s / 3600.0, p.t_solo_s <= job.slo * solo * (1 + 1e-9)))
    return out


def gavel_choice(job: JobSpec, cluster: ClusterSpec) -> GavelChoice:
    """Gavel+: the allocation of minimum $ per iteration among those meeting the SLO.

    Solo-D's own allocation always meets it (slowdown 1), so a choice always exists.
    Source: RollMux §7.1 Gavel+; Gavel (OSDI '20) heterogeneity-aware allocation.
    """
    ok = [o for o in gavel_options(job, cluster) if o.meets_slo]
    return min(ok, key=lambda o: (o.usd_per_iteration, o.cost_usd_per_h))


def cheaper_alone(job: JobSpec, profile: PhaseProfile, group_usd_per_h: float, cluster: ClusterSpec) -> Optional[GavelChoice]:
    """Per-job allocations (``per_job_allocations: simulator``): the job's own allocation
    (:func:`gavel_choice`: the least $ per iteration among its scaled x{0.5, 1, 2} and colocated
    allocations meeting its SLO against Solo-D) when it costs strictly less per iteration than
    running alone in a group of ``group_usd_per_h`` (USD/h) at its solo time
    ``profile.t_solo_s``, and no more per hour (so the optimum's one-job column, priced by this
    same rule in :meth:`OptimalPartition.single_usd_per_h`, never costs more than what runs);
    None otherwise.

    A job alone in its group then runs on this allocation instead of the group's whole nodes; the
    group stays in the scheduler's table, so a later arrival still packs into it (direct packing)
    and the member runs on the group's nodes again. Only the trace replay does this: the cluster's
    runtime runs co-execution groups on whole nodes only. Source: RollMux §4.2 (marginal
    provisioning cost), §7.1 Gavel+ (the allocation space).
    """
    alt = gavel_choice(job, cluster)
    cheaper = (alt.usd_per_iteration < group_usd_per_h * profile.t_solo_s / 3600.0 * (1 - 1e-9)
               and alt.cost_usd_per_h <= group_usd_per_h * (1 + 1e-12))
    return alt if cheaper else None


def gavel_unit(job: JobSpec, cluster: ClusterSpec) -> Unit:
    """The Gavel+ allocation of ``job`` as a simulator unit (GPU-granular, no interleaving)."""
    return choice_unit(job, gavel_choice(job, cluster))


def choice_unit(job: JobSpec, g: GavelChoice) -> Unit:
    """One own allocation of ``job`` (a :class:`GavelChoice`) as a simulator unit."""
    p = g.profile
    t = p.t_solo_s
    if g.kind == "colocated":
        rb, tb = 0.0, float(g.train_gpus)
    else:
        rb, tb = g.rollout_gpus * p.t_roll_s / t, g.train_gpus * p.t_train_node_s / t
    return Unit(f"gavel:{job.job_id}", (job.job_id,), g.cost_usd_per_h, g.rollout_gpus, g.train_gpus, {job.job_id: t}, rb, tb,
                _own_staleness(job, p))



def realised(unit_fn: Callable[[JobSpec, ClusterSpec], Unit]) -> Callable[..., Unit]:
    """A per-job baseline's unit with the realisation's phase times: in stochastic replays the
    allocation's worst-case iteration time is scaled by the job's realised / planned solo time.
    ``real``: a :class:`rollmux.sim.realisation.Realisation` (``stochastic``, ``solo_time_s``)."""

    def unit(job: JobSpec, cluster: ClusterSpec, real) -> Unit:
        u = unit_fn(job, cluster)
        if not real.stochastic:
            return u
        f = real.solo_time_s(job) / profiler.estimate(job, cluster).t_solo_s
        return Unit(u.key, u.job_ids, u.cost_usd_per_h, u.rollout_gpus, u.train_gpus, {job.job_id: u.iter_time_s[job.job_id] * f},
                    u.rollout_busy_gpus, u.train_busy_gpus)

    unit.__name__ = unit.__qualname__ = f"realised_{unit_fn.__name__}"
    return unit


def _solo(job: JobSpec, cluster: ClusterSpec, real) -> Unit:
    u = solo_unit(job, real.mean_profile(job), cluster)
    t, t0 = real.solo_time_s(job), u.iter_time_s[job.job_id]
    if t == t0:
        return u
    # an asynchronous job's sampled iterations pipeline alone (Realisation.solo_time_s): its Solo-D
    # runs at that time, the same busy GPU-seconds per iteration
    return replace(u, iter_time_s={job.job_id: t}, rollout_busy_gpus=u.rollout_busy_gpus * t0 / t,
                   train_busy_gpus=u.train_busy_gpus * t0 / t)


#: The per-job baselines' allocations by the ``unit`` name of their :class:`rollmux.policies.PolicySpec`:
#: ``unit(job, cluster, realisation) -> Unit``.
PER_JOB_UNITS: dict[str, Callable[..., Unit]] = {
    "solo-d": _solo,
    "colocated": realised(colocated_unit),
    "gavel+": realised(gavel_unit),
}
