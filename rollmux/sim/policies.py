"""The policies as the trace replay sees them (:class:`SimPolicy`: ``arrive`` / ``depart`` change
state, ``units`` gives the current allocation): the group-forming scheduler policies through the
same :class:`rollmux.admission.InterGroupScheduler` the cluster runs (:class:`SchedulerPolicy`,
with re-packing, re-optimisation and the admission queue), the per-job baselines
(:class:`PerJobPolicy`) and the offline optimum (:class:`OptimalPolicy`); :func:`make_policy`
builds one from :data:`rollmux.policies.REGISTRY`. Source: RollMux §7.1 (baselines), §7.5.
"""

from __future__ import annotations

import time
from typing import Optional

from rollmux import profiler
from rollmux.admission import InterGroupScheduler, SchedulerConfig
from rollmux.admission_queue import AdmissionQueue, QueueFull
from rollmux.baselines import PER_JOB_UNITS, OptimalPartition, Unit, cheaper_alone
from rollmux.codes import Code
from rollmux.models import ClusterSpec, CoExecutionGroup
from rollmux.policies import policy_spec
from rollmux.preemption import PreemptionPlan, PriorityBook, class_of, retry_order, tenant_of
from rollmux.sim.learning import MeasuredLoop
from rollmux.sim.realisation import Realisation
from rollmux.workloads import SimJob


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

    def learn_points(self) -> dict[str, int]:
        """``{job_id: iterations}``: call :meth:`learn` when the job has run that many iterations
        (a policy that learns from measured phase times; default: none)."""
        return {}

    def learn(self, job_id: str, iterations: int) -> Optional[dict[str, float]]:
        """The job has run ``iterations`` iterations: take its measured times, re-check, act.
        May return ``{job_id: stall_s}`` of the jobs moved (as :meth:`depart`)."""
        return None

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
                 seed: Optional[int] = None, repack: Optional[bool] = None, config=None, queue: bool = False,
                 priorities: bool = False, label: Optional[str] = None):
        self.name = label or name
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
        self.move_gpu_h = 0.0  # GPU-hours the moved jobs stalled (each move: its copy x its GPUs)
        self.moves_by_source: dict[str, int] = {}  # what decided each move (reopt, plan, repack, slo, slo_watch)
        self.reopt_ms: list[float] = []  # re-optimisation after each admission (after the decision), ms
        self.plan_ms: list[float] = []  # each global plan (rollmux.admission.global_plan), ms
        self.sched.clock = lambda: self.clock  # the move cap's hour is the replay's
        self._stalls: dict[str, float] = {}
        self.queue = AdmissionQueue.from_config(cfg) if queue else None
        self._started: list[str] = []
        self.refused: list[str] = []
        self.queue_peak = 0
        # profile_source measured / blended: plan on measured phase times, re-check and act (SLO watch)
        self.loop = (MeasuredLoop(self.sched, real) if cfg.profile_source != "worst_case" and self.spec.slo_check
                     else None)
        # priority classes, tenant quotas and preemption (rollmux.preemption; the cluster's rules)
        self.book = PriorityBook(cfg, cluster) if priorities else None
        self._jobs: dict[str, SimJob] = {}
        self._borrow: dict[str, bool] = {}  # queued job -> its quota verdict said borrowing
        self._pending: dict[str, tuple[SimJob, PreemptionPlan]] = {}  # newcomer -> its plan, victims stopping
        self._stopping: dict[str, str] = {}  # victim -> the newcomer it makes room for
        self._preempted: list[str] = []  # victims stopped since the last take_preempted
        self.resumes: dict[str, int] = {}  # preempted job -> times it has started again
        # a job alone in its group runs on its own allocation when that is cheaper per iteration
        # (rollmux.baselines.cheaper_alone); (job id, group $/h) -> (choice or None, its unit)
        self.cluster = cluster
        # composes with the measured loop, the admission queue and priorities: the group stays in the
        # table (holding its nodes on a bounded cluster), only what its lone member runs on changes
        self.per_job = cfg.per_job_allocations == "simulator" and self.spec.slo_check
        self._own: dict[str, tuple] = {}
        self._own_jobs: set = set()
        # the global plan's solver: the same layout cache, one-job columns priced as they run
        self.plan_solver = self.solver.view(per_job=self.per_job)
        if self.per_job:
            # the neighbourhood re-optimisation accepts a re-partition only when it is cheaper at
            # what the groups run on (a one-member group at its own allocation's $/h where
            # cheaper); its solver still searches co-execution partitions at the groups' node
            # prices (solver.per_job off): an own allocation is where a lone member runs, not a
            # target to split groups into (measured on the cost-gap grid and the default replays:
            # rollmux/README.md, "Per-job allocations")
            self.sched.group_price = self._group_usd_per_h

    def arrive(self, job: SimJob) -> float:
        self._jobs[job.spec.job_id] = job
        verdict = None
        if self.book is not None:
            verdict = self.book.check(job.spec)
            if not verdict.ok:
                if verdict.never or self.queue is None:
                    self.refused.append(job.spec.job_id)
                    return 0.0
                return self._hold(job, 0.0, verdict.reason)
        if self.queue is not None and not self.queue.may_try_now(job.spec):  # FIFO: behind larger held jobs
            return self._hold(job, 0.0, "queued behind larger jobs")
        prof = job.profile if self.loop is None else self.loop.profile_for(job.spec, job.profile)
        was = self.sched.plan_gap()[0] if self.per_job else 0.0  # the $/h the groups run at
        d = self.sched.admit(job.spec, prof)
        if not d.admitted and self.book is not None and d.code == Code.RETRY_LATER:
            plan = self.book.plan(job.spec, self.sched, exclude=self._stopping)
            if plan is not None:  # the victims stop at their next iteration boundary, then it starts
                self._pending[job.spec.job_id] = (job, plan)
                for v in plan.victims:
                    self._stopping[v.job_id] = job.spec.job_id
                    self.book.preempted(v, job.spec, self.clock, plan.reason)
                self._borrow[job.spec.job_id] = verdict.borrowing if verdict else False
                return float(d.latency_ms)
        if d.admitted:
            self._on_start(job.spec.job_id, verdict.borrowing if verdict else False)
            if self.loop is not None:
                self.loop.started(job.spec.job_id)
            t0 = time.perf_counter()
            moves = self.sched.reoptimise(self.sched.group_of(job.spec.job_id).group_id, fresh=job.spec.job_id,
                                          solver=self.solver)
            self.reopt_ms.append((time.perf_counter() - t0) * 1e3)
            self._moved(moves)
            if self.loop is not None:
                self._moved(self.loop.check())
            # joining a lone member's group can cost more than admission's marginal cost (the member
            # ran on a cheaper own allocation): a plan may move the newcomer while it copies nothing
            rose = self.per_job and self.sched.plan_gap()[0] - was > d.delta_usd_per_h + 1e-6
            self._global_plan(fresh=(job.spec.job_id,), force=rose)
        elif self.queue is not None and d.code == Code.RETRY_LATER:
            return self._hold(job, float(d.latency_ms), d.reason)
        elif self.queue is not None:
            self.refused.append(job.spec.job_id)
        else:
            raise RuntimeError(f"{self.name}: job {job.spec.job_id} was refused ({d.code}: {d.reason}); "
                               "the simulation cluster must be unbounded (or replay with the admission queue)")
        return float(d.latency_ms)

    def _on_start(self, job_id: str, borrowed: bool = False) -> None:
        self._started.append(job_id)
        if self.book is not None:
            self.book.admitted(self._jobs[job_id].spec, self.clock, borrowed=borrowed)
            if job_id in self.book.preemptions:
                self.book.resumed(job_id, self.clock)
                self.resumes[job_id] = self.resumes.get(job_id, 0) + 1

    def _gate(self, spec) -> Optional[str]:
        """The quota reason a queued job may not start now (the drain's gate), or None."""
        v = self.book.check(spec)  # type: ignore[union-attr]
        self._borrow[spec.job_id] = v.borrowing
        return None if v.ok else v.reason

    def stop_points(self) -> list[str]:
        """Jobs to stop at their next iteration boundary (preemption victims)."""
        return list(self._stopping)

    def stop(self, job_id: str) -> None:
        """``job_id`` reached its iteration boundary: it leaves its group and waits in the queue
        (ahead of its class's later arrivals); once every victim of a newcomer is off, the newcomer
        is admitted (if the room went elsewhere meanwhile, it queues)."""
        new_id = self._stopping[job_id]
        self._depart_from_groups(job_id)
        self._preempted.append(job_id)
        self._hold(self._jobs[job_id], 0.0, f"preempted by {new_id}")
        self._release_victim(job_id)
        if not self._pending:
            self._drain()
            self._retry_preemption()

    def _release_victim(self, job_id: str) -> None:
        new_id = self._stopping.pop(job_id)
        job_new, plan = self._pending[new_id]
        if any(v in self._stopping for v in plan.victim_ids):
            return
        del self._pending[new_id]
        d = self.sched.admit(job_new.spec, job_new.profile)
        if d.admitted:
            self._on_start(new_id, self._borrow.pop(new_id, False))
        else:
            self._hold(job_new, 0.0, d.reason)

    def _retry_preemption(self) -> None:
        """After a departure: the first queued jobs of a class above some running preemptible job
        try preemption again (:func:`rollmux.preemption.retry_order`); one plan at a time."""
        if self.book is None or self.queue is None or self._pending:
            return
        running = [r for j, r in self.book.running.items() if j not in self._stopping]
        for q in retry_order(self.queue.jobs(), running):
            v = self.book.check(q.spec)
            if not v.ok:
                continue
            plan = self.book.plan(q.spec, self.sched, exclude=self._stopping)
            if plan is None:
                continue
            self.queue.remove(q.job_id)
            self._pending[q.job_id] = (self._jobs[q.job_id], plan)
            for vic in plan.victims:
                self._stopping[vic.job_id] = q.job_id
                self.book.preempted(vic, q.spec, self.clock, plan.reason)
            self._borrow[q.job_id] = v.borrowing
            return

    def take_preempted(self) -> list[str]:
        out, self._preempted = self._preempted, []
        return out

    def _hold(self, job: SimJob, ms: float, reason: str) -> float:
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
            src = m.get("source", "slo_watch")
            self.moves_by_source[src] = self.moves_by_source.get(src, 0) + 1
            self.move_s += m["move_s"]
            spec = self._jobs[m["job_id"]].spec
            self.move_gpu_h += m["move_s"] * (spec.num_rollout_gpus + spec.num_train_gpus) / 3600.0
            self._stalls[m["job_id"]] = self._stalls.get(m["job_id"], 0.0) + m["move_s"]

    def pop_stalls(self) -> dict[str, float]:
        out, self._stalls = self._stalls, {}
        return out

    def _global_plan(self, fresh=(), force: bool = False) -> None:
        """The global plan after an event (:mod:`rollmux.admission.global_plan`): when one is due,
        its target and migrations, committed at once (the replay's clock does not move meanwhile)."""
        req = self.sched.plan_request(fresh, force=force)
        if req is None:
            return
        t0 = time.perf_counter()
        plan = self.sched.plan_global(req, solver=self.plan_solver)
        self._moved(self.sched.apply_global(plan))
        self.plan_ms.append((time.perf_counter() - t0) * 1e3)

    def _depart_from_groups(self, job_id: str) -> None:
        gid = self.sched.group_of(job_id).group_id
        self.sched.depart(job_id)
        self.solver.forget(job_id)
        self.plan_solver.forget(job_id)
        if self.book is not None:
            self.book.departed(job_id)
        for k in [k for k in self._own if k[0] == job_id]:
            del self._own[k]
        self._moved(self.sched.after_departure(gid, solver=self.solver))

    def _drain(self) -> None:
        if self.queue is not None:  # the freed room goes to queued jobs (in order, with backfill)
            res = self.queue.drain(self.sched, self.clock, gate=self._gate if self.book is not None else None)
            for q, _ in res.admitted:
                self._on_start(q.job_id, self._borrow.pop(q.job_id, False))
            self.refused.extend(q.job_id for q, _ in res.dropped)

    def depart(self, job_id: str) -> Optional[dict[str, float]]:
        self._depart_from_groups(job_id)
        if job_id in self._stopping:  # it finished before its boundary: not preempted after all
            self.book.preemptions[job_id].pop()  # type: ignore[union-attr]
            if not self.book.preemptions[job_id]:  # type: ignore[union-attr]
                del self.book.preemptions[job_id]  # type: ignore[union-attr]
            self._release_victim(job_id)
        if not self._pending:  # room freed while victims stop goes to the waiting newcomer first
            self._drain()
            self._retry_preemption()
        if self.loop is not None:
            self.loop.departed(job_id)
            self._moved(self.loop.check())
        self._global_plan()
        return self.pop_stalls()

    def learn_points(self) -> dict[str, int]:
        return {} if self.loop is None else self.loop.learn_points()

    def learn(self, job_id: str, iterations: int) -> Optional[dict[str, float]]:
        if self.loop is None:
            return None
        self._moved(self.loop.learn(job_id, iterations))
        return self.pop_stalls()

    def job_class(self, job_id: str) -> Optional[tuple[str, str]]:
        """(priority class, tenant) of a job of this replay (priorities on), else None."""
        if self.book is None or job_id not in self._jobs:
            return None
        spec = self._jobs[job_id].spec
        return class_of(self.book.cfg, spec), tenant_of(self.book.cfg, spec)

    def extra(self) -> dict:
        out = {} if self.queue is None else {"queue_refused_jobs": len(self.refused), "queue_peak_jobs": self.queue_peak}
        if self.book is not None:
            out["priority_classes"] = list(self.book.cfg.priority_classes)
            out["preemptions"] = sum(len(v) for v in self.book.preemptions.values())
        if self.per_job:
            out["jobs_on_own_allocations"] = len(self._own_jobs)
        if self.loop is not None:
            out.update(self.loop.extra())
        if not self.spec.repacks:
            return out
        r = sorted(self.reopt_ms)
        pl = sorted(self.plan_ms)
        st = self.sched.plan_state
        return {**out, "repack_on_departure": self.sched.config.repack_on_departure, "jobs_moved": self.moves,
                "moves_per_job": self.moves / max(1, len(self._jobs)),
                "moves_by_source": dict(sorted(self.moves_by_source.items())),
                "move_stall_h": self.move_s / 3600.0, "move_stall_gpu_h": self.move_gpu_h,
                "reopt_latency_ms_p50": r[len(r) // 2] if r else None,
                "reopt_latency_ms_max": r[-1] if r else None,
                "global_plans": st.plans, "global_plan_migrations_applied": st.applied,
                "global_plan_migrations_stale": st.stale,
                "global_plan_latency_ms_p50": pl[len(pl) // 2] if pl else None,
                "global_plan_latency_ms_max": pl[-1] if pl else None}

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
                e = (g, self._alone(g) or self.real.group_unit(g))
            now[id(g)] = e
            out.append(e[1])
        self._seen = now
        return out

    def _group_usd_per_h(self, g: CoExecutionGroup) -> float:
        """$/h ``g`` runs at: a one-member group's own allocation when cheaper, else its nodes'."""
        unit = self._own_unit(g) if self.per_job and len(g.members) == 1 else None
        return g.cost_usd_per_h(self.cluster) if unit is None else unit.cost_usd_per_h

    def _alone(self, g: CoExecutionGroup) -> Optional[Unit]:
        """A one-member group's own allocation when cheaper per iteration (``per_job_allocations``);
        arrivals still pack into the group (it stays in the scheduler's table), the member then
        runs on the group's nodes again."""
        if not self.per_job or len(g.members) != 1:
            return None
        unit = self._own_unit(g)
        if unit is not None:
            self._own_jobs.add(g.members[0].spec.job_id)
        return unit

    def _own_unit(self, g: CoExecutionGroup) -> Optional[Unit]:
        """The own allocation ``g``'s one member would run on (cached; records nothing)."""
        m = g.members[0]
        key = (m.spec.job_id, g.cost_usd_per_h(self.cluster))
        if key not in self._own:
            # on the declared (worst-case) profile, the basis of the allocation's own times: both are
            # scaled alike to the realised ones, whatever profile the job is planned on
            alt = cheaper_alone(m.spec, profiler.estimate(m.spec, self.cluster), key[1], self.cluster)
            self._own[key] = (alt, PER_JOB_UNITS["gavel+"](m.spec, self.cluster, self.real) if alt is not None else None)
        return self._own[key][1]


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
                 time_limit_s: float = 5.0, per_job: bool = False):
        self.real = real
        self.cluster = cluster
        # per_job: the wider problem of per_job_allocations (a job alone may run on its own allocation)
        self.opt = OptimalPartition(cluster, max_group_size=max_group_size, exact_max_jobs=exact_max_jobs,
                                    time_limit_s=time_limit_s, per_job=per_job)
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
        return [self._unit(g) for g in self._groups]

    def _unit(self, g: CoExecutionGroup) -> Unit:
        """A group's unit; with ``per_job`` a one-job group runs on its own allocation (Gavel+'s
        choice) when that is below the layout's $/h (the optimum priced its column so)."""
        if self.opt.per_job and len(g.members) == 1:
            m = g.members[0]
            layout = g.cost_usd_per_h(self.cluster)
            if self.opt.single_usd_per_h(m.spec, m.profile, layout) < layout - 1e-9:
                return PER_JOB_UNITS["gavel+"](m.spec, self.cluster, self.real)
        return self.real.group_unit(g)


#: the per-job baseline that also replays on a bounded cluster with the admission queue: Solo-D is
#: a group of one (max_group_size 1, whole nodes, solo speed), so it queues and preempts by the
#: same code as RollMux
QUEUED_SOLO = "solo-d"


def make_policy(name: str, cluster: ClusterSpec, real: Realisation, *, max_group_size: Optional[int] = None,
                seed: Optional[int] = None, exact_max_jobs: int = 16, repack: Optional[bool] = None,
                config=None, queue: bool = False, priorities: bool = False) -> SimPolicy:
    """The replay's view of the policy ``name`` (:data:`rollmux.policies.REGISTRY`, by its ``kind``).
    ``config``: the :class:`rollmux.admission.SchedulerConfig` (default: its defaults);
    ``max_group_size`` / ``seed`` / ``repack`` (departure re-packing) override a copy of it when
    given. ``queue``: hold jobs that do not fit a bounded cluster in the admission queue (policies
    of kind ``scheduler`` only). Raises ValueError for an unknown name (message lists the known
    ones) or ``queue`` with a policy that does not admit through the scheduler."""
    cfg = (config or SchedulerConfig()).overridden(max_group_size=max_group_size, seed=seed, repack_on_departure=repack)
    kind = policy_spec(name).kind
    if queue and name == QUEUED_SOLO:  # Solo-D on a bounded cluster: each job alone, the same queue and rules
        solo = cfg.overridden(max_group_size=1, repack_on_departure=False, reopt_max_jobs=0)
        return SchedulerPolicy("rollmux", cluster, real, config=solo, queue=True, priorities=priorities, label=name)
    if queue and kind != "scheduler":
        raise ValueError(f"policy {name!r} does not admit through the scheduler, so it cannot replay with the "
                         "admission queue (queued replays: the policies of kind 'scheduler', e.g. rollmux, random, most-idle)")
    if kind == "scheduler":
        return SchedulerPolicy(name, cluster, real, config=cfg, queue=queue, priorities=priorities)
    if kind == "optimal":
        return OptimalPolicy(cluster, real, max_group_size=cfg.max_group_size, exact_max_jobs=exact_max_jobs,
                             per_job=cfg.per_job_allocations == "simulator")
    return PerJobPolicy(name, cluster, real)
