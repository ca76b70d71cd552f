"""Priority classes, tenant quotas and the choice of jobs to preempt on a bounded cluster (pure).

A job carries a priority class (``JobSpec.priority_class``, one of the scheduler's
``priority_classes``, highest first) and a tenant (``JobSpec.tenant``). The scheduler config may
give a tenant a nominal quota of rollout and training GPUs (:class:`rollmux.admission.config.
TenantQuota`, like a Kueue ClusterQueue in a cohort):

* **Quota.** A job whose tenant would exceed its quota (the sum of its running jobs'
  ``num_rollout_gpus`` / ``num_train_gpus`` plus the job's) is refused ``retry_later`` (queued
  with ``queue``) with a reason naming the tenant and the quota, unless the tenant ``may_borrow``:
  then it runs on idle capacity and is *borrowed*. A job larger than its tenant's whole quota
  without borrowing can never run (``never``). A tenant not listed has no quota.
* **Who may preempt whom.** A newcomer N may preempt a running *preemptible* job V when
  (a) V's class is lower than N's and V is not guaranteed against N (V is N's tenant's own, or V
  is borrowed, or V's tenant has no quota), or (b) N's tenant stays within its nominal quota and V
  is another tenant's borrowed job (reclaim: any class). A job within its tenant's quota is thus
  never preempted by another tenant.
* **Which.** Among those, the cheapest set whose removal lets N in: borrowed jobs first, then the
  fewest GPU-hours of lost work, then the lowest classes, then the newest (latest admitted). Exact over every subset of up
  to :data:`EXACT_MAX_CANDIDATES` candidates, else greedy in that order and pruned. "Lets it in"
  means the nodes the set frees (nodes no remaining member of their groups uses) plus the free
  nodes cover N's nodes on each pool: N then fits alone on them. When no set frees whole nodes, a
  second stage tries the first :data:`WHATIF_MAX_CANDIDATES` candidates greedily in the same order
  with the admission decision itself on a copy of the table (:func:`admits_after`: N may then take
  room inside a shared group), dropping those not needed.
* **When.** When a job arrives and does not fit; and after each departure, again for the first
  :data:`RETRY_MAX_QUEUED` queued jobs of a class above some running preemptible job
  (:func:`retry_order`: the table changed, a set may exist now).
* **Drain.** The newcomer is admitted at once (one committed decision), but it may not run a
  phase on a node the victim held until the victim has *drained* there: its controller removed
  it at its iteration boundary (no phase of it runs, its permits are withdrawn) and its driver
  exported its state from its workers. :class:`PreemptionRecord` keeps the victim's group,
  nodes and drain times; the rule is the one every job the table takes off some nodes follows (a
  preemption or a move, :mod:`rollmux.drain`: :func:`rollmux.drain.fenced_nodes`, bounded by
  :func:`rollmux.drain.drain_overdue`).
* **Lost work.** A preempted job stops at its next iteration boundary (never inside an iteration:
  every phase's state is committed then), so it loses no computed iteration; what it loses is the
  re-load of its committed state when it resumes (a cold start): ``(NR + NT) x
  profiler.move_time_s / 3600`` GPU-hours (:func:`lost_gpu_h`), plus any ``partial_s`` of an
  interrupted iteration a caller reports.

The cluster's GlobalScheduler and the simulator's scheduler policy both use :class:`PriorityBook`.
No Ray import; times are caller-supplied seconds. Source: RollMux §4.2 (admission on a bounded
cluster) extended with Kueue-style quotas and priority preemption.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from rollmux import profiler
from rollmux.models import ClusterSpec, JobSpec

__all__ = ["EXACT_MAX_CANDIDATES", "RETRY_MAX_QUEUED", "WHATIF_MAX_CANDIDATES", "retry_order", "admits_after", "choose_victims_greedy", "PreemptionPlan", "PreemptionRecord", "PriorityBook", "QuotaVerdict", "Running",
           "choose_victims", "class_of", "fits_after", "lost_gpu_h", "may_preempt", "quota_verdict", "rank_of",
           "resumed_preemptions", "tenant_of", "unknown_class"]

#: candidate victims up to which every subset is tried (2^12 = 4,096 node-count checks)
EXACT_MAX_CANDIDATES = 12


def class_of(cfg: Any, spec: JobSpec) -> str:
    """The job's priority class: ``spec.priority_class`` or the config's ``default_priority_class``."""
    return spec.priority_class or cfg.default_priority_class


def unknown_class(cfg: Any, spec: JobSpec) -> Optional[str]:
    """Why the job's class is not accepted (names the field), or None."""
    c = class_of(cfg, spec)
    if c not in cfg.priority_classes:
        return f"priority_class: {c!r} is not one of the scheduler's classes {list(cfg.priority_classes)}"
    return None


