"""The GlobalScheduler's read side: job, group and queue views, and what each commit publishes.

Every answer about a job, a group or the admission queue is built here from the job records
(:class:`actors.scheduler.job_store.JobStore`), the policy's table and the line: the actor's
queries (``get_job``, ``list_jobs``, ``list_groups``) and the snapshot the Serve replicas follow
(:class:`actors.scheduler.snapshot_log.SnapshotLog`: :meth:`Views.publish` after every write,
:meth:`Views.full_snapshot` for a replica that is new or behind). Reads only: no state of its own.
"""

from __future__ import annotations

import time
from typing import Optional

from actors.naming import controller_name
from actors.scheduler.job_store import JobStore
from actors.scheduler.policy_ref import PolicyRef
from actors.scheduler.snapshot_log import SnapshotLog
from rollmux.admission_queue import AdmissionQueue
from rollmux.answers import GroupRecord, PolicyDelta, PolicyHeader, SnapshotDelta
from rollmux.models import ClusterSpec
from rollmux.preemption import class_of, tenant_of
from rollmux.records import JobRecord, QueueEntry, queue_places, queued_records, with_queue_place

__all__ = ["Views"]


class Views:
    """Views of one scheduler's state (see the module docstring).

    Args:
        name: the scheduler's actor name (controller names derive from it).
        policy / jobs / line / snapshots: the state it reads and where it publishes.
    """

    def __init__(self, name: str, policy: PolicyRef, jobs: JobStore, line: AdmissionQueue, snapshots: SnapshotLog):
        self.name, self.policy, self.jobs, self.line, self.snapshots = name, policy, jobs, line, snapshots

    # ---- one job, one group, the line
    def view(self, rec: JobRecord) -> JobRecord:
        """The record with its placement read from the policy (active) or as frozen (ended)."""
        return self.jobs.view(rec)

    def answer(self, rec: JobRecord) -> JobRecord:
        """The record as the scheduler answers it (a copy, without the checkpoint-only fields)."""
        return self.jobs.view(rec, answer=True)

    def group(self, gid: str) -> Optional[GroupRecord]:
        """A group as ``GET /v1/groups`` lists it (None once dissolved)."""
        try:
            st = self.policy.igs.group_stats(gid)
        except KeyError:
            return None
        return GroupRecord(gid, tuple(st["members"]), tuple(st["rollout_nodes"]), tuple(st["train_nodes"]),
                           st["cost_usd_per_h"], st["t_cycle_s"], st["t_load_s"], st["slack_s"],
                           controller_name(gid, self.name))

    def queue(self) -> tuple[QueueEntry, ...]:
        """The admission queue as published, in line order (``gpus``: the backfill size a
        replica's dry-run compares, :func:`rollmux.admission_queue.job_gpus`)."""
        cfg = self.policy.config
        return tuple(QueueEntry(q.job_id, q.spec.slo, q.enqueued_at, q.reason, q.gpus, class_of(cfg, q.spec),
                                tenant_of(cfg, q.spec)) for q in self.line.jobs())

    def queued(self, now: Optional[float] = None) -> list[JobRecord]:
        """The queued jobs as job records (state ``queued``, ``queue_position``, ``waited_s``)."""
        return queued_records(self.queue(), time.time() if now is None else now)

    # ---- queries
    def list_jobs(self) -> list[JobRecord]:
        """Every job record (admission order; a preempted job waiting with its place in the
        queue), then the queued jobs without a record (line order)."""
        records, now = self.jobs.records, time.time()
        places = queue_places(self.queue(), now) if len(self.line) else {}
        return [with_queue_place(self.answer(r), places) for r in records.values()] + [
            v for v in self.queued(now) if v.job_id not in records]

    def get_job(self, job_id: str) -> Optional[JobRecord]:
        r = self.jobs.get(job_id)
        if job_id not in self.line:
            return None if r is None else self.answer(r)
        if r is None:
            return next(v for v in self.queued() if v.job_id == job_id)
        return with_queue_place(self.answer(r), queue_places(self.queue(), time.time()))

    def list_groups(self) -> list[GroupRecord]:
        """Groups: members, nodes, Cost(G) USD/h, T_cycle, T_load and slack (T_cycle - T_load)."""
        return [self.group(g.group_id) for g in self.policy.igs.groups]

    # ---- the published snapshot (Serve replicas answer reads from it)
    def publish(self, jobs: tuple, groups: tuple, dropped: list, queue_changed: bool, written: dict) -> None:
        """Publish one committed change as the next version: the views of the changed jobs (and
        of every member of a changed group), of the changed groups (None: gone) and the queue;
        the policy's table changes exactly by the groups the write-ahead record ``written`` carries."""
        igs, records = self.policy.igs, self.jobs.records
        gids = dict.fromkeys(groups)
        for j in jobs:
            rec = records.get(j)
            if rec is not None and (g := self.jobs.group_id(rec)) is not None:
                gids[g] = None
        jids = dict.fromkeys(jobs)
        for g in gids:
            try:
                grp = igs.group(g)
            except KeyError:
                continue
            jids.update(dict.fromkeys(m.spec.job_id for m in grp.members))
        views = {j: (None if (r := records.get(j)) is None else self.answer(r)) for j in jids}
        views.update({j: None for j in dropped})
        changed = written.get("groups", {})
        policy = PolicyDelta(PolicyHeader.of(written.get("header") or igs.snapshot_header(), igs.config),
                             {g: self._policy_group(g) for g in changed}, _open_seqs(igs, changed))
        self.snapshots.publish(views, {g: self.group(g) for g in gids}, self.queue() if queue_changed else None, policy)

    def _policy_group(self, gid: str):
        """The policy's group ``gid`` as its table holds it now (None: gone)."""
        try:
            return self.policy.igs.group(gid)
        except KeyError:
            return None

    def full_snapshot(self, cluster: ClusterSpec, policy: bool = False) -> SnapshotDelta:
        """Everything a replica follows (``full``); ``policy``: also the policy table."""
        igs = self.policy.igs
        table = None
        if policy:
            table = PolicyDelta(PolicyHeader.of(igs.snapshot_header(), igs.config), {g.group_id: g for g in igs.groups},
                                _open_seqs(igs, [g.group_id for g in igs.groups]))
        return SnapshotDelta(self.snapshots.epoch, self.snapshots.version, full=True,
                             jobs={j: self.answer(r) for j, r in self.jobs.records.items()},
                             groups={g.group_id: self.group(g.group_id) for g in igs.groups}, queue=self.queue(),
                             cluster=cluster, policy=table)


def _open_seqs(igs, group_ids) -> dict[str, int]:
    """The opening-order places of those of ``group_ids`` that are open (the table as it is now)."""
    return {g: q for g in group_ids if (q := igs.open_seq(g)) is not None}
