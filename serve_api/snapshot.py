"""A Serve replica's copy of the scheduler's published snapshot (reads that scale with replicas).

:class:`SnapshotCache` long-polls ``snapshot_since`` (:mod:`actors.scheduler.snapshot_log`) through the
replica's :class:`serve_api.client.SchedulerClient` and answers ``GET /v1/jobs``, ``GET
/v1/jobs/{id}``, ``GET /v1/groups`` and dry-runs from its copy, never queueing behind the
scheduler's writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Optional

from rollmux.answers import Admission, PolicyHeader
from rollmux.models import ClusterSpec, CoExecutionGroup, JobSpec
from rollmux.records import JobRecord, QueueEntry, queue_places, queued_records, with_queue_place
from serve_api.views import _finite

if TYPE_CHECKING:
    from serve_api.client import SchedulerApi

log = logging.getLogger("rollmux.serve")


class SnapshotCache:
    """A replica's copy of the scheduler's published snapshot (jobs, groups, admission queue).

    A background task long-polls ``snapshot_since(epoch, version)`` and applies each reply (a
    delta, or everything after a scheduler restart); reads are answered from the copy, so they
    never queue behind the scheduler's writes. Each job's JSON is encoded once per change, so a
    list costs a join, not a re-encoding. ``ready`` is False until the first snapshot arrived or
    after the scheduler stayed unreachable (readers then fall back to asking the scheduler).
    """

    LONG_POLL_S = 5.0

    def __init__(self, client: "SchedulerApi"):
        self.client = client
        self.epoch: Optional[str] = None
        self.version = -1
        self.jobs: dict[str, JobRecord] = {}
        self._json: dict[str, bytes] = {}
        self.groups: dict[str, dict] = {}  # group id -> its JSON form
        self._groups_json: Optional[bytes] = None
        self.queue: tuple[QueueEntry, ...] = ()
        # the policy's table (dry-runs): its groups, and a copy of the policy built on the first
        # dry-run, then brought up to date lazily (only the groups changed since the last one)
        self.cluster: Optional[ClusterSpec] = None
        self._policy_header: Optional[PolicyHeader] = None
        self._policy_groups: dict[str, CoExecutionGroup] = {}
        self._policy_seqs: dict[str, int] = {}  # open groups' places in the opening order (candidates' order)
        self._policy = None
        self._policy_pending: dict[str, Optional[CoExecutionGroup]] = {}
        self.want_policy = False  # set by the first dry-run: the follower then resyncs with the policy table
        self.has_policy = False
        self.ready = False
        self._changed = asyncio.Event()
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        """Start following (idempotent; on the first request, inside the replica's event loop; a
        test client running each request on a new loop gets a follower per loop)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._changed = asyncio.Event()
            self.ready = False
            self._task = loop.create_task(self._follow())

    async def _follow(self) -> None:
        import json

        while True:
            try:
                ask = self.want_policy
                resync = ask and not self.has_policy  # everything once, the policy table with it
                d = await self.client.snapshot_since(None if resync else self.epoch, self.version,
                                                     self.LONG_POLL_S if self.ready and not resync else 0.0, ask)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the scheduler restarts: readers fall back, we try again
                log.warning("snapshot follow failed: %s", e)
                self.ready = False
                await asyncio.sleep(0.5)
                continue
            if d.full:
                self.jobs, self._json, self.groups = {}, {}, {}
                self.cluster = d.cluster
                self._policy_groups, self._policy, self._policy_pending, self._policy_seqs = {}, None, {}, {}
                self.has_policy = ask and d.policy is not None
            if d.policy is not None:
                if d.policy.header is not None:
                    self._policy_header = d.policy.header
                for gid, grp in d.policy.groups.items():
                    if grp is None:
                        self._policy_groups.pop(gid, None)
                    else:
                        self._policy_groups[gid] = grp
                    seq = d.policy.open_seqs.get(gid)
                    if seq is None:
                        self._policy_seqs.pop(gid, None)
                    else:
                        self._policy_seqs[gid] = seq
                    if self._policy is not None:
                        self._policy_pending[gid] = grp
            for jid, rec in d.jobs.items():
                if rec is None:
                    self.jobs.pop(jid, None)
                    self._json.pop(jid, None)
                else:
                    self.jobs.pop(jid, None)  # a re-admitted id moves to the end (admission order)
                    self.jobs[jid] = rec
                    self._json[jid] = json.dumps(_finite(rec.public()), separators=(",", ":")).encode()
            if d.groups or d.full:
                for gid, grp in d.groups.items():
                    if grp is None:
                        self.groups.pop(gid, None)
                    else:
                        self.groups[gid] = grp.to_dict()
                self._groups_json = None
            if d.queue is not None:
                self.queue = d.queue
            self.epoch, self.version, self.ready = d.epoch, d.version, True
            ev, self._changed = self._changed, asyncio.Event()
            ev.set()

    async def wait_version(self, version: Optional[int], timeout_s: float = 2.0) -> bool:
        """Wait (bounded) until the copy holds ``version``; True when it does."""
        self.start()
        return await self._wait_until(lambda: self.ready and (version is None or self.version >= version), timeout_s)

    async def _wait_until(self, done, timeout_s: float) -> bool:
        """Wait (bounded by ``timeout_s`` seconds) until ``done()`` holds, re-checking at every
        change the follower applies; True when it holds."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                return False
        return True

    def _policy_now(self):
        """The copy of the policy's table at this copy's version (built once, then updated with
        the groups changed since the last call; :meth:`rollmux.admission.InterGroupScheduler.load_groups`)."""
        from rollmux.admission import InterGroupScheduler

        if self._policy is None:
            self._policy = InterGroupScheduler.restore(
                self.cluster, {**self._policy_header.to_dict(), "groups": list(self._policy_groups.values()),
                               "open_seqs": dict(self._policy_seqs)})
            self._policy_pending = {}
        elif self._policy_pending:
            self._policy.load_groups(self._policy_header.to_dict(), self._policy_pending, self._policy_seqs)
            self._policy_pending = {}
        return self._policy

    async def follow_policy(self, timeout_s: float = 2.0) -> bool:
        """Follow the policy table too (the first dry-run asks): the follower's long poll is
        restarted as one full read with the table; waits (bounded) until the copy holds it."""
        if not self.has_policy and not self.want_policy:
            self.want_policy = True
            if self._task is not None and not self._task.done():
                self._task.cancel()  # only ever cancelled while awaiting a reply, never mid-apply
            self._task = asyncio.get_running_loop().create_task(self._follow())
        return await self._wait_until(lambda: self.has_policy, timeout_s)

    def what_if(self, spec: JobSpec, queue: bool, explain: str) -> Optional[Admission]:
        """The dry-run answer from this copy (:func:`rollmux.admission_queue.what_if`, the function
        the scheduler answers its own dry-runs with), with ``snapshot_version``; None when the
        scheduler must answer: the copy is not ready, or the job id is admitted, running or queued
        (a replay or a duplicate, decided from the scheduler's records)."""
        from rollmux.admission_queue import what_if

        if not self.has_policy:
            return None
        if not self.ready or self.cluster is None or self._policy_header is None:
            return None
        rec = self.jobs.get(spec.job_id)
        if rec is not None and rec.state.is_active():
            return None
        if any(q.job_id == spec.job_id for q in self.queue):
            return None
        pol = self._policy_now()
        out = what_if(pol, spec, [int(q.gpus) for q in self.queue], backfill=pol.config.queue_backfill,
                      queue=queue, explain=explain)
        return out.replace(snapshot_version=self.version)

    def jobs_body(self, limit: Optional[int], offset: int) -> bytes:
        """``GET /v1/jobs`` from the copy: records in admission order, then the queued jobs."""
        import itertools

        parts = self._json.values()
        if self.queue:
            import json

            now = time.time()
            places = queue_places(self.queue, now)
            # a preempted job waiting: its record with its place in the queue
            parts = (b if j not in places else json.dumps(_finite(with_queue_place(self.jobs[j], places).public()),
                                                          separators=(",", ":")).encode()
                     for j, b in self._json.items())
            parts = itertools.chain(parts, [json.dumps(_finite(v.public()), separators=(",", ":")).encode()
                                            for v in queued_records(self.queue, now)
                                            if v.job_id not in self.jobs])
        # a page costs its own length, not the number of stored jobs (dict views are not sliceable)
        page = itertools.islice(parts, offset, None if limit is None else offset + limit)
        return b"[" + b",".join(page) + b"]"

    def job(self, job_id: str) -> Optional[dict]:
        """The job's JSON form from the copy (None: unknown)."""
        if job_id in self.jobs:
            rec = self.jobs[job_id]
            return _finite((with_queue_place(rec, queue_places(self.queue, time.time())) if self.queue else rec).public())
        for v in queued_records(self.queue, time.time()) if any(q.job_id == job_id for q in self.queue) else ():
            if v.job_id == job_id:
                return _finite(v.public())
        return None

    def groups_body(self, limit: Optional[int], offset: int) -> bytes:
        import json

        if self._groups_json is None or limit is not None or offset:
            views = list(self.groups.values())[offset: None if limit is None else offset + limit]
            body = json.dumps(_finite(views), separators=(",", ":")).encode()
            if limit is None and not offset:
                self._groups_json = body
            return body
        return self._groups_json