def rank_of(cfg: Any, spec: JobSpec) -> int:
    """0 for the highest class, 1 for the next, ...; an unknown class ranks below every class."""
    c = class_of(cfg, spec)
    return cfg.priority_classes.index(c) if c in cfg.priority_classes else len(cfg.priority_classes)


def tenant_of(cfg: Any, spec: JobSpec) -> str:
    """The job's tenant: ``spec.tenant`` or the config's ``default_tenant``."""
    return spec.tenant or cfg.default_tenant


def lost_gpu_h(spec: JobSpec, cluster: ClusterSpec, partial_s: float = 0.0) -> float:
    """GPU-hours a preemption costs the job: its GPUs x (re-load of its committed state on resume,
    :func:`rollmux.profiler.move_time_s`, + ``partial_s`` s of an interrupted iteration) / 3600."""
    gpus = spec.num_rollout_gpus + spec.num_train_gpus
    return gpus * (profiler.move_time_s(spec, cluster) + max(0.0, partial_s)) / 3600.0


@dataclass(frozen=True)
class Running:
    """A running job as the preemption policy sees it (``started_s``: admission time, s)."""

    job_id: str
    rank: int
    tenant: str
    preemptible: bool
    rollout_gpus: int
    train_gpus: int
    borrowed: bool
    started_s: float
    lost_gpu_h: float


@dataclass(frozen=True)
class QuotaVerdict:
    """Whether a job's tenant quota lets it run: ``ok``; ``borrowing`` (beyond the quota, on
    borrowed capacity); ``within`` (within the nominal quota: may reclaim borrowed capacity);
    ``never`` (larger than the whole quota, no borrowing); ``reason`` names tenant and quota."""

    ok: bool
    borrowing: bool = False
    within: bool = True
    never: bool = False
    reason: str = ""


def quota_verdict(cfg: Any, spec: JobSpec, running: Iterable[Running]) -> QuotaVerdict:
    """The tenant quota rule (module docstring) for ``spec`` beside the ``running`` jobs."""
    tenant = tenant_of(cfg, spec)
    q = cfg.tenants.get(tenant)
    if q is None:
        return QuotaVerdict(ok=True)
    used = {"rollout": 0, "train": 0}
    for r in running:
        if r.tenant == tenant:
            used["rollout"] += r.rollout_gpus
            used["train"] += r.train_gpus
    need = {"rollout": spec.num_rollout_gpus, "train": spec.num_train_gpus}
    quota = {"rollout": q.rollout_gpus, "train": q.train_gpus}
    over = [p for p in ("rollout", "train") if used[p] + need[p] > quota[p]]
    if not over:
        return QuotaVerdict(ok=True)
    p = over[0]
    what = (f"tenant {tenant!r}: {p} GPUs in use {used[p]} + {need[p]} asked exceed its quota of {quota[p]} "
            f"{p}_gpus")
    if q.may_borrow:
        return QuotaVerdict(ok=True, borrowing=True, within=False, reason=what + " (borrowing idle capacity)")
    if need[p] > quota[p]:
        return QuotaVerdict(ok=False, within=False, never=True,
                            reason=f"tenant {tenant!r}: the job asks {need[p]} {p} GPUs, more than its whole quota of "
                                   f"{quota[p]} {p}_gpus (may_borrow: false)")
    return QuotaVerdict(ok=False, within=False, reason=what + " (may_borrow: false); it runs when the tenant's jobs leave")


def may_preempt(cfg: Any, rank: int, tenant: str, within: bool, v: Running) -> bool:
    """Whether a newcomer of class ``rank`` and ``tenant`` (``within``: inside its nominal quota)
    may preempt ``v`` (rules (a) and (b) of the module docstring)."""
    if not v.preemptible:
        return False
    guaranteed = v.tenant in cfg.tenants and not v.borrowed
    if v.rank > rank and (v.tenant == tenant or not guaranteed):
        return True
    return bool(within and v.borrowed and v.tenant != tenant)


