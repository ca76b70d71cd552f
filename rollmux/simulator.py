"""Trace-driven, event-driven simulator: replays job arrivals through a scheduling policy.

Model (RollMux §7.4–§7.5):

* A job's work is its trace duration at solo speed: ``iterations = duration_s / T_solo``, with
  ``T_solo`` its solo iteration time under the *realised* phase times.
* Between two events (an arrival or a departure) group membership is fixed: every job advances at
  ``1 / t_iter`` iterations per second, ``t_iter`` its realised co-execution iteration time in
  its current unit (:class:`rollmux.baselines.Unit`), obtained by simulating the group's
  round-robin meta-iterations (:func:`rollmux.intra_group.simulate_group`). When membership
  changes, the affected rates change. A job departs when its iterations are done; its unit
  releases GPUs (an empty group is dissolved by the scheduler).
* Realisation. Deterministic (default, as in the paper's simulation §7.5): realised phase times
  equal the worst-case planning times (``spec.measured`` of the drawn jobs). ``stochastic=True``:
  each job gets ``stochastic_samples`` seeded iterations from
  :func:`rollmux.profiler.sample_iteration` (long-tailed response lengths, clipped at the max
  tokens); groups are simulated on them with :class:`rollmux.intra_group.LongTailPolicy`
  migration, solo times are the mean of the same samples. The same job gets the same samples
  under every policy.
* Slowdown of a job = lifetime / trace duration (= lifetime-average co-execution iteration time
  over its realised solo time); its SLO is met iff slowdown <= ``spec.slo``.
* Cost: the sum of the units' $/h, integrated over time. ``avg_cost_usd_per_h`` divides the
  integral by the *common* horizon (the last departure over all policies of a run), so averages
  compare total spend. Bubble ratio per pool = idle GPU-seconds / provisioned GPU-seconds over the
  whole replay: busy GPU-seconds come from each unit's realised timeline
  (:func:`rollmux.occupancy.occupancy`: GPU-weighted, the union of busy intervals per node), from
  the unit's formation (an empty pipeline: warm-up counts) to its end, the steady-state rate
  continuing past the simulated window (:meth:`Realisation.busy_gpu_s`).
* Decision latency: wall time of each arrival's placement decision (the scheduler's own
  ``latency_ms``; the optimum's re-partition time; the per-job baselines' allocation time).
* The optimum re-partitions the active jobs at every event (offline, migrations free); it is
  exact up to ``exact_max_jobs`` active jobs, a labelled best-found upper bound beyond. Since its
  job set over time differs from an online policy's (departures depend on slowdowns), the
  clean comparison is ``cost_vs_optimal_exact``: during the online policy's own replay, the exact
  optimum of the *same* active jobs at the same instants, integrated where exact.

Differences from the paper's figures (reported, not tuned): job profiles are synthetic
(Table-6-style uniform phase times, since the paper's production trace is not public), SLOs are
U(1, 2) so many jobs tolerate little sharing, groups are formed in whole 8-GPU nodes, and
colocated / Gavel+ phase times come from this project's roofline, under which an H800 decodes
about as fast as an H20 (3.35 vs 4.0 TB/s HBM), so colocation is not penalised as heavily as
in the paper's testbed. In this work-conserving fluid model, SLO-blind over-packing (random,
most-idle) is cheap per unit of work: it trades slowdown for cost.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from rollmux import profiler
from rollmux.baselines import PER_JOB_UNITS, OptimalPartition, Unit
from rollmux.policies import POLICY_NAMES, check_policy, policy_spec
from rollmux.intra_group import IterationTimes, LongTailPolicy, PhaseRecord, simulate_group, steady_schedule
from rollmux.models import ClusterSpec, CoExecutionGroup, JobSpec, PhaseProfile
from rollmux.workloads import SimJob

#: Paper's reported cost ratios of Solo-D and colocated veRL to RollMux (RollMux §7.4, Fig. 13a).
PAPER_RATIOS = {"solo-d_over_rollmux": 1.84, "colocated_over_rollmux": 1.38}
_EPS = 1e-9


# --- realisation of phase times -------------------------------------------------------------------


class Realisation:
    """Realised phase times of jobs and groups (deterministic or stochastic), cached.

    Args:
        cluster: the simulated cluster.
        stochastic: draw long-tailed rollouts per iteration (see module docstring).
        seed: seeds each job's samples (``(seed, crc32(job_id))``).
        samples: iterations sampled per job in stochastic mode.
        long_tail: migration policy used for stochastic group schedules (default: the settings
            of ``configs/scheduler.yaml``; ``tail_migration: false`` there turns it off).
    """

    def __init__(self, cluster: ClusterSpec, *, stochastic: bool = False, seed: int = 0, samples: int = 8,
                 long_tail: Optional[LongTailPolicy] = None) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.cluster = cluster
        self.stochastic = stochastic
        self.seed = seed
        self.samples = samples
        if long_tail is None:
            from rollmux.admission import load_scheduler_config

            cfg = load_scheduler_config()
            long_tail = cfg.long_tail_policy()
            self.migrate = cfg.tail_migration
        else:
            self.migrate = True
        self.long_tail = long_tail
        self._iters: dict[str, list[IterationTimes]] = {}
        self._units: dict[tuple, Unit] = {}
        self._schedules: dict[tuple, object] = {}
        self._curves: dict[tuple, tuple] = {}  # (unit key, job ids) -> (BusyCurve, w0, w1)
        self._keys_of: dict[str, list[tuple[dict, tuple]]] = {}  # job id -> (cache, key) holding it (forget)

    def iterations_of(self, spec: JobSpec) -> list[IterationTimes]:
        """The job's sampled iterations (stochastic) or its planning profile once (deterministic)."""
        if spec.job_id not in self._iters:
            prof = profiler.estimate(spec, self.cluster)
            if not self.stochastic:
                its = [IterationTimes(prof.t_roll_s, prof.t_train_s, prof.t_sync_s)]
            else:
                rng = np.random.default_rng([self.seed, zlib.crc32(spec.job_id.encode())])
                its = [
                    profiler.sample_iteration(spec, self.cluster, rng, trigger_fraction=self.long_tail.trigger_fraction, profile=prof)
                    for _ in range(self.samples)
                ]
            self._iters[spec.job_id] = its
        return self._iters[spec.job_id]

    def mean_profile(self, spec: JobSpec) -> PhaseProfile:
        """Mean realised phase times of ``spec`` (its own hardware), seconds."""
        its = self.iterations_of(spec)
        k = len(its)
        return PhaseProfile(
            t_roll_s=max(_EPS, sum(i.t_roll_s for i in its) / k),
            t_train_s=max(_EPS, sum(i.t_train_s for i in its) / k),
            t_sync_s=sum(i.t_sync_s for i in its) / k,
        )

    def solo_time_s(self, spec: JobSpec) -> float:
        """Realised solo iteration time (mean over the samples), seconds."""
        return self.mean_profile(spec).t_solo_s

    @staticmethod
    def _group_key(group: CoExecutionGroup) -> tuple:
        return (group.rollout_nodes, group.train_nodes) + tuple(
            (m.spec.job_id, m.placement.rollout_nodes, m.placement.train_nodes) for m in group.members
        )

    def gpus_per_node(self) -> dict[str, int]:
        """GPUs per node of each pool of the simulated cluster."""
        c = self.cluster
        return {"rollout": c.rollout_pool.node.gpus_per_node, "train": c.train_pool.node.gpus_per_node}

    def schedule(self, group: CoExecutionGroup, *, record_timeline: bool = False):
        """Realised round-robin schedule of ``group`` (:class:`rollmux.intra_group.GroupSchedule`),
        GPU-weighted (records carry the GPUs each job uses per node)."""
        key = self._group_key(group) + (record_timeline,)
        if key not in self._schedules:
            gpn = self.gpus_per_node()
            if self.stochastic:
                times = {m.spec.job_id: self.iterations_of(m.spec) for m in group.members}
                n = len(group.members)
                self._schedules[key] = simulate_group(
                    group, meta_iterations=max(2 * n + 4, 2 * self.samples), phase_times=times,
                    long_tail=self.long_tail if self.migrate else None, record_timeline=record_timeline, gpus_per_node=gpn,
                )
            else:
                self._schedules[key] = simulate_group(group, record_timeline=record_timeline, gpus_per_node=gpn)
            self._remember(self._schedules, key, group)
        return self._schedules[key]

    def _remember(self, cache: dict, key: tuple, group: CoExecutionGroup) -> None:
        for jid in group.job_ids:
            self._keys_of.setdefault(jid, []).append((cache, key))

    def group_unit(self, group: CoExecutionGroup) -> Unit:
        """The group as a simulator unit: its price, GPUs, realised iteration times, busy GPUs."""
        key = self._group_key(group)
        if key not in self._units:
            c = self.cluster
            # deterministic: the steady state without the event simulation (the same figures,
            # bit for bit: intra_group.steady_schedule)
            s = self.schedule(group) if self.stochastic else steady_schedule(group, gpus_per_node=self.gpus_per_node())
            rg = len(group.rollout_nodes) * c.rollout_pool.node.gpus_per_node
            tg = len(group.train_nodes) * c.train_pool.node.gpus_per_node
            self._units[key] = Unit(
                key=group.group_id,
                job_ids=group.job_ids,
                cost_usd_per_h=group.cost_usd_per_h(c),
                rollout_gpus=rg,
                train_gpus=tg,
                iter_time_s=dict(s.t_coexec_s),
                rollout_busy_gpus=rg * s.busy_fraction["rollout"],
                train_busy_gpus=tg * s.busy_fraction["train"],
            )
            self._curves[(group.group_id, group.job_ids)] = (s.busy_curve, *s.window_s)
            self._remember(self._units, key, group)
        return self._units[key]

    def busy_params(self, unit: Unit) -> tuple:
        """What :meth:`busy_gpu_s` reads for ``unit``, looked up once: ``(curve, w1, busy rollout
        GPU-s at w1, busy training GPU-s at w1, steady rollout GPUs, steady training GPUs)``;
        ``curve`` is None for a per-job unit (then ``w1`` is None)."""
        cur = self._curves.get((unit.key, unit.job_ids))
        if cur is None:
            return None, None, 0.0, 0.0, unit.rollout_busy_gpus, unit.train_busy_gpus
        curve, _, w1 = cur
        return (curve, w1, curve.cumulative("rollout", w1), curve.cumulative("train", w1),
                unit.rollout_busy_gpus, unit.train_busy_gpus)

    @staticmethod
    def busy_from_params(params: tuple, age0_s: float, age1_s: float) -> tuple[float, float]:
        """:meth:`busy_gpu_s` from :meth:`busy_params` (the same arithmetic, bit for bit)."""
        curve, w1, c_r, c_t, s_r, s_t = params
        if curve is None:
            d = max(0.0, age1_s - age0_s)
            return s_r * d, s_t * d
        if age0_s > w1:  # both ends past the simulated window: steady state
            return (c_r + s_r * (age1_s - w1)) - (c_r + s_r * (age0_s - w1)), (c_t + s_t * (age1_s - w1)) - (c_t + s_t * (age0_s - w1))
        cum = curve.cumulative
        r1 = cum("rollout", age1_s) if age1_s <= w1 else c_r + s_r * (age1_s - w1)
        t1 = cum("train", age1_s) if age1_s <= w1 else c_t + s_t * (age1_s - w1)
        return r1 - cum("rollout", age0_s), t1 - cum("train", age0_s)

    def busy_gpu_s(self, unit: Unit, age0_s: float, age1_s: float) -> tuple[float, float]:
        """Busy GPU-seconds (rollout, train) of ``unit`` between ages ``age0_s`` and ``age1_s``
        (seconds since the unit was formed).

        A co-execution group's busy time follows its realised timeline from an empty pipeline
        (:class:`rollmux.occupancy.BusyCurve`: GPU-weighted, union of busy intervals), so the
        warm-up after each formation counts; past the simulated window it continues at the
        steady-state rate. A per-job unit runs its phases back to back, so its busy GPU-seconds
        grow at ``*_busy_gpus`` (exact at every iteration boundary).
        """
        cur = self._curves.get((unit.key, unit.job_ids))
        if cur is None:
            d = max(0.0, age1_s - age0_s)
            return unit.rollout_busy_gpus * d, unit.train_busy_gpus * d
        curve, w0, w1 = cur

        def cum(pool: str, a: float, steady_gpus: float) -> float:
            return curve.cumulative(pool, a) if a <= w1 else curve.cumulative(pool, w1) + steady_gpus * (a - w1)

        return (cum("rollout", age1_s, unit.rollout_busy_gpus) - cum("rollout", age0_s, unit.rollout_busy_gpus),
                cum("train", age1_s, unit.train_busy_gpus) - cum("train", age0_s, unit.train_busy_gpus))

    def forget(self, job_id: str) -> None:
        """Drop cached schedules containing a departed job (bounds memory)."""
        for cache, k in self._keys_of.pop(job_id, ()):
            cache.pop(k, None)
        for k in [k for k in self._curves if job_id in k[1]]:
            del self._curves[k]


