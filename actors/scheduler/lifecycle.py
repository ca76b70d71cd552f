"""The GlobalScheduler's job lifecycle after admission: reports, departures, failures, expiry.

A job's state changes only through the job store's transitions (:class:`rollmux.records.JobState`:
admitted -> running -> finished | failed | expired, or preempted; :mod:`actors.scheduler.job_store`).
:class:`Lifecycle` turns what the scheduler hears into those changes: the runtime's reports
(:meth:`Lifecycle.report`: a measured iteration, ``running``, ``finished`` / ``failed``, and the
``stopped`` / ``drained`` steps of a drain), an operator's or driver's departure
(:meth:`Lifecycle.depart`) and the expiry of admitted jobs no driver attached to
(:meth:`Lifecycle.expire_unattached`). A departure is one write with what follows from it: the
policy releases the job's nodes and re-packs (:class:`actors.scheduler.reopt.Reoptimiser`), the
workers are told to drop the job's state, and the freed room goes to the admission queue
(:meth:`actors.scheduler.pipeline.AdmissionPipeline.settle`).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from actors.scheduler.admission_queue import QueueService
from actors.scheduler.commit import Commit
from actors.scheduler.drains import Drains
from actors.scheduler.job_store import JobStore
from actors.scheduler.pipeline import AdmissionPipeline
from actors.scheduler.policy_ref import PolicyRef
from actors.scheduler.reopt import Reoptimiser, touched_groups
from actors.scheduler.slo_watch import SloWatch
from rollmux.answers import Departure
from rollmux.messages import EventKind, ProgressReport, RuntimeEvent
from rollmux.nodes import node_index
from rollmux.records import JobRecord, JobState

__all__ = ["Lifecycle"]


class Lifecycle:
    """Reports, departures and expiry of one scheduler's jobs (see the module docstring).

    Args:
        policy / jobs / queue / commit: the table, the records, the admission queue and the unit
            of work every change is written with.
        reopt / drains / slo / admissions: the services a departure or a report hands on to.
        release: ``release(job_id, admission_id, nodes)``: an ended job's workers drop its state
            (:meth:`actors.scheduler.reconciler.Reconciler.release`).
        metrics: the metrics recorder.
    """

    def __init__(self, policy: PolicyRef, jobs: JobStore, queue: QueueService, commit: Commit, reopt: Reoptimiser,
                 drains: Drains, slo: SloWatch, admissions: AdmissionPipeline,
                 release: Callable[[str, Optional[str], list], None], metrics):
        self.policy, self.jobs, self.queue, self.commit = policy, jobs, queue, commit
        self.reopt, self.drains, self.slo, self.admissions = reopt, drains, slo, admissions
        self.release, self.metrics = release, metrics

    def depart(self, job_id: str) -> Optional[Departure]:
        """The job leaves its group (finished, or removed by an operator): nodes are released.

        Returns the :class:`rollmux.answers.Departure` (``moves``: the departure re-packing moves
        carried out); None for an unknown job id. A queued job leaves the admission queue, and an
        admitted job no driver ever ran (:func:`never_ran`) is withdrawn: both end
        ``cancelled``; a job that ran ends ``finished``. Queued jobs that fit into the freed room
        are admitted (``admitted_from_queue``).
        """
        if job_id in self.queue:  # withdrawn: a larger job it blocked may go now (one write with it)
            with self.commit.batch(force=True):
                out = self.queue.cancel(job_id)
                started = self.admissions.settle()
            return out.replace(admitted_from_queue=tuple(started))
        rec = self.jobs.get(job_id)
        return self.end(job_id, JobState.CANCELLED if rec is not None and never_ran(rec) else JobState.FINISHED, None)

    def end(self, job_id: str, state: JobState, error: Optional[str]) -> Optional[Departure]:
        """Departure or failure of ``job_id``: the policy releases its nodes, then re-packs
        (:meth:`rollmux.admission.InterGroupScheduler.repack`, departure re-packing) and
        re-optimises the departure's neighbourhood (``reoptimise``); the moves
        it committed are appended to the moved jobs' records; records and checkpoint first
        (target state), then asynchronous pushes to the touched groups' controllers.
        ``released_nodes`` is the net set of nodes the cluster no longer uses (the departed job's
        and those of groups dissolved by moves); ``dissolved_groups`` every group that ceased to
        exist (``group_dissolved``: the job's own). A job that already ended gets
        ``already_ended: True`` and its ``state`` (nothing changes)."""
        rec = self.jobs.get(job_id)
        if rec is None:
            return None
        if not rec.state.is_active():
            return Departure(job_id, rec.state, already_ended=True)
        # the departure and the queued jobs it lets in are ONE write-ahead record (group commit)
        with self.commit.batch(force=True):
            out = self._end(job_id, rec, state, error)
        return out

    def _end(self, job_id: str, rec: JobRecord, state: JobState, error: Optional[str]) -> Departure:
        """:meth:`end` inside its batch (the caller writes it as one record)."""
        final = self.jobs.view(rec)  # freeze where it was before the policy forgets it
        gid = final.group_id
        before = self.policy.nodes_in_use()
        with self.commit.transaction():  # one checkpoint write commits it; a failed write undoes it
            self.policy.igs.depart(job_id)
            self.reopt.forget(job_id)
            moves = self.reopt.departure_moves(gid, job_id)
            released = sorted(before - self.policy.nodes_in_use(), key=lambda n: (n.split("-")[0], node_index(n)))
            now = time.time()
            if final.placement is not None:  # its workers drop its state (reconcile loop)
                self.release(job_id, rec.admission_id, [*final.placement.rollout_nodes, *final.placement.train_nodes])
            self.jobs.end(rec, state, error, final, now)
            self.metrics.job_ended(job_id)
            done = self.reopt.record_moves(moves, job_id, now)
            touched = touched_groups(gid, done)
            self.commit.mark(jobs=(job_id, *[m.job_id for m in done]), groups=tuple(touched))
        self.commit.push(touched)
        self.reopt.moved_metrics(touched, len(done))
        dissolved = [g for g in touched if self.policy.igs.group_snapshot(g) is None]
        started = self.admissions.settle()  # the freed room goes to queued jobs
        return Departure(job_id, state, tuple(released), gid in dissolved, tuple(dissolved), tuple(done),
                         tuple(started))

    def expire_unattached(self, now: Optional[float] = None) -> list[str]:
        """Expire admitted jobs whose driver has not attached (reported ``running``) within the
        config's ``attach_timeout_s``: each is one departure (nodes released, one checkpoint
        write) ending in state ``expired``. Returns the expired job ids. 0 disables."""
        limit = self.policy.config.attach_timeout_s
        if not limit:
            return []
        now = time.time() if now is None else now
        late = [j for j, r in self.jobs.records.items()
                if r.state == JobState.ADMITTED and r.admitted_at is not None and now - r.admitted_at > limit]
        for j in late:
            self.end(j, JobState.EXPIRED, f"expired: no driver attached within {limit:g} s of admission; its "
                     "nodes were released. Submit the job again to run it.")
        return late

    def report(self, job_id: str, msg: RuntimeEvent | ProgressReport) -> Optional[JobRecord]:
        """A runtime report (see :meth:`actors.scheduler.global_scheduler.GlobalSchedulerImpl.report`);
        the job's record, None for an unknown job. Raises TypeError for anything but the two messages."""
        if not isinstance(msg, (RuntimeEvent, ProgressReport)):
            raise TypeError(f"a report is a RuntimeEvent or a ProgressReport (rollmux.messages), not {type(msg).__name__}")
        rec = self.jobs.get(job_id)
        if rec is None:
            return None
        if isinstance(msg, ProgressReport):  # also after the end: events from controller and driver may cross
            with self.commit.transaction():
                self.jobs.note_progress(rec, msg)
                self.commit.mark(jobs=(job_id,))  # progress is written with the event that changes it
            rec = self.jobs.get(job_id)
            self.metrics.job(job_id, iterations=rec.iterations_done, slowdown=rec.slowdown)
            self.slo.note(job_id)  # re-checked on measured times by the reconcile thread
        elif msg.kind in (EventKind.STOPPED, EventKind.DRAINED):  # a preempted / moved job's drain
            self.drains.report(job_id, msg)
        elif msg.kind == EventKind.RUNNING:
            if rec.state == JobState.ADMITTED:
                with self.commit.transaction():
                    self.jobs.transition(rec, JobState.RUNNING)
                    self.commit.mark(jobs=(job_id,))
        else:
            self.drains.report(job_id, msg)  # its controller evicted it / its driver ended: nothing of it runs
            self.jobs.note_final_count(rec, msg.iterations_done)
            st = JobState.FINISHED if msg.kind == EventKind.FINISHED else JobState.FAILED
            self.end(job_id, st, None if st == JobState.FINISHED else (msg.error or "failed"))
        return self.jobs.view(rec, answer=True)


def never_ran(rec: JobRecord) -> bool:
    """No driver ever ran the job: admitted, never reported ``running``, no iteration done and
    never preempted (a preempted job re-admitted is ``admitted`` again, but it ran)."""
    return rec.state == JobState.ADMITTED and rec.iterations_done == 0 and not rec.preemptions