def _order(v: Running) -> tuple:
    return (not v.borrowed, v.lost_gpu_h, -v.rank, -v.started_s, v.job_id)


def _set_key(vs: tuple[Running, ...]) -> tuple:
    # borrowed first, fewest lost GPU-hours, then the lowest classes, then the newest
    return (round(sum(v.lost_gpu_h for v in vs if not v.borrowed), 9), sum(not v.borrowed for v in vs),
            round(sum(v.lost_gpu_h for v in vs), 9), len(vs), tuple(sorted(-v.rank for v in vs)),
            tuple(sorted(-v.started_s for v in vs)), tuple(sorted(v.job_id for v in vs)))


def choose_victims(cands: list[Running], fits: Callable[[list[str]], bool]) -> Optional[list[Running]]:
    """The cheapest subset of ``cands`` after whose removal ``fits(job_ids)`` holds (module
    docstring: borrowed first, then fewest lost GPU-hours, lowest classes, newest); None if none does.
    The empty set is never returned (the caller asks only when the newcomer does not fit)."""
    cands = sorted(cands, key=_order)
    if not cands:
        return None
    if len(cands) <= EXACT_MAX_CANDIDATES:
        best = None
        for k in range(1, len(cands) + 1):
            for vs in itertools.combinations(cands, k):
                if (best is None or _set_key(vs) < _set_key(best)) and fits([v.job_id for v in vs]):
                    best = vs
        return None if best is None else sorted(best, key=_order)
    chosen: list[Running] = []
    for v in cands:
        chosen.append(v)
        if fits([c.job_id for c in chosen]):
            break
    else:
        return None
    for v in sorted(chosen, key=_order, reverse=True):  # drop the dearest ones not needed
        rest = [c for c in chosen if c is not v]
        if rest and fits([c.job_id for c in rest]):
            chosen = rest
    return sorted(chosen, key=_order)


def fits_after(sched: Any, spec: JobSpec, victim_ids: list[str]) -> bool:
    """Whether ``spec`` fits alone on the nodes free once ``victim_ids`` leave ``sched`` (an
    :class:`rollmux.admission.InterGroupScheduler`): per pool, free nodes + nodes of the victims'
    groups no remaining member uses >= the job's nodes. Pure (reads the group table only)."""
    cluster = sched.cluster
    gone = set(victim_ids)
    freed = {"rollout": 0, "train": 0}
    for gid in {sched.group_of(j).group_id for j in victim_ids}:
        g = sched.group(gid)
        used = {n for m in g.members if m.spec.job_id not in gone for n in m.placement.rollout_nodes + m.placement.train_nodes}
        freed["rollout"] += sum(n not in used for n in g.rollout_nodes)
        freed["train"] += sum(n not in used for n in g.train_nodes)
    in_use = sched.nodes_in_use()
    for pool in ("rollout", "train"):
        ps = cluster.pool(pool)
        if ps.num_nodes is None:
            continue
        if ps.num_nodes - in_use[pool] + freed[pool] < spec.nodes_needed(pool, ps.node):
            return False
    return True


#: queued jobs (first in line) for which a departure tries preemption again (:func:`retry_order`)
RETRY_MAX_QUEUED = 4


def retry_order(queued: Iterable[Any], running: Iterable[Running], limit: int = RETRY_MAX_QUEUED) -> list[Any]:
    """The queued jobs (``QueuedJob``, line order: highest class first) for which preemption is
    tried again after a departure: the first ``limit`` whose class ranks above some running
    preemptible job (a job that did not fit, or found no set, when it arrived may find one now
    that the table changed)."""
    low = max((r.rank for r in running if r.preemptible), default=-1)
    out = []
    for q in queued:
        if len(out) >= limit or q.rank >= low:
            break
        out.append(q)
    return out


#: candidates the second stage (:func:`choose_victims_greedy`) takes at most, in preemption order
WHATIF_MAX_CANDIDATES = 8


