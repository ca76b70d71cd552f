"""The GlobalScheduler's admission queue service: hold, take back, cancel (bounded clusters).

On a cluster with bounded pools Alg. 1 refuses a job that fits nowhere now with ``retry_later``;
with ``queue=True`` the scheduler holds it instead in one :class:`rollmux.admission_queue.
AdmissionQueue` (the pure policy, also used by ``rollmux simulate --queue``). :class:`QueueService`
owns that line and every change of it: each is committed with the change that made it (the
write-ahead record then carries the whole line, :meth:`actors.scheduler.commit.Commit.queue_changed`)
and updates the queue metrics. Which queued job is admitted when is the admission pipeline's
(:meth:`actors.scheduler.pipeline.AdmissionPipeline.settle`).
"""

from __future__ import annotations

import time
from actors.scheduler.commit import Commit
from actors.scheduler.job_store import JobStore
from rollmux.admission_queue import AdmissionQueue, DrainResult, QueuedJob
from rollmux.answers import Departure
from rollmux.models import JobSpec

__all__ = ["QueueService"]


class QueueService:
    """The admission queue of one scheduler (see the module docstring).

    Args:
        line: the queue (the pure policy).
        commit: the unit of work its changes are written with.
        jobs: the job records (a preempted job waiting in the line has one).
        metrics: the metrics recorder (queue length, oldest wait).
    """

    def __init__(self, line: AdmissionQueue, commit: Commit, jobs: JobStore, metrics):
        self.line, self.commit, self.jobs, self.metrics = line, commit, jobs, metrics

    def __len__(self) -> int:
        return len(self.line)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.line

    def hold(self, job: JobSpec, reason: str) -> int:
        """Hold ``job`` at its place in the line (committed); its 1-based position. Raises
        :class:`rollmux.admission_queue.QueueFull` when the line is full."""
        pos = self.line.push(job, time.time(), reason=reason)
        self.commit.queue_changed()
        self.commit.mark()
        self.note_metrics()
        return pos

    def take(self, q: QueuedJob) -> None:
        """``q`` leaves the line to be admitted (with the change that admits it)."""
        self.line.remove(q.job_id)
        self.commit.queue_changed()

    def put_back(self, q: QueuedJob, reason: str) -> None:
        """``q`` goes back to its place (same arrival time) after all: it did not fit."""
        self.line.push(q.spec, q.enqueued_at, reason=reason)

    def preempted(self, spec: JobSpec, by: str, now: float) -> None:
        """A preempted job waits in the line to resume (with the change that preempted it)."""
        self.line.push(spec, now, reason=f"preempted by {by}")
        self.commit.queue_changed()

    def drain(self, policy, gate) -> DrainResult:
        """One pass of the line through Alg. 1 (:meth:`rollmux.admission_queue.AdmissionQueue.drain`;
        ``gate``: the quota gate); the admitted jobs are committed to ``policy`` already."""
        res = self.line.drain(policy, time.time(), gate=gate)
        if res.tried:
            self.commit.queue_changed()
        return res

    def cancel(self, job_id: str) -> Departure:
        """Withdraw a queued job (``queued -> cancelled``; it never had a record, except a
        preempted job waiting to resume: its record ends ``preempted -> cancelled``)."""
        self.line.remove(job_id)
        state = self.jobs.left_queue_cancelled(job_id, time.time())
        self.commit.queue_changed()
        self.commit.mark(jobs=(job_id,) if job_id in self.jobs else ())
        self.note_metrics()
        return Departure(job_id, state)

    def note_metrics(self) -> None:
        self.metrics.queue(len(self.line), self.line.oldest_wait_s(time.time()))

    def held_gpus(self) -> list[int]:
        return [q.gpus for q in self.line.jobs()]

