"""Per-job allocations beside the co-execution placements of Alg. 1: a job alone in its group
may run on its own allocation instead of the group's whole nodes, its GPU counts per pool
scaled (x0.5, x1, x2) or colocated on training GPUs, within its SLO and memory (the
allocations Gavel+ chooses among, :func:`rollmux.baselines.gavel_options`), when that costs less
per iteration. The group stays in the scheduler's table, so a later arrival still packs into it
(direct packing); the member then runs on the group's nodes again.

Both sides are priced by provisioning cost per iteration: the one-member group's $/h x its solo
iteration time against the own allocation's $/h x its iteration time. Where few jobs are active
at once, most jobs spend most of their time alone, and an own allocation at half the rollout
GPUs, or colocated, is cheaper whenever its SLO allows the longer iteration.

Only the trace replay runs jobs this way (``per_job_allocations: simulator``): the cluster's
runtime runs co-execution groups on whole nodes only. Source: RollMux §4.2 (marginal
provisioning cost); §7.1 Gavel+ (Narayanan et al., OSDI '20) for the allocation space.
"""

from __future__ import annotations

from typing import Optional

from rollmux.models import ClusterSpec, JobSpec, PhaseProfile


def cheaper_alone(job: JobSpec, profile: PhaseProfile, group_usd_per_h: float, cluster: ClusterSpec):
    """The job's own allocation (:func:`rollmux.baselines.gavel_choice`: the least $ per
    iteration among the scaled and colocated allocations meeting its SLO against Solo-D) when it
    costs strictly less per iteration than running alone in a group of ``group_usd_per_h``
    (USD/h) at its solo time ``profile.t_solo_s``, and no more per hour (so the optimum's one-job
    column, priced by this same rule, never costs more than what runs); None otherwise.

    Returns:
        :class:`rollmux.baselines.GavelChoice` or None.
    """
    from rollmux.baselines import gavel_choice

    alt = gavel_choice(job, cluster)
    cheaper = (alt.usd_per_iteration < group_usd_per_h * profile.t_solo_s / 3600.0 * (1 - 1e-9)
               and alt.cost_usd_per_h <= group_usd_per_h * (1 + 1e-12))
    return alt if cheaper else None