def choose_victims_greedy(cands: list[Running], fits: Callable[[list[str]], bool],
                          limit: int = WHATIF_MAX_CANDIDATES) -> Optional[list[Running]]:
    """The second stage for a ``fits`` that costs a decision (:func:`admits_after`): the first
    ``limit`` candidates in preemption order (borrowed, fewest lost GPU-hours, lowest class,
    newest) are added one by one until ``fits`` holds, then those not needed are dropped, dearest
    first. At most ``2 * limit`` calls of ``fits``; None if even all ``limit`` do not fit."""
    chosen: list[Running] = []
    for v in sorted(cands, key=_order)[:limit]:
        chosen.append(v)
        if fits([c.job_id for c in chosen]):
            break
    else:
        return None
    for v in sorted(chosen, key=_order, reverse=True):
        rest = [c for c in chosen if c is not v]
        if rest and fits([c.job_id for c in rest]):
            chosen = rest
    return sorted(chosen, key=_order)


def admits_after(sched: Any, spec: JobSpec, victim_ids: list[str]) -> bool:
    """Whether the admission policy admits ``spec`` once ``victim_ids`` leave: decided on a copy
    of ``sched``'s table (:meth:`rollmux.admission.InterGroupScheduler.restore` of its snapshot;
    the table itself is not touched), so a newcomer may also take room inside a shared group."""
    copy = type(sched).restore(sched.cluster, sched.snapshot())
    for j in victim_ids:
        copy.depart(j)
    return bool(copy.decide(spec).admitted)


@dataclass
class PreemptionRecord:
    """One preemption of a job: when (s), by which job and class, the GPU-hours it lost, the
    iteration it stopped after (None until known), and when it resumed (None while waiting).

    Its drain (times in Unix seconds, None until it happened): ``group_id`` / ``nodes``, where it
    ran when preempted; ``stopped_at_s``, when its controller removed it at its iteration
    boundary; ``drained_at_s``, when its nodes became free for others, and ``drained`` how:
    ``"exported"`` (its driver exported its state from its workers), ``"no driver"`` (none had
    attached: nothing ran), ``"driver lost: ..."`` (its controller evicted it or it failed),
    ``"overdue: ..."`` (:func:`rollmux.drain.drain_overdue`)."""

    at_s: float
    by_job: str
    by_class: str
    lost_gpu_h: float
    reason: str
    iteration: Optional[int] = None
    resumed_at_s: Optional[float] = None
    group_id: Optional[str] = None
    nodes: tuple[str, ...] = ()
    stopped_at_s: Optional[float] = None
    drained_at_s: Optional[float] = None
    drained: Optional[str] = None

    def to_dict(self) -> dict:
        return {"at_s": self.at_s, "by_job": self.by_job, "by_class": self.by_class, "lost_gpu_h": self.lost_gpu_h,
                "reason": self.reason, "iteration": self.iteration, "resumed_at_s": self.resumed_at_s,
                "group_id": self.group_id, "nodes": list(self.nodes), "stopped_at_s": self.stopped_at_s,
                "drained_at_s": self.drained_at_s, "drained": self.drained}

    def resumed(self, now_s: float) -> "PreemptionRecord":
        """This preemption once its job runs again at ``now_s`` (Unix or simulated s): with
        ``resumed_at_s`` set, unless it is set already. The one writer of ``resumed_at_s`` (the
        simulator's :meth:`PriorityBook.resumed` and the scheduler's records,
        :func:`resumed_preemptions`)."""
        return self if self.resumed_at_s is not None else dataclasses.replace(self, resumed_at_s=float(now_s))

    @classmethod
    def from_dict(cls, d: dict) -> "PreemptionRecord":
        def opt(k: str) -> Optional[float]:
            return None if d.get(k) is None else float(d[k])

        # a record written before drains were kept has no group: it counts as drained (nothing to wait for)
        return cls(at_s=float(d["at_s"]), by_job=str(d["by_job"]), by_class=str(d["by_class"]),
                   lost_gpu_h=float(d["lost_gpu_h"]), reason=str(d.get("reason", "")),
                   iteration=None if d.get("iteration") is None else int(d["iteration"]),
                   resumed_at_s=opt("resumed_at_s"), group_id=d.get("group_id"),
                   nodes=tuple(str(n) for n in d.get("nodes") or ()), stopped_at_s=opt("stopped_at_s"),
                   drained_at_s=opt("drained_at_s"), drained=d.get("drained"))

@dataclass
class PreemptionPlan:
    """What to do for a newcomer that does not fit: preempt ``victims`` (in this order), then admit it."""

    job_id: str
    victims: list[Running]
    reason: str

    @property
    def victim_ids(self) -> list[str]:
        return [v.job_id for v in self.victims]

    @property
    def lost_gpu_h(self) -> float:
        return sum(v.lost_gpu_h for v in self.victims)