# --- policies as seen by the simulator ------------------------------------------------------------


class SimPolicy:
    """Interface of a policy inside the replay: ``arrive`` / ``depart`` change state; ``units``
    gives the current allocation. ``arrive`` returns the decision latency in ms."""

    name: str = ""
    #: simulated time of the event being handled, s (set by :func:`replay` before each call)
    clock: float = 0.0

    def arrive(self, job: SimJob) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def take_started(self) -> Optional[list[str]]:
        """Jobs that started running since the last call (a queued policy: an arrival admitted at
        once, queued jobs admitted after a departure). None: every arrival starts at once."""
        return None

    def depart(self, job_id: str) -> Optional[dict[str, float]]:  # pragma: no cover - interface
        """Remove a finished job. May return ``{job_id: stall_s}`` for other jobs the policy
        moved as a consequence (departure re-packing): each loses ``stall_s`` of progress."""
        raise NotImplementedError

    def pop_stalls(self) -> dict[str, float]:
        """Stalls of jobs the policy moved on an arrival (re-optimisation): ``{job_id: stall_s}``,
        each loses ``stall_s`` of progress; cleared by the call."""
        return {}

    def extra(self) -> dict:
        """Policy-specific facts for summary.json."""
        return {}

    def units(self) -> list[Unit]:  # pragma: no cover - interface
        raise NotImplementedError

    def groups(self) -> list[CoExecutionGroup]:
        """Current co-execution groups (empty for per-job baselines)."""
        return []


