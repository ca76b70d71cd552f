"""The GlobalScheduler's published snapshot: one version per commit, a long poll for Serve replicas.

Each checkpoint write publishes the next *snapshot version*: a delta with the views of the
changed jobs (and of every member of a changed group), of the changed groups (``None``: gone),
the admission queue when it changed, and the policy table's changes (the header and the group
snapshots the write-ahead record carried). The last :data:`SNAPSHOT_LOG` deltas are kept.
:meth:`SnapshotLog.since` answers ``snapshot_since(epoch, version, wait_s)``: at once when newer
versions exist, otherwise after the next commit (at most ``wait_s``); a caller of another actor
instance (``epoch``) or too far behind gets everything (``full: True``). Each Serve replica
follows it (``serve_app.SnapshotCache``) and answers reads from its copy, which is at most one
commit behind.

No Ray; the asyncio event of the long poll lives on the scheduler actor's event loop and is set
from any thread (:meth:`SnapshotLog.wake`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import uuid
from typing import Callable, Optional

from rollmux.answers import GroupRecord, PolicyDelta, SnapshotDelta
from rollmux.records import JobRecord, QueueEntry

__all__ = ["SNAPSHOT_LOG", "SnapshotLog"]

SNAPSHOT_LOG = 4096  # published deltas kept for replicas catching up (older: a full snapshot)


class SnapshotLog:
    """Published versions of one scheduler instance (see the module docstring)."""

    def __init__(self, keep: int = SNAPSHOT_LOG):
        self.epoch = uuid.uuid4().hex  # this actor instance's id
        self.version = 0
        self._deltas: collections.deque[dict] = collections.deque(maxlen=keep)
        self._published: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The actor's event loop (the long poll's event is set there)."""
        self._loop = loop

    def publish(self, jobs: dict[str, Optional[JobRecord]], groups: dict[str, Optional[GroupRecord]],
                queue: Optional[tuple[QueueEntry, ...]], policy: PolicyDelta) -> int:
        """Publish one committed change as the next version: job views (None: gone), group views
        (None: gone), the queue (None: unchanged) and the policy's changes. Returns the version."""
        self.version += 1
        self._deltas.append({"version": self.version, "jobs": jobs, "groups": groups, "queue": queue, "policy": policy})
        self.wake()
        return self.version

    def publish_full(self) -> int:
        """The next version replaces everything (after a restore): replicas fetch a full snapshot."""
        self.version += 1
        self._deltas.clear()
        self._deltas.append({"version": self.version, "full": True})
        self.wake()
        return self.version

    def wake(self) -> None:
        """Wake the replicas waiting in :meth:`since` (from any thread)."""
        if self._loop is None:
            return

        def fire() -> None:
            ev, self._published = self._published, asyncio.Event()
            if ev is not None:
                ev.set()

        try:
            self._loop.call_soon_threadsafe(fire)
        except RuntimeError:  # the loop closed (actor shutting down)
            pass

    async def wait_newer(self, epoch: Optional[str], version: int, wait_s: float) -> None:
        """Wait (at most ``wait_s``, 60 s) for the next commit when the caller is current."""
        self._loop = asyncio.get_running_loop()
        if epoch == self.epoch and version == self.version and wait_s > 0:
            if self._published is None:
                self._published = asyncio.Event()
            try:
                await asyncio.wait_for(self._published.wait(), timeout=min(float(wait_s), 60.0))
            except asyncio.TimeoutError:
                pass

    def changes(self, epoch: Optional[str], version: int, policy: bool,
                full: Callable[[], SnapshotDelta]) -> SnapshotDelta:
        """The changes after ``version`` of ``epoch`` merged into one answer, or ``full()`` when
        the caller is new, of another instance, or too far behind (see the module docstring)."""
        first = self._deltas[0]["version"] if self._deltas else self.version + 1
        newer = list(itertools.islice(self._deltas, max(0, version + 1 - first), None))  # versions are consecutive
        if (epoch != self.epoch or version > self.version or any(d.get("full") for d in newer)
                or (newer and newer[0]["version"] != version + 1)):
            return full()
        jobs: dict = {}
        groups: dict = {}
        queue = header = None
        table: dict = {}
        seqs: dict = {}  # the open groups' places in the opening order, as of the last change to each
        for d in newer:
            jobs.update(d["jobs"])
            groups.update(d["groups"])
            if d["queue"] is not None:
                queue = d["queue"]
            if policy:
                header = d["policy"].header
                table.update(d["policy"].groups)
                for gid in d["policy"].groups:
                    seqs.pop(gid, None)
                seqs.update(d["policy"].open_seqs)
        return SnapshotDelta(self.epoch, self.version, jobs=jobs, groups=groups, queue=queue,
                             policy=PolicyDelta(header, table, seqs) if policy else None)