@dataclass
class PriorityBook:
    """The running jobs' classes, tenants and borrowed flags, and every job's preemptions: the state
    the quota and preemption rules read. ``cfg``: a :class:`rollmux.admission.SchedulerConfig`."""

    cfg: Any
    cluster: ClusterSpec
    running: dict[str, Running] = field(default_factory=dict)
    preemptions: dict[str, list[PreemptionRecord]] = field(default_factory=dict)

    def check(self, spec: JobSpec) -> QuotaVerdict:
        """The quota verdict for ``spec`` now (an unknown class: not ok, never, naming the field)."""
        bad = unknown_class(self.cfg, spec)
        if bad:
            return QuotaVerdict(ok=False, within=False, never=True, reason=bad)
        if tenant_of(self.cfg, spec) not in self.cfg.tenants:  # no quota: O(1)
            return QuotaVerdict(ok=True)
        return quota_verdict(self.cfg, spec, [r for j, r in self.running.items() if j != spec.job_id])

    def admitted(self, spec: JobSpec, now_s: float, borrowed: bool = False) -> None:
        """``spec`` started (or resumed) at ``now_s``; ``borrowed``: on borrowed capacity."""
        self.running[spec.job_id] = Running(
            job_id=spec.job_id, rank=rank_of(self.cfg, spec), tenant=tenant_of(self.cfg, spec),
            preemptible=spec.preemptible, rollout_gpus=spec.num_rollout_gpus, train_gpus=spec.num_train_gpus,
            borrowed=bool(borrowed), started_s=float(now_s), lost_gpu_h=lost_gpu_h(spec, self.cluster))

    def departed(self, job_id: str) -> None:
        self.running.pop(job_id, None)

    def plan(self, spec: JobSpec, sched: Any, *, exclude: Iterable[str] = ()) -> Optional[PreemptionPlan]:
        """The jobs to preempt so that ``spec`` (which did not fit ``sched``) fits, or None
        (preemption off, no allowed set frees enough, or the quota refuses ``spec``). ``exclude``:
        jobs already being preempted."""
        if not self.cfg.preemption:
            return None
        v = self.check(spec)
        if not v.ok:
            return None
        rank, tenant = rank_of(self.cfg, spec), tenant_of(self.cfg, spec)
        skip = set(exclude)
        cands = [r for j, r in self.running.items()
                 if j not in skip and j != spec.job_id and sched.group_of(j) is not None
                 and may_preempt(self.cfg, rank, tenant, v.within, r)]
        vs = choose_victims(cands, lambda ids: fits_after(sched, spec, ids))
        if vs is None:  # no set frees whole nodes: room made inside shared groups, tried on a copy
            vs = choose_victims_greedy(cands, lambda ids: admits_after(sched, spec, ids))
        if vs is None:
            return None
        cls = class_of(self.cfg, spec)
        reason = (f"preempted for job {spec.job_id!r} (class {cls!r}, tenant {tenant!r}) that did not fit the cluster")
        return PreemptionPlan(job_id=spec.job_id, victims=vs, reason=reason)

    def preempted(self, victim: Running, by: JobSpec, now_s: float, reason: str) -> PreemptionRecord:
        """Record that ``victim`` is preempted by ``by`` at ``now_s`` (it leaves the running set)."""
        rec = PreemptionRecord(at_s=float(now_s), by_job=by.job_id, by_class=class_of(self.cfg, by),
                               lost_gpu_h=victim.lost_gpu_h, reason=reason)
        self.preemptions.setdefault(victim.job_id, []).append(rec)
        self.running.pop(victim.job_id, None)
        return rec

    def resumed(self, job_id: str, now_s: float) -> None:
        """A preempted job runs again: its last preemption record gets ``resumed_at_s``."""
        recs = self.preemptions.get(job_id)
        if recs:
            recs[-1] = recs[-1].resumed(now_s)


def resumed_preemptions(entries: list[dict], now_s: float) -> list[dict]:
    """A job record's preemptions (:class:`PreemptionRecord` dicts, oldest first) once the job runs
    again at ``now_s`` (Unix time, s): the last one resumed (:meth:`PreemptionRecord.resumed`)."""
    out = [dict(p) for p in entries]
    if out:
        out[-1] = PreemptionRecord.from_dict(out[-1]).resumed(now_s).to_dict()
    return out
