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
from rollmux.preemption import class_of, tenant_of
from rollmux.records import JobRecord, queue_places, queued_records, with_queue_place

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

    def public(self, rec: JobRecord) -> dict:
        return self.jobs.view(rec).public()

    def group(self, gid: str) -> Optional[dict]:
        """A group as ``GET /v1/groups`` lists it (None once dissolved)."""
        try:
            st = self.policy.igs.group_stats(gid)
        except KeyError:
            return None
        return {"group_id": gid, "members": st["members"], "rollout_nodes": st["rollout_nodes"],
                "train_nodes": st["train_nodes"], "cost_usd_per_h": st["cost_usd_per_h"],
                "t_cycle_s": st["t_cycle_s"], "t_load_s": st["t_load_s"], "slack_s": st["slack_s"],
                "controller": controller_name(gid, self.name)}

    def queue(self) -> list[dict]:
        """The admission queue as published: ``job_id, slo, queued_at, reason, gpus`` in line order
        (``gpus``: the backfill size a replica's dry-run compares, :func:`rollmux.admission_queue.job_gpus`)."""
        cfg = self.policy.config
        return [{"job_id": q.job_id, "slo": q.spec.slo, "queued_at": q.enqueued_at, "reason": q.reason, "gpus": q.gpus,
                 "priority_class": class_of(cfg, q.spec), "tenant": tenant_of(cfg, q.spec)}
                for q in self.line.jobs()]

    def queued(self, now: Optional[float] = None) -> list[dict]:
        """The queued jobs as job views (state ``queued``, ``queue_position``, ``waited_s``)."""
        return queued_records(self.queue(), time.time() if now is None else now)

    # ---- queries
    def list_jobs(self) -> list[dict]:
        """Every job record (admission order; a preempted job waiting with its place in the
        queue), then the queued jobs without a record (line order)."""
        records, now = self.jobs.records, time.time()
        places = queue_places(self.queue(), now) if len(self.line) else {}
        return [with_queue_place(self.public(r), places) for r in records.values()] + [
            v for v in self.queued(now) if v["job_id"] not in records]

    def get_job(self, job_id: str) -> Optional[dict]:
        r = self.jobs.get(job_id)
        if job_id not in self.line:
            return None if r is None else self.public(r)
        if r is None:
            return next(v for v in self.queued() if v["job_id"] == job_id)
        return with_queue_place(self.public(r), queue_places(self.queue(), time.time()))

    def list_groups(self) -> list[dict]:
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
        views = {j: (None if (r := records.get(j)) is None else self.public(r)) for j in jids}
        views.update({j: None for j in dropped})
        policy = {"header": written.get("header") or igs.snapshot_header(), "groups": dict(written.get("groups", {}))}
        self.snapshots.publish(views, {g: self.group(g) for g in gids}, self.queue() if queue_changed else None, policy)

    def full_snapshot(self, cluster: dict, policy: bool = False) -> dict:
        """Everything a replica follows (``full: True``); ``policy``: also the policy table."""
        igs = self.policy.igs
        out = {"epoch": self.snapshots.epoch, "version": self.snapshots.version, "full": True, "cluster": cluster,
               "jobs": {j: self.public(r) for j, r in self.jobs.records.items()},
               "groups": {g.group_id: self.group(g.group_id) for g in igs.groups},
               "queue": self.queue()}
        if policy:
            out["policy"] = {"header": igs.snapshot_header(),
                             "groups": {g.group_id: igs.group_snapshot(g.group_id) for g in igs.groups}}
        return out
