"""Scheduler settings: :class:`SchedulerConfig` (``configs/scheduler.yaml``), the one model the
cluster's GlobalScheduler and ``rollmux simulate`` build the admission policy from."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollmux.config import CONFIG_DIR, load_model
from rollmux.drain import DRAIN_GRACE_S, DRAIN_MAX_S
from rollmux.intra_group import LongTailPolicy


#: a priority class or tenant name: a letter, then letters, digits, ``-``, ``_``, ``.`` (at most 64)
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9._-]{0,63}$"


class TenantQuota(BaseModel):
    """One tenant's nominal quota (like a Kueue ClusterQueue's nominal quota in a cohort).

    Attributes:
        rollout_gpus: GPUs of the rollout pool the tenant's running jobs may ask for in all
            (the sum of their ``num_rollout_gpus``), >= 0.
        train_gpus: the same for the training pool (``num_train_gpus``), >= 0.
        may_borrow: beyond its quota the tenant may use idle capacity; such jobs are *borrowed*
            and are the first preempted when a tenant within its quota needs the room.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rollout_gpus: int = Field(ge=0, le=10_000_000)
    train_gpus: int = Field(ge=0, le=10_000_000)
    may_borrow: bool = False


class SchedulerConfig(BaseModel):
    """Scheduler settings (``configs/scheduler.yaml``).

    Attributes:
        policy: ``"rollmux"`` (Alg. 1), ``"random"`` or ``"most-idle"``.
        max_group_size: most jobs in one co-execution group (paper simulation: 5).
        tail_trigger_fraction: long-tail migration fires when this fraction of a rollout's
            responses is done (RollMux §4.3: 0.8).
        tail_gpus: GPUs that keep a migrated rollout's stragglers.
        migration_overhead_s: cost of one migration (stragglers' re-prefill), seconds.
        tail_migration: act on long-tail decisions (GroupControllers release the rollout's nodes
            to the waiting rollout; the simulator models it); false records decisions only.
        plan_migration_overhead: long-tail migration runs at run time, so the SLO check plans
            every rollout of a co-executed group ``migration_overhead_s`` longer (a migrated
            rollout ends that much later; :func:`rollmux.intra_group.coexec_times`). The
            simulator sets it for ``--stochastic`` replays, where rollouts migrate.
        seed: seed of the random baseline.
        tie_break: among candidates of equal marginal cost, ``"most_slack"`` (lowest
            ``max_k slowdown_k / slo_k``: leaves SLO headroom for stochastic phase times) or
            ``"best_fit"`` (the tightest feasible group). The paper does not say; measured on the
            default mix the two differ by ~1-2% in cost either way.
        repack_on_departure: after a departure, try to dissolve small groups into the others
            (:meth:`InterGroupScheduler.repack`); moved jobs pay one host-state copy.
        repack_max_groups: groups tried per departure (bounds the work of a departure).
        repack_max_members: only groups with at most this many members are dissolved.
        reopt_max_jobs: after every admission and departure (after re-packing), re-partition
            the event's neighbourhood exactly (:meth:`InterGroupScheduler.reoptimise`): the group
            the job joined or left and the groups with the most idle node time, at most this
            many jobs in all, by the optimum's set partitioning; 0 turns it off.
        max_moves_per_job_per_h: most moves of one job (each a host-state copy and a stall at an
            iteration boundary) within any hour; a job at its cap stays in its group (the global
            plan, the neighbourhood re-optimisation and departure re-packing leave it) until its
            oldest move in the hour is an hour old. SLO repairs are not capped.
        plan_max_jobs: the global plan (:mod:`rollmux.admission.global_plan`): most jobs one plan
            re-partitions (every active job up to this many, else the groups furthest above the
            estimate); 0 turns it off.
        plan_gap_trigger: a plan is due when the gap between the $/h the groups run at and the
            estimate of what the active jobs could run at (the last plan's LP duals carried
            forward) has grown by this fraction since the last plan.
        plan_lp_iterations / plan_lp_layouts: the budget of one plan's column generation (master
            LP solves; exact layouts built).
        plan_deterministic_s: one plan's integer master, in CP-SAT's deterministic time units
            (about a second of one core each; never the wall clock, so every host plans alike).
        plan_master_columns: most columns of one plan's integer master: today's groups and the
            LP pool's columns of least reduced cost under the plan's duals (the restricted master
            heuristic of column generation); 0: every pool column. A large pool (a large
            ``plan_lp_layouts``) otherwise leaves CP-SAT without even its start partition within
            ``plan_deterministic_s``, and the plan keeps today's groups.
        plan_move_price_node_pairs_per_copy_s: what a second of host-state copy costs, in $/h of
            one rollout node plus one training node of the cluster (so the rule reads alike on any
            node prices): the global plan, the neighbourhood re-optimisation and departure
            re-packing move jobs only when the $/h the moves save exceeds this x that node pair's
            $/h x their copy seconds (the hysteresis: a move and its reverse cannot both pay).
        saturation: which groups Alg. 1 line 4 prunes (:func:`saturation_filter`): ``"paper"``
            (``T_load >= T_cycle``), ``"slo"`` (``T_load >= max_k slo_k T_solo_k``) or ``"off"``.
        driver_lease_s: a GroupController evicts an attached job whose driver has not
            heart-beaten for this many seconds while none of its phases runs (0 disables).
        attach_timeout_s: an admitted job whose driver has not attached (reported ``running``)
            after this many seconds expires: its nodes are released and its record says
            ``expired`` (the GlobalScheduler's reconcile loop checks; 0 disables).
        per_job_allocations: ``"off"`` (default: every job runs in a co-execution group on whole
            nodes, what the cluster's runtime carries out) or ``"simulator"``: in the trace replay
            only, a job alone in its group may run on its own allocation instead of the group's
            whole nodes (:func:`rollmux.baselines.cheaper_alone`: its GPU counts per pool scaled
            x{0.5, 1, 2} or colocated, within its SLO and memory) when that costs less per
            iteration and no more per hour; arrivals still pack into its group. The runtime has no
            sub-node, rescaled or colocated placement, so the GlobalScheduler refuses
            ``"simulator"`` at start-up (:meth:`runtime_refusals`).
        queue_max_jobs: most jobs the admission queue of a bounded cluster holds
            (:class:`rollmux.admission_queue.AdmissionQueue`); more are refused (HTTP 429).
        queue_backfill: behind a job that does not fit, try smaller queued jobs (else strict FIFO).
        queue_scan_limit: most queued jobs one pass (after a departure) decides.
        profile_source: the phase times decisions plan with (:mod:`rollmux.measured`):
            ``"measured"`` (default: a job's measured high quantile once it has run, a prior of
            its kind before, else its worst case), ``"worst_case"`` (the declared / estimated worst
            case, the paper's planning) or ``"blended"`` (measured and worst case weighted by
            iterations run). With ``measured`` / ``blended`` the SLO watch
            (:mod:`rollmux.admission.slo_watch`) re-checks groups on measured times against the
            realised solo time and acts at iteration boundaries.
        measured_window: iterations kept per job (sliding window).
        measured_min_iterations: reports needed before a job's window is used.
        measured_quantile: the high quantile per phase of the measured profile.
        measured_margin: the measured profile is ``margin x`` that quantile.
        blend_prior_iterations: weight of the worst case in ``blended``, in iterations.
        slo_watch_headroom: the watch acts when ``slowdown > slo x (1 - headroom)``.
        priority_classes: the priority classes, highest first (``JobSpec.priority_class`` names
            one; :mod:`rollmux.preemption`).
        default_priority_class: the class of a job that names none.
        default_tenant: the tenant of a job that names none.
        tenants: nominal quota per tenant (:class:`TenantQuota`); a tenant not listed has no quota.
        preemption: a job of a higher class that does not fit a bounded cluster may preempt
            lower-class preemptible jobs at their next iteration boundary (false: it queues).
        drain_grace_s / drain_max_s: the bounds of a drain (:func:`rollmux.drain.drain_overdue`):
            a job that stopped on nodes it was preempted or moved off counts as drained this many
            seconds after its stop although its driver never said so; one whose stop was never
            reported, ``drain_max_s`` after the decision. Seconds of the cluster's own time: on
            emulated accelerators modelled seconds x the time factor
            (:func:`rollmux.emulation.scheduler_config`).
        wall_s_per_model_s: wall seconds per second of the cluster's own phase time, by which a
            job's measured phase times (wall seconds, from its group's controller) are divided
            before the policy uses them (the SLO watch, measured planning profiles): 1 on real
            accelerators; on emulated ones the time factor (:func:`rollmux.emulation.scheduler_config`
            sets it), so that measured and configured profiles are in the same seconds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    policy: str = "rollmux"
    max_group_size: int = Field(default=5, ge=1, le=64)
    tail_trigger_fraction: float = Field(default=0.8, gt=0.0, le=1.0)
    tail_gpus: int = Field(default=1, ge=1, le=1024)
    migration_overhead_s: float = Field(default=2.0, ge=0.0, le=3600.0)
    tail_migration: bool = True
    plan_migration_overhead: bool = False
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    tie_break: Literal["best_fit", "most_slack"] = "most_slack"
    repack_on_departure: bool = True
    repack_max_groups: int = Field(default=4, ge=0, le=1024)
    repack_max_members: int = Field(default=2, ge=1, le=64)
    reopt_max_jobs: int = Field(default=6, ge=0, le=12)
    max_moves_per_job_per_h: int = Field(default=2, ge=1, le=3600)
    plan_max_jobs: int = Field(default=48, ge=0, le=1024)
    plan_gap_trigger: float = Field(default=0.02, ge=0.0, le=10.0)
    plan_lp_iterations: int = Field(default=4, ge=1, le=10_000)
    plan_lp_layouts: int = Field(default=80, ge=1, le=1_000_000)
    plan_deterministic_s: float = Field(default=0.2, gt=0.0, le=600.0)
    plan_master_columns: int = Field(default=120, ge=0, le=1_000_000)
    plan_move_price_node_pairs_per_copy_s: float = Field(default=0.013, ge=0.0, le=1e3)
    saturation: Literal["paper", "slo", "off"] = "slo"
    attach_timeout_s: float = Field(default=600.0, ge=0.0, le=1e7)
    driver_lease_s: float = Field(default=30.0, ge=0.0, le=1e6)
    queue_max_jobs: int = Field(default=1000, ge=1, le=1_000_000)
    queue_backfill: bool = True
    queue_scan_limit: int = Field(default=64, ge=1, le=100_000)
    profile_source: Literal["worst_case", "measured", "blended"] = "measured"
    measured_window: int = Field(default=16, ge=1, le=1024)
    measured_min_iterations: int = Field(default=1, ge=1, le=1024)
    measured_quantile: float = Field(default=0.9, gt=0.0, le=1.0)
    measured_margin: float = Field(default=0.99, gt=0.0, le=10.0)
    blend_prior_iterations: int = Field(default=8, ge=0, le=100_000)
    slo_watch_headroom: float = Field(default=0.0, ge=0.0, lt=1.0)
    priority_classes: tuple[str, ...] = ("production", "research", "best-effort")
    default_priority_class: str = "research"
    default_tenant: str = Field(default="default", pattern=NAME_PATTERN)
    tenants: dict[str, TenantQuota] = Field(default_factory=dict)
    preemption: bool = True
    drain_grace_s: float = Field(default=DRAIN_GRACE_S, gt=0.0, le=1e6)
    drain_max_s: float = Field(default=DRAIN_MAX_S, gt=0.0, le=1e7)
    wall_s_per_model_s: float = Field(default=1.0, gt=0.0, le=1e3)

    @field_validator("priority_classes")
    @classmethod
    def _classes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        import re

        if not 1 <= len(v) <= 16:
            raise ValueError(f"give 1 to 16 priority classes, got {len(v)}")
        bad = [c for c in v if not re.match(NAME_PATTERN, c)]
        if bad:
            raise ValueError(f"priority class names must match {NAME_PATTERN}: {bad}")
        if len(set(v)) != len(v):
            raise ValueError(f"priority classes repeat a name: {list(v)}")
        return tuple(v)

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, v: dict) -> dict:
        import re

        bad = [t for t in v if not re.match(NAME_PATTERN, t)]
        if bad:
            raise ValueError(f"tenant names must match {NAME_PATTERN}: {bad}")
        return v

    @model_validator(mode="after")
    def _default_class_known(self) -> "SchedulerConfig":
        if self.default_priority_class not in self.priority_classes:
            raise ValueError(f"default_priority_class {self.default_priority_class!r} is not one of the "
                             f"priority_classes {list(self.priority_classes)}")
        return self
    per_job_allocations: Literal["off", "simulator"] = "off"

    def runtime_refusals(self) -> list[str]:
        """The settings the cluster's runtime cannot carry out, one sentence each naming the key
        (empty: every decision this policy takes is one the runtime carries out). The
        GlobalScheduler refuses to start with any (:class:`rollmux.config.ConfigError`); the
        trace replay (``rollmux simulate``) accepts them."""
        out = []
        if self.per_job_allocations != "off":
            out.append(f"per_job_allocations: {self.per_job_allocations!r} runs a job alone in its group on its own "
                       "rescaled or colocated allocation, which only the trace replay carries out (the runtime places "
                       "co-execution groups on whole nodes); set per_job_allocations: \"off\"")
        return out

    def planning_profile(self, declared, measured=None, prior=None):
        """The profile a decision plans a job with under :attr:`profile_source`
        (:func:`rollmux.measured.planning_profile` with these settings)."""
        from rollmux.measured import planning_profile

        return planning_profile(self.profile_source, declared, measured, min_iterations=self.measured_min_iterations,
                                quantile=self.measured_quantile, margin=self.measured_margin, prior=prior,
                                prior_iterations=self.blend_prior_iterations)

    def sha256(self) -> str:
        """SHA-256 of these settings (their JSON form, keys sorted): which settings a scheduler
        runs with (``GlobalScheduler.health``'s ``config_sha256``), compared by ``rollmux up``."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()

    def overridden(self, **values) -> "SchedulerConfig":
        """A validated copy with the given values; ``None`` values are ignored (an option not
        given keeps the config's value). How the cluster and ``rollmux simulate`` apply explicit
        arguments / flags over ``configs/scheduler.yaml``."""
        upd = {k: v for k, v in values.items() if v is not None}
        return SchedulerConfig.model_validate({**self.model_dump(), **upd}) if upd else self

    @property
    def planned_rollout_overhead_s(self) -> float:
        """Seconds the SLO check adds to every rollout of a co-executed group: ``migration_overhead_s``
        with ``plan_migration_overhead``, else 0 (:func:`rollmux.intra_group.coexec_times`'s
        ``rollout_overhead_s``)."""
        return self.migration_overhead_s if self.plan_migration_overhead else 0.0

    def long_tail_policy(self) -> LongTailPolicy:
        """The long-tail migration settings as a :class:`LongTailPolicy` (RollMux §4.3)."""
        return LongTailPolicy(self.tail_trigger_fraction, self.tail_gpus, self.migration_overhead_s)

    def controller_settings(self) -> dict:
        """Keyword arguments of a GroupController that carry these long-tail settings."""
        return {"migrate": self.tail_migration, "tail_trigger_fraction": self.tail_trigger_fraction,
                "tail_gpus": self.tail_gpus, "migration_overhead_s": self.migration_overhead_s,
                "lease_s": self.driver_lease_s}


def load_scheduler_config(path: Union[str, Path, None] = None) -> SchedulerConfig:
    """``configs/scheduler.yaml`` (or ``path``) as a :class:`SchedulerConfig`.
    Raises :class:`rollmux.config.ConfigError` naming the field."""
    return load_model(path or CONFIG_DIR / "scheduler.yaml", SchedulerConfig)

