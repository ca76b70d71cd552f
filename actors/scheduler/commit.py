"""The GlobalScheduler's unit of work: one atomic checkpoint write per state change, with group commit.

The KV store (:mod:`actors.scheduler.kv`: file directory or Ray GCS internal KV) holds a base (the whole
state: the policy's snapshot header and groups, every job record, the admission queue) and
write-ahead records (:class:`actors.scheduler.checkpoint.Checkpoint`). Every state change is ONE ``put`` of
one record holding the changed job records and groups and, when the admission queue changed,
the whole queue; a crash before the write means the change never happened, after it that it
did; a store error rolls the in-memory table and records back (:meth:`Commit.transaction`).

A service that changes state says what it changed (:meth:`Commit.mark`, :meth:`Commit.queue_changed`)
and which groups' controllers must hear of it (:meth:`Commit.push`); :class:`Commit` owns what
waits for the next write (the changed jobs and groups, the pushes, the dropped records, the
batch's waiters) and the last record written, and writes, publishes (the next snapshot version,
:mod:`actors.scheduler.snapshot_log`) and pushes, in that order (target state first).

Group commit (the HTTP path: ``admit_batched`` / ``depart_batched`` / ``admit_many``): writes stay
serial (one decision at a time, in arrival order, on the actor's event loop), and the decisions
that arrive within ``GROUP_COMMIT_WINDOW_S`` (and while the previous write runs) share ONE
checkpoint write (:meth:`Commit.batched`); only then are the callers answered and the touched
groups' controllers pushed. A failed write restores the last written state: nothing of the
batch happened, each caller gets code ``unavailable``. Inside the actor, a change made of
several steps (a departure and the queued jobs it lets in) is one write too (:meth:`Commit.batch`).

Compaction (a new base, :mod:`actors.scheduler.checkpoint`) is O(stored jobs): with ``compaction=
"background"`` (the actor's default) a write that makes one due only wakes the compactor
thread (:meth:`Commit.compact_pending`), which copies the checkpoint's state mirror under
the lock and encodes and writes the base outside it; the reply never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any, Callable, Optional

from actors.scheduler.checkpoint import Checkpoint
from actors.scheduler.job_store import JobStore
from actors.scheduler.policy_ref import PolicyRef
from actors.scheduler.snapshot_log import SnapshotLog
from rollmux.admission import InterGroupScheduler
from rollmux.admission_queue import AdmissionQueue

log = logging.getLogger("rollmux.scheduler")

__all__ = ["Commit", "GROUP_COMMIT_WINDOW_S", "COMPACTION_MODES", "full_state", "load_state"]

GROUP_COMMIT_WINDOW_S = 0.002  # a batch of the HTTP path's decisions collects this long before its one write, s
COMPACT_POLL_S = 5.0  # the compactor thread also looks for a due base this often, s
COMPACTION_MODES = ("inline", "background", "manual")

#: ``publish(jobs, groups, dropped, queue_changed, written)``: publish one committed change
#: (:meth:`actors.scheduler.views.Views.publish`; ``written``: the write-ahead record)
Publish = Callable[[tuple, tuple, list, bool, dict], None]


def full_state(policy: PolicyRef, jobs: JobStore, line: Optional[AdmissionQueue]) -> dict:
    """The whole state as a checkpoint base keeps it (``queue`` None before the line exists)."""
    igs = policy.igs
    return {"header": igs.snapshot_header(),
            "groups": {g.group_id: igs.group_snapshot(g.group_id) for g in igs.groups},
            "jobs": jobs.snapshot(), "queue": None if line is None else line.snapshot()}


def load_state(policy: PolicyRef, jobs: JobStore, state: dict) -> None:
    """Rebuild the policy's table and the job records from a restored state (see
    :meth:`actors.scheduler.checkpoint.Checkpoint.load`)."""
    groups = [g for g in state["groups"].values() if g]
    policy.igs = InterGroupScheduler.restore(policy.cluster, {**state["header"], "groups": groups})
    jobs.load(state["jobs"])


class Commit:
    """The scheduler's unit of work (see the module docstring).

    Args:
        store: the checkpoint (base + write-ahead records).
        policy / jobs / line: what a write carries: the policy's table, the job records, the
            admission queue.
        snapshots: where a committed change is published.
        publish: builds and publishes the views of a committed change (:data:`Publish`).
        send: ``send(groups)``: push the groups' target membership to their controllers
            (:meth:`actors.scheduler.reconciler.Reconciler.push`).
        compaction: where a due compaction runs: ``"inline"`` (inside the write that makes it
            due), ``"background"`` (the compactor thread) or ``"manual"`` (:meth:`compact_pending`).
    Raises:
        ValueError: an unknown ``compaction``.
    """

    def __init__(self, store: Checkpoint, policy: PolicyRef, jobs: JobStore, line: AdmissionQueue,
                 snapshots: SnapshotLog, publish: Publish, send: Callable[[Any], Any], compaction: str = "inline"):
        if compaction not in COMPACTION_MODES:
            raise ValueError(f"compaction must be one of {', '.join(COMPACTION_MODES)}, not {compaction!r}")
        self.store, self.policy, self.jobs, self.line = store, policy, jobs, line
        self.snapshots, self._publish, self._send = snapshots, publish, send
        self.compaction = compaction
        self.compactions_inline = 0  # bases written inside a write (on its caller's reply path)
        self.compactions_off_reply = 0  # bases written by compact_pending (off the reply path)
        self.compact_wake = threading.Event()
        # what waits for the next write
        self.deferred = False  # inside a batch: changes wait for the batch's one write
        self._jobs: dict[str, None] = {}
        self._groups: dict[str, None] = {}
        self._pushes: dict[str, None] = {}
        self._dropped: list[str] = []
        self._queue_dirty = False
        self._waiters: list[Any] = []  # asyncio futures of the batch being collected
        self._flush_scheduled = False
        self._written: Optional[dict] = None  # the last write-ahead record (its group snapshots are published)

    # ---- what a service changed
    def mark(self, jobs: tuple = (), groups: tuple = ()) -> None:
        """Commit a state change of ``jobs`` / ``groups``: at once, or (inside a batch) with the
        batch, in ONE write. Either way every change waiting is written, then published."""
        self._jobs.update(dict.fromkeys(jobs))
        self._groups.update(dict.fromkeys(groups))
        if not self.deferred:
            self.flush(force=True)

    def queue_changed(self) -> None:
        """The admission queue changed: the next write carries the whole line."""
        self._queue_dirty = True

    @property
    def pending(self) -> bool:
        """Changes are waiting for a write."""
        return bool(self._jobs or self._groups or self._queue_dirty)

    def push(self, groups, lookup: bool = False) -> None:
        """Send each group's target membership to its controller, if it has one; never waits.
        Inside a batch the pushes wait for the batch's write (target state first)."""
        if self.deferred and not lookup:
            self._pushes.update(dict.fromkeys(groups))
            return
        self._send(groups, lookup=lookup)

    @contextlib.contextmanager
    def batch(self, force: bool = False):
        """Collect the changes of the body into one write: the outermost batch writes them when
        it ends (``force``: also when nothing changed, so the waiters are released and a new
        version published); a batch inside another (or inside :meth:`batched`) leaves the write
        to it."""
        outer, self.deferred = self.deferred, True
        try:
            yield
        finally:
            self.deferred = outer
        if not outer:
            self.flush(force=force)

    @contextlib.contextmanager
    def transaction(self):
        """Roll the policy's table and the active records back when the body raises (e.g. the
        checkpoint write failed): a state change that was not committed did not happen."""
        saved = self.policy.igs.snapshot()
        records = self.jobs.copy_active()
        try:
            yield
        except Exception:
            self.policy.igs = InterGroupScheduler.restore(self.policy.cluster, saved)
            self.jobs.records = records
            raise

    def transaction_unless_batched(self):
        """:meth:`transaction`, except inside a batch: a batch's failed write restores the last
        written state instead, so no per-change copy is taken."""
        return contextlib.nullcontext() if self.deferred else self.transaction()

    # ---- the write
    def flush(self, force: bool = False) -> None:
        """Write every change waiting (one checkpoint write), publish it as the next snapshot
        version, push the touched groups' controllers and release the batch's waiters. A failed
        write restores the last written state (nothing of the batch happened) and fails the waiters."""
        jobs, groups = tuple(self._jobs), tuple(self._groups)
        queue_changed, pushes, waiters = self._queue_dirty, tuple(self._pushes), self._waiters
        self._jobs, self._groups, self._pushes, self._waiters = {}, {}, {}, []
        self._queue_dirty = False
        if not (force or jobs or groups or queue_changed or waiters):
            return
        try:
            self._write(jobs, groups, queue_changed)
        except Exception as e:
            log.exception("checkpoint write failed: the batch of %d waiting calls is undone", len(waiters))
            self.reload()
            self._resolve(waiters, e)
            raise
        dropped, self._dropped = self._dropped, []
        written, self._written = self._written or {}, None
        self._publish(jobs, groups, dropped, queue_changed, written)
        self.push(pushes)
        self._resolve(waiters, None)

    def _delta(self, jobs: tuple = (), groups: tuple = (), dropped: tuple = (), queue: bool = False) -> dict:
        """What one state change wrote: the given job records and groups (None: gone), the
        policy's snapshot header, the records dropped from the table and, when
        ``queue``, the whole admission queue (in the same record: one atomic put)."""
        igs, records = self.policy.igs, self.jobs.records
        return {"header": igs.snapshot_header(), "groups": {gid: igs.group_snapshot(gid) for gid in groups},
                "jobs": {j: JobStore.stored(records[j]) for j in jobs if j in records}, "dropped": list(dropped),
                **({"queue": self.line.snapshot()} if queue else {})}

    def _write(self, jobs: tuple = (), groups: tuple = (), queue: bool = False) -> None:
        """Commit one state change: ONE write-ahead record carrying the changed job records and
        groups and, when ``queue``, the admission queue. Records of ended jobs beyond
        MAX_FINISHED_RECORDS are dropped in the same record. Raises (and the caller rolls back)
        when the store fails."""
        drop = self.jobs.prune_candidates()  # only a change that ended a job can push them over the bound
        delta = self._delta(jobs, groups, drop, queue)
        self.store.append(delta)
        self._written = delta  # its header and group snapshots are published as they were written
        self.jobs.drop(drop)
        self._dropped.extend(drop)
        if self.store.wants_compaction():  # the change is committed: a failing compaction is retried later
            if self.compaction == "inline":
                self.compactions_inline += 1
                self._compact_now()
            else:  # off the reply path: the compactor thread (or the caller) runs compact_pending
                self.compact_wake.set()

    def reload(self) -> None:
        """Back to the last written state after a failed write (the uncommitted changes never happened)."""
        state = self.store.load()
        if state is not None:
            load_state(self.policy, self.jobs, state)
            self.line.restore(state.get("queue"))
        self.jobs.ended_since_prune = True
        self.snapshots.publish_full()

    def full_state(self) -> dict:
        return full_state(self.policy, self.jobs, self.line)

    # ---- compaction
    def _compact_now(self) -> bool:
        """Write the state mirror as the new base; a failure is logged (the records stay)."""
        view = self.store.base_view()
        try:
            return view is not None and self.store.write_base(*view)
        except Exception:
            log.exception("checkpoint compaction failed; the write-ahead records stay and it is retried")
            return False

    def compact_pending(self, lock) -> bool:
        """Compact the checkpoint log when a new base is due, off the reply path. Holds ``lock``
        (the scheduler's) only to copy the state mirror's containers
        (:meth:`actors.scheduler.checkpoint.Checkpoint.base_view`); encoding the base, its write
        and the deletes of the records it covers run outside it. True when a base was written
        (counted in ``compactions_off_reply``)."""
        with lock:
            if not self.store.wants_compaction():
                return False
            view = self.store.base_view()
        if view is None:
            return False
        try:
            done = self.store.write_base(*view)
        except Exception:
            log.exception("checkpoint compaction failed; the write-ahead records stay and it is retried")
            return False
        self.compactions_off_reply += int(done)
        return done

    def compact_loop(self, stop: threading.Event, lock) -> None:
        """The compactor thread: waits for a write that made a base due, then compacts."""
        while not stop.is_set():
            self.compact_wake.wait(COMPACT_POLL_S)
            self.compact_wake.clear()
            if stop.is_set():
                return
            self.compact_pending(lock)

    # ---- group commit (the HTTP path)
    def _resolve(self, waiters: list, err: Optional[BaseException]) -> None:
        version = self.snapshots.version

        def done(f) -> None:
            if not f.done():
                f.set_exception(err) if err is not None else f.set_result(version)

        for f in waiters:  # each on its own event loop (the actor has one)
            f.get_loop().call_soon_threadsafe(done, f)

    async def batched(self, lock, fn, *args) -> tuple[Any, Optional[int], Optional[str]]:
        """``fn(*args)`` (a decision, under ``lock``) with its write shared with the other
        decisions of the batch, once that write is done: ``(fn's answer, the published snapshot
        version that contains it, None)``; ``(None, None, reason)`` when the batch's write failed
        (nothing of it happened)."""
        loop = asyncio.get_running_loop()
        self.snapshots.bind_loop(loop)
        with lock:
            self.deferred = True
            try:
                out = fn(*args)
            finally:
                self.deferred = False
            if not self.pending:
                return out, self.snapshots.version, None
            fut = loop.create_future()
            self._waiters.append(fut)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.create_task(self._flush_soon(lock))
        try:
            version = await fut
        except Exception as e:  # the batch's write failed: nothing of it happened
            return None, None, f"the checkpoint write failed ({type(e).__name__}: {e}); nothing changed, retry"
        return out, version, None

    async def _flush_soon(self, lock) -> None:
        await asyncio.sleep(GROUP_COMMIT_WINDOW_S)
        with lock:
            self._flush_scheduled = False
            try:
                self.flush()
            except Exception:  # logged by flush; the waiters got the error
                pass