class SchedulerPolicy(SimPolicy):
    """RollMux / random / most-idle: :class:`rollmux.admission.InterGroupScheduler` (Alg. 1 or
    the greedy baselines), one admission per arrival, departures release GPUs; RollMux then
    re-packs (``repack``, :meth:`InterGroupScheduler.repack`); after every admission and
    departure it re-optimises the event's neighbourhood (:meth:`InterGroupScheduler.reoptimise`),
    and each moved job stalls for its host-state copy (``move_s``).

    ``queue=True`` (a bounded cluster): a job refused ``retry_later`` waits in the scheduler's
    :class:`rollmux.admission_queue.AdmissionQueue` (the cluster's own queue code), which is
    drained through Alg. 1 after every departure; ``never`` refusals and arrivals to a full queue
    are counted in ``refused`` and not replayed."""

    def __init__(self, name: str, cluster: ClusterSpec, real: Realisation, *, max_group_size: Optional[int] = None,
                 seed: Optional[int] = None, repack: Optional[bool] = None, config=None, queue: bool = False):
        from rollmux.admission import InterGroupScheduler, SchedulerConfig
        from rollmux.admission_queue import AdmissionQueue

        self.name = name
        self.spec = policy_spec(name, "scheduler")
        self.real = real
        # the same SchedulerConfig the cluster's GlobalScheduler builds its policy from; arguments
        # given here override a copy of it, the policy is this one. Stochastic replays migrate long
        # tails: admission then plans the migration overhead of every rollout.
        cfg = (config or SchedulerConfig()).overridden(policy=name, max_group_size=max_group_size, seed=seed,
                                                      repack_on_departure=repack,
                                                      migration_overhead_s=real.long_tail.migration_overhead_s,
                                                      plan_migration_overhead=real.stochastic and real.migrate)
        self.sched = InterGroupScheduler(cluster, config=cfg)
        self._seen: dict[int, tuple] = {}  # id(group record) -> (record, unit)
        # the solver of the neighbourhood re-optimisation (InterGroupScheduler.reoptimise)
        self.solver = OptimalPartition(cluster, max_group_size=cfg.max_group_size,
                                       exact_max_jobs=max(2, cfg.reopt_max_jobs), time_limit_s=2.0)
        self.moves = 0
        self.move_s = 0.0
        self.reopt_ms: list[float] = []  # re-optimisation after each admission (after the decision), ms
        self._stalls: dict[str, float] = {}
        self.queue = AdmissionQueue.from_config(cfg) if queue else None
        self._started: list[str] = []
        self.refused: list[str] = []
        self.queue_peak = 0

    def arrive(self, job: SimJob) -> float:
        if self.queue is not None and not self.queue.may_try_now(job.spec):  # FIFO: behind larger held jobs
            return self._hold(job, 0.0, "queued behind larger jobs")
        d = self.sched.admit(job.spec, job.profile)
        if d.admitted:
            self._started.append(job.spec.job_id)
            t0 = time.perf_counter()
            moves = self.sched.reoptimise(self.sched.group_of(job.spec.job_id).group_id, fresh=job.spec.job_id,
                                          solver=self.solver)
            self.reopt_ms.append((time.perf_counter() - t0) * 1e3)
            self._moved(moves)
        elif self.queue is not None and d.code == "retry_later":
            return self._hold(job, float(d.latency_ms), d.reason)
        elif self.queue is not None:
            self.refused.append(job.spec.job_id)
        else:
            raise RuntimeError(f"{self.name}: job {job.spec.job_id} was refused ({d.code}: {d.reason}); "
                               "the simulation cluster must be unbounded (or replay with the admission queue)")
        return float(d.latency_ms)

    def _hold(self, job: SimJob, ms: float, reason: str) -> float:
        from rollmux.admission_queue import QueueFull

        try:
            self.queue.push(job.spec, self.clock, profile=job.profile, reason=reason)  # type: ignore[union-attr]
        except QueueFull:
            self.refused.append(job.spec.job_id)
        self.queue_peak = max(self.queue_peak, len(self.queue))  # type: ignore[arg-type]
        return ms

    def take_started(self) -> Optional[list[str]]:
        if self.queue is None:
            return None
        out, self._started = self._started, []
        return out

    @property
    def waiting(self) -> int:
        return 0 if self.queue is None else len(self.queue)

    def _moved(self, moves: list[dict]) -> None:
        """Count the moves of started jobs (a just-admitted job placed anew copies nothing, ``move_s``
        0); each moved job stalls for its host-state copy (summed per job)."""
        moves = [m for m in moves if m["move_s"] > 0]
        self.moves += len(moves)
        for m in moves:
            self.move_s += m["move_s"]
            self._stalls[m["job_id"]] = self._stalls.get(m["job_id"], 0.0) + m["move_s"]

    def pop_stalls(self) -> dict[str, float]:
        out, self._stalls = self._stalls, {}
        return out

    def depart(self, job_id: str) -> Optional[dict[str, float]]:
        gid = self.sched.group_of(job_id).group_id
        self.sched.depart(job_id)
        self.solver.forget(job_id)
        self._moved(self.sched.repack(gid))
        self._moved(self.sched.reoptimise(gid, solver=self.solver))
        if self.queue is not None:  # the freed room goes to queued jobs (in order, with backfill)
            res = self.queue.drain(self.sched, self.clock)
            self._started.extend(q.job_id for q, _ in res.admitted)
            self.refused.extend(q.job_id for q, _ in res.dropped)
        return self.pop_stalls()

    def extra(self) -> dict:
        out = {} if self.queue is None else {"queue_refused_jobs": len(self.refused), "queue_peak_jobs": self.queue_peak}
        if not self.spec.repacks:
            return out
        r = sorted(self.reopt_ms)
        return {**out, "repack_on_departure": self.sched.config.repack_on_departure, "jobs_moved": self.moves,
                "move_stall_h": self.move_s / 3600.0,
                "reopt_latency_ms_p50": r[len(r) // 2] if r else None,
                "reopt_latency_ms_max": r[-1] if r else None}

    def groups(self) -> list[CoExecutionGroup]:
        return list(self.sched.groups)

    def units(self) -> list[Unit]:
        # a group record is replaced whenever the group changes: unchanged groups keep their unit
        # without rebuilding its cache key
        seen = self._seen
        out, now = [], {}
        for g in self.sched.groups:
            if not g.members:
                continue
            e = seen.get(id(g))
            if e is None or e[0] is not g:
                e = (g, self.real.group_unit(g))
            now[id(g)] = e
            out.append(e[1])
        self._seen = now
        return out


class PerJobPolicy(SimPolicy):
    """Solo-D, colocated, Gavel+: every job alone on its own allocation (no co-execution)."""

    def __init__(self, name: str, cluster: ClusterSpec, real: Realisation):
        self.name, self.cluster, self.real = name, cluster, real
        self.spec = policy_spec(name, "per_job")
        self._units: dict[str, Unit] = {}

    def arrive(self, job: SimJob) -> float:
        t0 = time.perf_counter()
        spec = job.spec
        u = PER_JOB_UNITS[self.spec.unit](spec, self.cluster, self.real)  # type: ignore[index]
        self._units[spec.job_id] = u
        return (time.perf_counter() - t0) * 1000.0

    def depart(self, job_id: str) -> None:
        del self._units[job_id]

    def units(self) -> list[Unit]:
        return list(self._units.values())


class OptimalPolicy(SimPolicy):
    """Offline optimum: at every event, the cheapest partition of the active jobs into feasible
    groups (:class:`rollmux.baselines.OptimalPartition`), re-partitioning allowed; a lower bound
    on any online policy's cost at that instant where ``exact``."""

    name = "optimal"

    def __init__(self, cluster: ClusterSpec, real: Realisation, *, max_group_size: int = 5, exact_max_jobs: int = 16,
                 time_limit_s: float = 5.0):
        self.real = real
        self.opt = OptimalPartition(cluster, max_group_size=max_group_size, exact_max_jobs=exact_max_jobs,
                                    time_limit_s=time_limit_s)
        self._active: dict[str, SimJob] = {}
        self._groups: list[CoExecutionGroup] = []
        self.exact_events = 0
        self.events = 0

    def _resolve(self) -> float:
        res = self.opt.solve([(j.spec, j.profile) for j in self._active.values()])
        self._groups = res.groups
        self.events += 1
        self.exact_events += int(res.exact)
        return res.solve_ms

    def arrive(self, job: SimJob) -> float:
        self._active[job.spec.job_id] = job
        return self._resolve()

    def depart(self, job_id: str) -> None:
        del self._active[job_id]
        self.opt.forget(job_id)
        self._resolve()

    def groups(self) -> list[CoExecutionGroup]:
        return list(self._groups)

    def units(self) -> list[Unit]:
        return [self.real.group_unit(g) for g in self._groups]


def make_policy(name: str, cluster: ClusterSpec, real: Realisation, *, max_group_size: Optional[int] = None,
                seed: Optional[int] = None, exact_max_jobs: int = 16, repack: Optional[bool] = None,
                config=None, queue: bool = False) -> SimPolicy:
    """The replay's view of the policy ``name`` (:data:`rollmux.policies.REGISTRY`, by its ``kind``).
    ``config``: the :class:`rollmux.admission.SchedulerConfig` (default: its defaults);
    ``max_group_size`` / ``seed`` / ``repack`` (departure re-packing) override a copy of it when
    given. ``queue``: hold jobs that do not fit a bounded cluster in the admission queue (policies
    of kind ``scheduler`` only). Raises ValueError for an unknown name (message lists the known
    ones) or ``queue`` with a policy that does not admit through the scheduler."""
    from rollmux.admission import SchedulerConfig

    cfg = (config or SchedulerConfig()).overridden(max_group_size=max_group_size, seed=seed, repack_on_departure=repack)
    kind = policy_spec(name).kind
    if queue and kind != "scheduler":
        raise ValueError(f"policy {name!r} does not admit through the scheduler, so it cannot replay with the "
                         "admission queue (queued replays: the policies of kind 'scheduler', e.g. rollmux, random, most-idle)")
    if kind == "scheduler":
        return SchedulerPolicy(name, cluster, real, config=cfg, queue=queue)
    if kind == "optimal":
        return OptimalPolicy(cluster, real, max_group_size=cfg.max_group_size, exact_max_jobs=exact_max_jobs)
    return PerJobPolicy(name, cluster, real)


# --- the replay -----------------------------------------------------------------------------------


@dataclass
class JobOutcome:
    """One job's life under a policy: arrival, departure, slowdown (lifetime / duration), SLO."""

    job_id: str
    arrival_s: float
    departure_s: float
    duration_s: float
    slo: float
    solo_real_over_planned: float = 1.0  # realised solo time / worst-case (planning) solo time
    start_s: Optional[float] = None  # admission (after the admission queue); None = at arrival

    @property
    def wait_s(self) -> float:
        """Time in the admission queue, s (0 unless replayed with the queue)."""
        return 0.0 if self.start_s is None else self.start_s - self.arrival_s

    @property
    def slowdown(self) -> float:
        """Running time (from admission) over the solo duration; the queue wait is :attr:`wait_s`."""
        return (self.departure_s - (self.arrival_s if self.start_s is None else self.start_s)) / self.duration_s

    @property
    def slowdown_vs_planned_solo(self) -> float:
        """Lifetime-average iteration time over the *worst-case* solo time: what worst-case
        admission bounds (RollMux §4.2); equals :attr:`slowdown` in deterministic replays."""
        return self.slowdown * self.solo_real_over_planned

    @property
    def slo_met(self) -> bool:
        return self.slowdown <= self.slo * (1 + 1e-6)


@dataclass
class PolicyRun:
    """Result of replaying a trace through one policy.

    Attributes:
        times_s / cost_usd_per_h / rollout_gpus / train_gpus: step series (value from ``times_s[i]``).
        cost_usd: integral of cost over the replay, $.
        rollout_gpu_s / train_gpu_s: provisioned GPU-seconds; ``*_busy_gpu_s`` busy ones.
        end_s: last departure.
        decision_ms: one latency per arrival.
        outcomes: per job.
        gantt_group / gantt_timeline: the largest group seen and its realised timeline (for plots).
        extra: policy-specific facts (optimum exactness).
    """

    policy: str
    times_s: list[float] = field(default_factory=list)
    cost_usd_per_h: list[float] = field(default_factory=list)
    rollout_gpus: list[int] = field(default_factory=list)
    train_gpus: list[int] = field(default_factory=list)
    cost_usd: float = 0.0
    rollout_gpu_s: float = 0.0
    train_gpu_s: float = 0.0
    rollout_busy_gpu_s: float = 0.0
    train_busy_gpu_s: float = 0.0
    end_s: float = 0.0
    decision_ms: list[float] = field(default_factory=list)
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    gantt_group: Optional[CoExecutionGroup] = None
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)
    shadow_s: float = 0.0
    shadow_policy_usd: float = 0.0
    shadow_optimal_usd: float = 0.0
    shadow_outside: int = 0
    shadow_instants: list = field(default_factory=list)  # (t_s, policy $/h, exact optimum $/h) where compared
    # the policy's excess over the exact optimum ($, where compared) by the event that opened the
    # interval ("arrival" | "departure"), and time-weighted jobs per group of both (s * jobs/group)
    shadow_gap_usd_by_event: dict = field(default_factory=dict)
    shadow_jobs_per_group_s: list = field(default_factory=lambda: [0.0, 0.0])

    def metrics(self, horizon_s: Optional[float] = None) -> dict:
        """The summary.json entry of this policy (its keys are a stable interface)."""
        h = horizon_s if horizon_s is not None else self.end_s
        lat = np.asarray(self.decision_ms or [0.0])
        outs = list(self.outcomes.values())
        return {
            "avg_cost_usd_per_h": self.cost_usd / (h / 3600.0) if h > 0 else 0.0,
            "peak_cost_usd_per_h": max(self.cost_usd_per_h, default=0.0),
            "slo_attainment": sum(o.slo_met for o in outs) / len(outs) if outs else 1.0,
            # iteration time within slo x the worst-case solo time (the bound admission guarantees)
            "slo_attainment_vs_planned_solo": (sum(o.slowdown_vs_planned_solo <= o.slo * (1 + 1e-6) for o in outs) / len(outs)
                                               if outs else 1.0),
            "max_slowdown_over_slo": float(max((o.slowdown / o.slo for o in outs), default=0.0)),
            "peak_rollout_gpus": int(max(self.rollout_gpus, default=0)),
            "peak_train_gpus": int(max(self.train_gpus, default=0)),
            "rollout_bubble_ratio": 1.0 - self.rollout_busy_gpu_s / self.rollout_gpu_s if self.rollout_gpu_s > 0 else 0.0,
            "train_bubble_ratio": 1.0 - self.train_busy_gpu_s / self.train_gpu_s if self.train_gpu_s > 0 else 0.0,
            # one decision per arrival: a p99 of fewer than 1,000 would be about their maximum
            "decision_latency_samples": len(self.decision_ms),
            "decision_latency_ms_p50": float(np.percentile(lat, 50)),
            "decision_latency_ms_p99": float(np.percentile(lat, 99)) if len(self.decision_ms) >= 1000 else None,
            "decision_latency_ms_max": float(lat.max()),
            "total_cost_usd": self.cost_usd,
            "mean_slowdown": float(np.mean([o.slowdown for o in outs])) if outs else 1.0,
            "max_slowdown": float(max((o.slowdown for o in outs), default=1.0)),
            "jobs": len(outs),
            "makespan_h": self.end_s / 3600.0,
            **self.extra,
        } | ({
            # admission-queue waits (a bounded cluster replayed with the queue), over replayed jobs
            "queue_wait_s_mean": float(np.mean(waits)),
            "queue_wait_s_p50": float(np.percentile(waits, 50)),
            "queue_wait_s_p90": float(np.percentile(waits, 90)),
            "queue_wait_s_max": float(waits.max()),
            "queued_jobs": int((waits > 0).sum()),
        } if (waits := np.asarray([o.wait_s for o in outs])).size and "queue_peak_jobs" in self.extra else {}) | ({
            "cost_vs_optimal_exact": self.shadow_policy_usd / self.shadow_optimal_usd if self.shadow_optimal_usd > 0 else None,
            "optimal_exact_time_fraction": self.shadow_s / self.end_s if self.end_s > 0 else 0.0,
            "optimal_exact_spend_fraction": self.shadow_policy_usd / self.cost_usd if self.cost_usd > 0 else 0.0,
            "optimal_exact_events_outside_layouts": self.shadow_outside,
        } if self.shadow_s > 0 else {})


