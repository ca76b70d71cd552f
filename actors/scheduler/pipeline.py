"""The GlobalScheduler's admission pipeline: every admission goes through one sequence of named steps.

In the manner of the Kubernetes scheduling framework (plugins run in order at named extension
points; a plugin that answers ends the cycle), an admission is an :class:`Attempt` passed through
:data:`STEPS`; a step either lets it go on (returns None) or ends it with the answer:

==============  =====================================================================================
step            what it does
==============  =====================================================================================
``validate``    the spec parses, its priority class exists, the id is not admitted / queued already
                (the same spec again is answered with its original decision, ``replayed``)
``dry_run``     a what-if ends here (:func:`rollmux.admission_queue.what_if`, nothing changes)
``quota``       the tenant's quota (:mod:`rollmux.preemption`): refused, or queued
``queue_gate``  queued jobs of its class or higher go first (:meth:`~rollmux.admission_queue.
                AdmissionQueue.may_try_now`): a larger newcomer queues behind them
``decide``      Alg. 1 (:meth:`rollmux.admission.InterGroupScheduler.decide`); a refusal other than
                ``retry_later`` ends here
``preempt``     a job that did not fit preempts the cheapest allowed set of lower-class jobs
                (:class:`actors.scheduler.priority.PriorityRules`) and is decided again; one that
                still does not fit is queued (``queue``) or refused
``commit``      the policy commits the placement and the job store writes the record (one checkpoint
                write, :class:`actors.scheduler.commit.Commit`; a failed write undoes it)
``effects``     the controller push, re-optimisation noted for the reconcile thread, metrics
==============  =====================================================================================

The same steps run for a new arrival (:meth:`AdmissionPipeline.admit`), for a queued job tried
again with preemption after the table changed (:meth:`AdmissionPipeline.retry`; it skips what
only an arrival needs: the what-if, the queue gate and the first decision, since it did not fit
at its last pass) and, from ``commit`` on, for a queued job the queue's drain admitted
(:meth:`AdmissionPipeline.settle`): the end of an admission is written once.

Answers are :class:`rollmux.answers.Admission` values (the policy's decision,
:meth:`rollmux.admission.AdmissionDecision.answer`, with the scheduler's additions), with the
scheduler's own codes (``invalid``, ``duplicate``, ``queued``, ``queue_full``) besides the policy's.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pydantic import ValidationError

from actors.scheduler.admission_queue import QueueService
from actors.scheduler.commit import Commit
from actors.scheduler.job_store import JobStore, spec_sha256
from actors.scheduler.policy_ref import PolicyRef
from actors.scheduler.priority import PriorityRules
from actors.scheduler.reopt import Reoptimiser
from rollmux.admission import AdmissionDecision
from rollmux.admission_queue import QUEUE_AHEAD_REASON, QueuedJob, QueueFull, what_if
from rollmux.answers import Admission
from rollmux.codes import Code
from rollmux.models import JobSpec
from rollmux.preemption import retry_order
from rollmux.records import JobRecord

__all__ = ["AdmissionPipeline", "Attempt", "STEPS"]

#: the steps of an admission, in order (see the module docstring)
STEPS = ("validate", "dry_run", "quota", "queue_gate", "decide", "preempt", "commit", "effects")
#: drain passes of one settle at most (each pass after the first follows a preemption that admitted a
#: queued job: the lines' classes above the preemptible ones shrink every time)
SETTLE_MAX_PASSES = 8


@dataclass
class Attempt:
    """One admission on its way through the pipeline: what was asked, and what the steps found."""

    spec: Any  # the spec as asked (a JobSpec, or its dict form from a unit test), validated by the first step
    dry_run: bool = False  # evaluate only (nothing changes)
    queue: bool = False  # a job that does not fit now waits in the admission queue instead of a refusal
    explain: str = "full"  # "full" | "chosen": candidates listed in the answer
    queued: Optional[QueuedJob] = None  # a queued job tried again: its place in the line
    t0: float = field(default_factory=time.perf_counter)  # when the attempt began (latency), perf_counter s
    job: Optional[JobSpec] = None  # the validated spec
    sha: Optional[str] = None  # the spec's digest (a retry of the same spec is recognised by it)
    decision: Optional[AdmissionDecision] = None  # the policy's last decision
    out: Optional[Admission] = None  # the answer as built so far
    drained: bool = False  # the queue's drain committed it to the policy already (its group: ``committed``)
    committed: Any = None  # the group the drain committed it to
    preempted: Optional[list[str]] = None  # the jobs preempted for it
    record: Optional[JobRecord] = None  # its record, once committed
    scope: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # the write it is part of

    @property
    def fits(self) -> bool:
        return self.out is not None and self.out.admitted

    @property
    def retry_later(self) -> bool:
        return self.out is not None and self.out.retry_later


class AdmissionPipeline:
    """The admissions of one scheduler (see the module docstring).

    Args:
        policy / jobs / queue / commit: the table, the records, the admission queue and the
            unit of work admissions are written with.
        rules: quotas and preemption.
        reopt: notes each admission for re-optimisation off the admission path.
        metrics: the metrics recorder.
    """

    def __init__(self, policy: PolicyRef, jobs: JobStore, queue: QueueService, commit: Commit, rules: PriorityRules,
                 reopt: Reoptimiser, metrics):
        self.policy, self.jobs, self.queue, self.commit = policy, jobs, queue, commit
        self.rules, self.reopt, self.metrics = rules, reopt, metrics
        self.steps: list[tuple[str, Callable[[Attempt], Optional[Admission]]]] = [
            (s, getattr(self, f"on_{s}")) for s in STEPS]

    # ---- the three ways in
    def admit(self, spec: Any, dry_run: bool = False, queue: bool = False, explain: str = "full") -> Admission:
        """A new arrival (or, ``dry_run``, its what-if): the answer (see the module docstring)."""
        return self.run(Attempt(spec, dry_run=dry_run, queue=queue, explain=explain))

    def retry(self, q: QueuedJob) -> Admission:
        """A queued job tried again with preemption (it did not fit at its last pass): its answer
        (``admitted`` when it was); it keeps its place when it still does not fit."""
        return self.run(Attempt(q.spec, queue=True, explain="chosen", queued=q, job=q.spec))

    def settle(self) -> list[str]:
        """After every change that may have freed room or changed the line (a departure, a
        preemption, a move, a withdrawn queued job), before any other arrival is decided: admit
        queued jobs into the room (in class order, with backfill, through Alg. 1:
        :meth:`rollmux.admission_queue.AdmissionQueue.drain`), then try preemption again for queued
        jobs of a class above some running preemptible job (:func:`rollmux.preemption.retry_order`),
        and drain again while such a preemption freed room (what its job did not need goes to the
        line, not to a later arrival). A queued job that can never fit ends as ``failed`` with
        the reason. One checkpoint write. Returns the admitted job ids, in admission order.

        Afterwards every queued job is blocked now (Alg. 1 does not place it, it waits behind a
        smaller job that Alg. 1 does not place, or its tenant's quota holds it): that is what lets
        the queue gate decide a newcomer no larger than the queued jobs of its class or higher at once."""
        if not len(self.queue):
            return []
        started: list[str] = []
        with self.commit.batch():
            for _ in range(SETTLE_MAX_PASSES):
                t0 = time.perf_counter()
                res = self.queue.drain(self.policy.igs, self.rules.gate)
                for q, d in res.admitted:
                    self.run(Attempt(q.spec, queued=q, job=q.spec, t0=t0, out=d.answer(), drained=True,
                                     committed=self.policy.igs.group_of(q.job_id)), start="commit")
                now = time.time()
                for q, d in res.dropped:
                    self.jobs.left_queue_failed(q.job_id, q.spec.slo, q.enqueued_at, d.reason, now)
                    self.commit.mark(jobs=(q.job_id,))
                more, preempted = self.retry_preemption()
                started += [q.job_id for q, _ in res.admitted] + more
                if not preempted or not len(self.queue):
                    break
            self.queue.note_metrics()
        return started

    def retry_preemption(self) -> tuple[list[str], bool]:
        """The first queued jobs of a class above some running preemptible job try preemption
        again (the table changed). Returns the jobs admitted so, and whether any job was preempted."""
        if not len(self.queue):
            return [], False
        started, preempted = [], False
        for q in retry_order(self.queue.line.jobs(), self.rules.book().running.values()):
            if q.job_id not in self.queue:
                continue
            out = self.retry(q)
            preempted |= bool(out.preempted)
            if out.admitted:
                started.append(q.job_id)
        return started, preempted

    def run(self, a: Attempt, start: str = STEPS[0]) -> Admission:
        """Pass ``a`` through the steps from ``start`` on; the first answer ends it. The write the
        attempt's steps joined (a batch, a transaction) ends with it."""
        with a.scope:
            for name, step in self.steps[STEPS.index(start):]:
                out = step(a)
                if out is not None:
                    return out
        raise AssertionError("the effects step answers every admission that reached it")  # pragma: no cover

    # ---- the steps (``on_<step>``)
    def on_validate(self, a: Attempt) -> Optional[Admission]:
        if a.queued is not None:  # a queued job was validated when it arrived
            return None
        try:
            a.job = JobSpec.model_validate(a.spec)
        except ValidationError as e:
            jid = a.spec.get("job_id") if isinstance(a.spec, dict) else getattr(a.spec, "job_id", None)
            where = ".".join(map(str, e.errors()[0]["loc"])) if e.errors() else None
            return self.refusal(jid, Code.INVALID, f"invalid job spec: {e}", a, field=where or None)
        bad = self.rules.class_refusal(a.job)
        if bad:
            return self.refusal(a.job.job_id, Code.INVALID, f"invalid job spec: {bad}", a, field="priority_class")
        a.sha = spec_sha256(a.job)
        jid = a.job.job_id
        old = self.jobs.get(jid)
        if old is not None and old.state.is_active():
            if old.spec_sha256 == a.sha and old.decision is not None:  # a retry: the original decision, again
                now = self.jobs.view(old)  # with where the job is now (a re-packing may have moved it)
                return Admission.from_dict(old.decision).replace(group_id=now.group_id, replayed=True,
                                                                 placement=now.placement)
            return self.refusal(jid, Code.DUPLICATE, f"job {jid!r} is already {old.state} with a different spec", a)
        if jid in self.queue:
            return self.refusal(jid, Code.DUPLICATE, f"job {jid!r} is already queued (position "
                                f"{self.queue.line.position(jid)})", a)
        return None

    def on_dry_run(self, a: Attempt) -> Optional[Admission]:
        if not a.dry_run:
            return None
        # the same function answers the Serve replicas' dry-runs from their snapshot copy
        return what_if(self.policy.igs, a.job, self.queue.held_gpus(), backfill=self.queue.line.backfill,
                       queue=a.queue, explain=a.explain)

    def on_quota(self, a: Attempt) -> Optional[Admission]:
        if a.queued is not None:  # gated by its tenant's quota: it keeps its place
            return self.kept(a) if self.rules.gate(a.job) else None
        v = self.rules.quota(a.job)
        if v.ok:
            return None
        if a.queue and not v.never:
            return self.enqueue(a, v.reason)
        return self.refusal(a.job.job_id, Code.NEVER if v.never else Code.RETRY_LATER, v.reason, a)

    def on_queue_gate(self, a: Attempt) -> Optional[Admission]:
        if a.queued is not None or self.queue.line.may_try_now(a.job, self.rules.gate if self.rules.quotas else None):
            return None
        why = QUEUE_AHEAD_REASON(len(self.queue))  # queued jobs first: a larger newcomer waits behind them
        return self.enqueue(a, why) if a.queue else self.refusal(a.job.job_id, Code.RETRY_LATER, why, a)

    def on_decide(self, a: Attempt) -> Optional[Admission]:
        if a.queued is not None:  # it did not fit at its last pass: straight to preemption
            return None
        a.decision = self.policy.igs.decide(a.job)
        a.out = a.decision.answer(a.explain)
        if a.fits or a.retry_later:  # a higher class may preempt
            return None
        return self.not_admitted(a)

    def on_preempt(self, a: Attempt) -> Optional[Admission]:
        if a.fits:
            return None
        plan = self.rules.plan(a.job)
        if plan is None:  # nothing may be preempted for it
            return self.kept(a) if a.queued is not None else self.not_admitted(a)
        a.scope.enter_context(self.commit.batch(force=True))  # the preemptions and the admission: one write
        if a.queued is not None:
            self.queue.take(a.queued)
        for v in plan.victims:
            self.rules.preempt(v, a.job, plan.reason)
        a.decision = self.policy.igs.decide(a.job)
        a.out = a.decision.answer(a.explain)
        a.preempted = plan.victim_ids
        if a.fits:
            return None
        if a.queued is not None:  # it goes back to its place (same arrival time)
            self.queue.put_back(a.queued, a.out.reason)
        elif a.queue and a.retry_later:
            a.out = self.enqueue(a, a.out.reason, a.out)
        a.out = a.out.replace(preempted=tuple(a.preempted))
        self.refill(a)
        return a.out

    def on_commit(self, a: Attempt) -> Optional[Admission]:
        # one checkpoint write commits it; a failed write undoes it (inside a batch the batch's failed
        # write restores the last written state instead, so no per-admission copy is taken)
        a.scope.enter_context(self.commit.transaction_unless_batched())
        igs = self.policy.igs
        grp = a.committed if a.drained else igs.commit(a.decision)
        if grp is not None:
            a.out = a.out.replace(group_id=grp.group_id)
        gid = a.out.group_id
        member = igs.member(a.job.job_id)
        borrowed = self.rules.quota(a.job).borrowing  # beyond its tenant's quota: borrowed capacity
        a.record = self.jobs.admitted(a.job, a.out, member.profile if member is not None else None, sha=a.sha,
                                      queued=a.queued, borrowed=borrowed)
        if a.queued is not None:
            self.metrics.queue_wait(a.record.waited_s)
        self.commit.mark(jobs=(a.job.job_id,), groups=(gid,))  # target state first, then act
        return None

    def on_effects(self, a: Attempt) -> Optional[Admission]:
        job = a.job
        gid = a.out.group_id
        self.reopt.note_admission(job.job_id, gid)
        self.commit.push([gid])
        self.metrics.admission(Code.OK.outcome, a.out.latency_ms)
        self.metrics.job(job.job_id, slo=job.slo, iterations=0)
        cost = self.policy.group_cost(gid)
        if cost is not None:
            self.metrics.group_cost(gid, cost)
        if a.preempted is not None:
            a.out = a.out.replace(preempted=tuple(a.preempted))
            self.refill(a)
        return a.out

    def refill(self, a: Attempt) -> None:
        """A preemption for an arrival freed its victims' nodes: what the arrival did not take goes
        to the queued jobs (in class order, one write with the preemption) before any other
        arrival is decided (``admitted_from_queue``). A queued job's preemption is followed by the
        drain that tried it (:meth:`settle`)."""
        if a.queued is None:
            started = self.settle()
            if started:
                a.out = a.out.replace(admitted_from_queue=tuple(started))

    # ---- answers that end an admission early
    def not_admitted(self, a: Attempt) -> Admission:
        """It does not fit (and nothing may be preempted for it): queued (``queue`` and
        ``retry_later``) or refused with the policy's decision."""
        if a.queue and a.retry_later:
            return self.enqueue(a, a.out.reason, a.out)
        self.metrics.admission(Code(a.out.code).outcome, a.out.latency_ms)
        return a.out

    def enqueue(self, a: Attempt, reason: str, decision: Optional[Admission] = None) -> Admission:
        """Hold the job in the admission queue (checkpointed with the queue); the answer is the
        decision with code ``queued`` and ``queue_position``, or ``queue_full``."""
        try:
            pos = self.queue.hold(a.job, reason)
        except QueueFull as e:
            out = self.refusal(a.job.job_id, Code.QUEUE_FULL, str(e), a)
            return out if decision is None else out.replace(candidates=decision.candidates, pruned=decision.pruned)
        ms = (time.perf_counter() - a.t0) * 1e3
        self.metrics.admission(Code.QUEUED.outcome, ms)
        base = decision if decision is not None else Admission(a.job.job_id, False, Code.QUEUED, latency_ms=ms)
        return base.replace(job_id=a.job.job_id, admitted=False, code=Code.QUEUED, queued=True, queue_position=pos,
                            reason=f"queued at position {pos}: {reason}", policy=self.policy.igs.policy)

    @staticmethod
    def kept(a: Attempt) -> Admission:
        """The answer of a queued job tried again that keeps its place (nothing was tried: its
        tenant's quota gates it, or nothing may be preempted for it)."""
        return Admission(a.job.job_id, False, Code.QUEUED, kept=True)

    def refusal(self, job_id: Optional[str], code: Code, reason: str, a: Attempt,
                field: Optional[str] = None) -> Admission:
        """A refusal of the scheduler itself (``invalid`` | ``duplicate`` | ...) as an
        AdmissionDecision (counted in the metrics unless it answers a dry run; ``field``: the spec
        field an ``invalid`` one is about, for the HTTP 422's ``errors``)."""
        ms = (time.perf_counter() - a.t0) * 1e3
        if not a.dry_run:
            self.metrics.admission(code.outcome, ms)
        d = AdmissionDecision(job_id=job_id, admitted=False, code=code, reason=reason, policy=self.policy.igs.policy,
                              delta_usd_per_h=None, latency_ms=ms, field=field)
        return d.answer()