def replay(
    jobs: Sequence[SimJob],
    policy: SimPolicy,
    real: Realisation,
    *,
    on_event: Optional[Callable[[int], None]] = None,
    max_events: Optional[int] = None,
    shadow: Optional[OptimalPartition] = None,
) -> PolicyRun:
    """Replay ``jobs`` (arrival order) through ``policy``: event-driven fluid progress.

    Args:
        jobs: the workload (see :func:`rollmux.workloads.draw_jobs`).
        policy: from :func:`make_policy`.
        real: realisation shared by every policy of a run.
        on_event: called with 1 after each arrival or departure (progress bars).
        max_events: bound on events (default ``2 * len(jobs) + 10``).
        shadow: when given, at every event with at most ``shadow.exact_max_jobs`` active jobs the
            exact optimum of *this policy's* active set is computed, and the policy's and the
            optimum's costs are integrated over those intervals (``cost_vs_optimal_exact``: a
            same-jobs, same-instant comparison, RollMux §7.5 "x of optimal").
    Returns:
        :class:`PolicyRun` with series, integrals and per-job outcomes.
    Raises:
        ValueError: duplicate job ids or arrivals out of order; RuntimeError when the bound on
        events is hit or a job stops progressing.
    """
    t_wall = time.perf_counter()
    ids = [j.spec.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("replay: duplicate job ids")
    if any(b.arrival_s < a.arrival_s for a, b in zip(jobs, jobs[1:])):
        raise ValueError("replay: jobs must be sorted by arrival_s")
    run = PolicyRun(policy=policy.name)
    bound = max_events if max_events is not None else 2 * len(jobs) + 10
    remaining: dict[str, float] = {}
    by_id = {j.spec.job_id: j for j in jobs}
    rate: dict[str, float] = {}
    cost = rg = tg = 0.0
    units: list[Unit] = []
    born: dict[tuple, float] = {}  # unit identity -> when it was formed (its pipeline starts empty)
    t, i, events = 0.0, 0, 0
    start_s: dict[str, float] = {}
    done_at: dict[str, float] = {}  # iterations left at which a job counts as done
    params: dict[int, tuple] = {}  # id(unit) -> (unit, Realisation.busy_params(unit)) of the current units
    uparams: list[tuple] = []  # (born key, busy params) per current unit, in unit order

    def start(jid: str) -> None:
        sj = by_id[jid]
        remaining[jid] = sj.duration_s / real.solo_time_s(sj.spec)
        start_s[jid] = t
        done_at[jid] = _EPS * max(1.0, sj.iterations)
    best_group_size = 0
    shadow_cost: Optional[float] = None
    shadow_jpg = [0.0, 0.0]  # jobs per group now: the policy's, the optimum's
    last_event = "arrival"
    stalls: dict[str, float] = {}
    queued = False  # the policy holds jobs in an admission queue (take_started is not None)

    def refresh() -> None:
        nonlocal cost, rg, tg, units, best_group_size, shadow_cost, params, uparams
        units = policy.units()
        cur = {}
        for u in units:
            e = params.get(id(u))
            cur[id(u)] = e if e is not None and e[0] is u else (u, real.busy_params(u))
        params = cur
        uparams = [((u.key, u.job_ids), params[id(u)][1]) for u in units]
        rate.clear()
        cost = sum(u.cost_usd_per_h for u in units)
        rg = sum(u.rollout_gpus for u in units)
        tg = sum(u.train_gpus for u in units)
        ids = {(u.key, u.job_ids) for u in units}
        for k in [k for k in born if k not in ids]:
            del born[k]
        for k in ids:
            born.setdefault(k, t)
        for u in units:
            for jid, it in u.iter_time_s.items():
                if not (it > 0 and math.isfinite(it)):
                    raise RuntimeError(f"{policy.name}: job {jid} has iteration time {it}")
                rate[jid] = 1.0 / it
        missing = set(remaining) - set(rate)
        if missing:
            raise RuntimeError(f"{policy.name}: active jobs without an allocation: {sorted(missing)[:5]}")
        for g in policy.groups():
            if len(g.members) > best_group_size:
                best_group_size = len(g.members)
                run.gantt_group = g
        shadow_cost = None
        if shadow is not None and 0 < len(remaining) <= shadow.exact_max_jobs:
            res = shadow.solve([(by_id[j].spec, by_id[j].profile) for j in remaining])
            if res.exact and shadow.dominates([([(by_id[j].spec, by_id[j].profile) for j in u.job_ids], u.cost_usd_per_h)
                                               for u in units]):
                shadow_cost = res.cost_usd_per_h
                run.shadow_instants.append((t, cost, shadow_cost))
                shadow_jpg[:] = [len(remaining) / max(1, len(units)), len(remaining) / max(1, len(res.groups))]
            elif res.exact:
                run.shadow_outside += 1
        run.times_s.append(t)
        run.cost_usd_per_h.append(cost)
        run.rollout_gpus.append(int(rg))
        run.train_gpus.append(int(tg))

    while i < len(jobs) or remaining or getattr(policy, "waiting", 0):
        events += 1
        if events > bound:
            raise RuntimeError(f"{policy.name}: more than {bound} events")
        if i >= len(jobs) and not remaining:  # only queued jobs left and nothing will depart
            raise RuntimeError(f"{policy.name}: {getattr(policy, 'waiting', 0)} queued jobs can never be admitted")
        t_arr = jobs[i].arrival_s if i < len(jobs) else math.inf
        t_dep, j_dep = math.inf, None
        for jid, left in remaining.items():
            td = t + left / rate[jid]
            if td < t_dep:
                t_dep, j_dep = td, jid
        t_next = min(t_arr, t_dep)
        dt = t_next - t
        if dt > 0:
            run.cost_usd += cost * dt / 3600.0
            run.rollout_gpu_s += rg * dt
            run.train_gpu_s += tg * dt
            busy = real.busy_from_params
            for bk, prm in uparams:
                age = t - born[bk]
                b_r, b_t = busy(prm, age, age + dt)
                run.rollout_busy_gpu_s += b_r
                run.train_busy_gpu_s += b_t
            if shadow_cost is not None:
                run.shadow_gap_usd_by_event[last_event] = (run.shadow_gap_usd_by_event.get(last_event, 0.0)
                                                           + (cost - shadow_cost) * dt / 3600.0)
                run.shadow_jobs_per_group_s[0] += shadow_jpg[0] * dt
                run.shadow_jobs_per_group_s[1] += shadow_jpg[1] * dt
                run.shadow_s += dt
                run.shadow_policy_usd += cost * dt / 3600.0
                run.shadow_optimal_usd += shadow_cost * dt / 3600.0
            for jid in remaining:
                remaining[jid] -= rate[jid] * dt
        t = t_next
        if t_dep <= t_arr:  # departures first on ties: they free capacity
            last_event = "departure"
            done = [jid for jid, left in remaining.items() if left <= done_at[jid] or jid == j_dep]
            for jid in done:
                del remaining[jid]
                del done_at[jid]
                policy.clock = t
                for mj, ms in (policy.depart(jid) or {}).items():
                    stalls[mj] = stalls.get(mj, 0.0) + ms
                real.forget(jid)
                if shadow is not None:
                    shadow.forget(jid)
                sj, st = by_id[jid], start_s.pop(jid, None)
                run.outcomes[jid] = JobOutcome(jid, sj.arrival_s, t, sj.duration_s, sj.spec.slo,
                                               real.solo_time_s(sj.spec) / sj.profile.t_solo_s,
                                               start_s=st if queued else None)
                if on_event:
                    on_event(1)
            for jid in policy.take_started() or ():  # queued jobs admitted into the freed room
                start(jid)
        else:
            last_event = "arrival"
            job = jobs[i]
            i += 1
            policy.clock = t
            run.decision_ms.append(policy.arrive(job))
            for mj, ms in policy.pop_stalls().items():  # jobs moved by the admission's re-optimisation
                stalls[mj] = stalls.get(mj, 0.0) + ms
            started = policy.take_started()
            queued = queued or started is not None
            for jid in ([job.spec.job_id] if started is None else started):
                start(jid)
            if on_event:
                on_event(1)
        refresh()
        for jid, st in stalls.items():  # a moved job's state copy: lost progress at its new speed
            if jid in remaining:
                remaining[jid] += st * rate[jid]
        stalls.clear()
    run.end_s = t
    run.wall_s = time.perf_counter() - t_wall
    run.extra.update(policy.extra())
    if isinstance(policy, OptimalPolicy):
        run.extra["optimal_exact_fraction"] = policy.exact_events / max(1, policy.events)
    return run


@dataclass
class SimulationResult:
    """A whole run: per-policy runs and the summary (``summary.json`` content)."""

    runs: dict[str, PolicyRun]
    summary: dict
    real: Realisation


def summarise(runs: dict[str, PolicyRun], meta: Optional[dict] = None) -> dict:
    """summary.json: per-policy metrics over the common horizon, ratios to the optimum and the
    paper's reference ratios (RollMux §7.4: Solo-D 1.84x and colocated 1.38x RollMux's cost)."""
    horizon = max((r.end_s for r in runs.values()), default=0.0)
    pol = {name: r.metrics(horizon) for name, r in runs.items()}
    if "optimal" in pol and pol["optimal"]["avg_cost_usd_per_h"] > 0:
        o = pol["optimal"]["avg_cost_usd_per_h"]
        for m in pol.values():
            m["cost_vs_optimal"] = m["avg_cost_usd_per_h"] / o
    ratios = {}
    if "rollmux" in pol and pol["rollmux"]["avg_cost_usd_per_h"] > 0:
        rm = pol["rollmux"]["avg_cost_usd_per_h"]
        for other, paper_key in (("solo-d", "solo-d_over_rollmux"), ("colocated", "colocated_over_rollmux")):
            if other in pol:
                ratios[paper_key] = {"measured": pol[other]["avg_cost_usd_per_h"] / rm, "paper": PAPER_RATIOS[paper_key]}
        if "solo-d" in pol:  # RollMux §7.4: bubbles -24.4% (rollout) and -43.1% (training) vs Solo-D
            for pool, paper in (("rollout", 0.244), ("train", 0.431)):
                sd = pol["solo-d"][f"{pool}_bubble_ratio"]
                if sd > 0:
                    ratios[f"{pool}_bubble_reduction_vs_solo-d"] = {
                        "measured": 1.0 - pol["rollmux"][f"{pool}_bubble_ratio"] / sd, "paper": paper}
    return {"meta": dict(meta or {}, horizon_h=horizon / 3600.0), "policies": pol, "rollmux_cost_ratios": ratios}


def simulate(
    jobs: Sequence[SimJob],
    cluster: ClusterSpec,
    policies: Iterable[str] = POLICY_NAMES,
    *,
    stochastic: bool = False,
    seed: int = 0,
    max_group_size: Optional[int] = None,
    exact_max_jobs: int = 16,
    on_event: Optional[Callable[[str, int], None]] = None,
    meta: Optional[dict] = None,
    shadow_policies: Iterable[str] = ("rollmux",),
    repack: Optional[bool] = None,
    config=None,
    queue: bool = False,
) -> SimulationResult:
    """Replay the same jobs through every policy with one shared realisation.

    ``config``: the scheduler settings (:class:`rollmux.admission.SchedulerConfig`, the model the
    cluster's GlobalScheduler uses; default: its defaults); ``max_group_size`` / ``repack`` override
    a copy of it when given, ``seed`` (realisation) is also the random baseline's seed.
    ``shadow_policies`` also get the same-instant exact-optimum comparison (see :func:`replay`);
    ``repack=False`` runs RollMux as the paper's admission-only Alg. 1 (no departure re-packing).
    ``queue=True``: a bounded ``cluster`` holds the jobs that do not fit in the admission queue
    (:class:`SchedulerPolicy`); each policy's summary then reports its jobs' queue waits.

    Raises:
        ValueError: an unknown policy name (before anything runs) or an empty job list.
    """
    from rollmux.admission import SchedulerConfig

    names = [check_policy(p) for p in policies]
    if not jobs:
        raise ValueError("simulate: no jobs to replay")
    if queue and (other := [n for n in names if policy_spec(n).kind != "scheduler"]):
        raise ValueError(f"policies {', '.join(other)} do not admit through the scheduler and cannot replay with the "
                         "admission queue; queued replays take the policies of kind 'scheduler' (rollmux, random, most-idle)")
    cfg = (config or SchedulerConfig()).overridden(max_group_size=max_group_size, seed=seed, repack_on_departure=repack)
    max_group_size, repack = cfg.max_group_size, cfg.repack_on_departure
    real = Realisation(cluster, stochastic=stochastic, seed=seed)
    shadow_policies = tuple(shadow_policies)
    runs: dict[str, PolicyRun] = {}
    for name in names:
        pol = make_policy(name, cluster, real, exact_max_jobs=exact_max_jobs, config=cfg, queue=queue)
        cb = (lambda k, _n=name: on_event(_n, k)) if on_event else None
        shadow = (OptimalPartition(cluster, max_group_size=max_group_size, exact_max_jobs=exact_max_jobs, time_limit_s=5.0)
                  if name in shadow_policies else None)
        runs[name] = replay(jobs, pol, real, on_event=cb, shadow=shadow)
    m = dict(meta or {}, jobs=len(jobs), stochastic=stochastic, seed=seed, max_group_size=max_group_size,
             exact_max_jobs=exact_max_jobs, repack_on_departure=repack, **({"admission_queue": True} if queue else {}))
    return SimulationResult(runs, summarise(runs, m), real)


def gantt_records(run: PolicyRun, real: Realisation, meta_iterations: int = 3) -> list[PhaseRecord]:
    """Timeline of the largest group the policy formed (first ``meta_iterations`` cycles)."""
    g = run.gantt_group
    if g is None:
        return []
    if real.stochastic:
        s = real.schedule(g, record_timeline=True)
    else:
        s = simulate_group(g, meta_iterations=max(2, meta_iterations), record_timeline=True)
    return list(s.timeline)
