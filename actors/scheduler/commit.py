"""The GlobalScheduler's checkpoint part: one atomic write per state change, with group commit.

The KV store (:mod:`actors.scheduler.kv`: file directory or Ray GCS internal KV) holds a base (the whole
state: the policy's snapshot header and groups, every job record, the admission queue) and
write-ahead records (:class:`actors.scheduler.checkpoint.Checkpoint`). Every state change is ONE ``put`` of
one record holding the changed job records and groups and, when the admission queue changed,
the whole queue; a crash before the write means the change never happened, after it that it
did; a store error rolls the in-memory table and records back (:meth:`CommitPart._transaction`).

Group commit (the HTTP path: ``admit_batched`` / ``depart_batched`` / ``admit_many``): writes stay
serial (one decision at a time, in arrival order, on the actor's event loop), and the decisions
that arrive within ``GROUP_COMMIT_WINDOW_S`` (and while the previous write runs) share ONE
checkpoint write; only then are the callers answered and the touched groups' controllers pushed
(target state first). A failed write restores the last written state: nothing of the batch
happened, each caller gets code ``unavailable``. Each write publishes the next snapshot version
(:mod:`actors.scheduler.snapshot_log`).

Compaction (a new base, :mod:`actors.scheduler.checkpoint`) is O(stored jobs): with ``compaction=
"background"`` (the actor's default) a write that makes one due only wakes the compactor
thread (:meth:`CommitPart.compact_pending`), which copies the checkpoint's state mirror under
the lock and encodes and writes the base outside it; the reply never waits for it.

This part (:class:`CommitPart`, mixed into ``GlobalSchedulerImpl``) owns the changes waiting for
the next write (``_pending_*``, ``_waiters``, ``_defer``) and the last record written (``_written``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Optional

from actors.scheduler.job_store import JobStore
from rollmux.admission import InterGroupScheduler
from rollmux.codes import Code

log = logging.getLogger("rollmux.scheduler")

__all__ = ["CommitPart", "GROUP_COMMIT_WINDOW_S", "COMPACTION_MODES"]

GROUP_COMMIT_WINDOW_S = 0.002  # a batch of the HTTP path's decisions collects this long before its one write, s
COMPACT_POLL_S = 5.0  # the compactor thread also looks for a due base this often, s
COMPACTION_MODES = ("inline", "background", "manual")


class CommitPart:
    """The checkpoint and group-commit methods of the GlobalScheduler (see the module docstring)."""

    compaction = "inline"  # where a due compaction runs: inline (in the write) | background | manual
    compactions_inline = 0  # bases written inside a write (on its caller's reply path)
    compactions_off_reply = 0  # bases written by compact_pending (off the reply path)

    # ---- checkpoint: a base snapshot plus a write-ahead log, one atomic write per state change
    def _delta(self, jobs: tuple = (), groups: tuple = (), dropped: tuple = (), queue: bool = False) -> dict:
        """What one state change wrote: the given job records and groups (None: gone), the
        policy's snapshot header, the records dropped from the table and, when
        ``queue``, the whole admission queue (in the same record: one atomic put)."""
        return {"header": self.igs.snapshot_header(),
                "groups": {gid: self.igs.group_snapshot(gid) for gid in groups},
                "jobs": {j: JobStore.stored(self.jobs[j]) for j in jobs if j in self.jobs}, "dropped": list(dropped),
                **({"queue": self.queue.snapshot()} if queue else {})}

    def _checkpoint(self, jobs: tuple = (), groups: tuple = ()) -> None:
        """Commit a state change of ``jobs`` / ``groups``: at once, or (inside :meth:`admit_batched` /
        :meth:`depart_batched`, group commit) with the batch being collected, in ONE write for the
        batch. Either way every change waiting is written, then published (:meth:`snapshot_since`)."""
        self._pending_jobs.update(dict.fromkeys(jobs))
        self._pending_groups.update(dict.fromkeys(groups))
        if not self._defer:
            self._flush(force=True)

    def _flush(self, force: bool = False) -> None:
        """Write every change waiting (one checkpoint write), publish it as the next snapshot
        version, push the touched groups' controllers and release the batch's waiters. A failed
        write restores the last written state (nothing of the batch happened) and fails the waiters."""
        jobs, groups = tuple(self._pending_jobs), tuple(self._pending_groups)
        queue_changed, pushes, waiters = self._queue_dirty, tuple(self._pending_push), self._waiters
        self._pending_jobs, self._pending_groups, self._pending_push, self._waiters = {}, {}, {}, []
        self._queue_dirty = False
        if not (force or jobs or groups or queue_changed or waiters):
            return
        try:
            self._write(jobs, groups, queue_changed)
        except Exception as e:
            log.exception("checkpoint write failed: the batch of %d waiting calls is undone", len(waiters))
            self._reload()
            self._resolve(waiters, e)
            raise
        dropped, self._dropped = self._dropped, []
        self._publish(jobs, groups, dropped, queue_changed)
        self._push(pushes)
        self._resolve(waiters, None)

    def _reload(self) -> None:
        """Back to the last written state after a failed write (the uncommitted changes never happened)."""
        state = self.store.load()
        if state is not None:
            self._load_state(state)
            self.queue.restore(state.get("queue"))
        self.job_store.ended_since_prune = True
        self.snapshots.publish_full()

    def _write(self, jobs: tuple = (), groups: tuple = (), queue: bool = False) -> None:
        """Commit one state change: ONE write-ahead record (:class:`actors.scheduler.checkpoint.Checkpoint`)
        carrying the changed job records and groups and, when ``queue``, the admission queue (a
        crash before it: the change never happened; after it: it did). Records of ended jobs beyond MAX_FINISHED_RECORDS are
        dropped in the same record. Raises (and the caller rolls back) when the store fails."""
        drop = self.job_store.prune_candidates()  # only a change that ended a job can push them over the bound
        delta = self._delta(jobs, groups, drop, queue)
        self.store.append(delta)
        self._written = delta  # its header and group snapshots are published as they were written
        self.job_store.drop(drop)
        self._dropped.extend(drop)
        if self.store.wants_compaction():  # the change is committed: a failing compaction is retried later
            if self.compaction == "inline":
                self.compactions_inline += 1
                self._compact_now()
            else:  # off the reply path: the compactor thread (or the caller) runs compact_pending
                self._compact_wake.set()

    def _compact_now(self) -> bool:
        """Write the state mirror as the new base; a failure is logged (the records stay)."""
        view = self.store.base_view()
        try:
            return view is not None and self.store.write_base(*view)
        except Exception:
            log.exception("checkpoint compaction failed; the write-ahead records stay and it is retried")
            return False

    def compact_pending(self) -> bool:
        """Compact the checkpoint log when a new base is due, off the reply path (the compactor
        thread calls this when ``compaction="background"``; a caller with ``"manual"``). Holds
        the scheduler's lock only to copy the state mirror's containers
        (:meth:`actors.scheduler.checkpoint.Checkpoint.base_view`); encoding the base, its write and the
        deletes of the records it covers run outside it, so no admission waits for them. True
        when a base was written (counted in ``compactions_off_reply``)."""
        with self._lock:
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

    def _compact_loop(self) -> None:
        """The compactor thread: waits for a write that made a base due, then compacts."""
        while not self._stop.is_set():
            self._compact_wake.wait(COMPACT_POLL_S)
            self._compact_wake.clear()
            if self._stop.is_set():
                return
            self.compact_pending()

    def _full_state(self) -> dict:
        return {"header": self.igs.snapshot_header(),
                "groups": {g.group_id: self.igs.group_snapshot(g.group_id) for g in self.igs.groups},
                "jobs": self.job_store.snapshot(),
                "queue": None if self.queue is None else self.queue.snapshot()}

    def _load_state(self, state: dict) -> None:
        """Rebuild the policy's table and the job records from a restored state (see
        :meth:`actors.scheduler.checkpoint.Checkpoint.load`)."""
        groups = [g for g in state["groups"].values() if g]
        self.igs = InterGroupScheduler.restore(self.cluster, {**state["header"], "groups": groups})
        self.job_store.load(state["jobs"])

    @contextlib.contextmanager
    def _transaction(self):
        """Roll the policy's table and the active records back when the body raises (e.g. the
        checkpoint write failed): a state change that was not committed did not happen."""
        saved = self.igs.snapshot()
        jobs = self.job_store.copy_active()
        try:
            yield
        except Exception:
            self.igs = InterGroupScheduler.restore(self.cluster, saved)
            self.job_store.records = jobs
            raise

    def _resolve(self, waiters: list, err: Optional[BaseException]) -> None:
        version = self.version

        def done(f) -> None:
            if not f.done():
                f.set_exception(err) if err is not None else f.set_result(version)

        for f in waiters:  # each on its own event loop (the actor has one)
            f.get_loop().call_soon_threadsafe(done, f)

    async def admit_batched(self, spec: dict, dry_run: bool = False, queue: bool = False,
                            explain: str = "chosen") -> dict:
        """:meth:`admit` with group commit (the HTTP path): the decision is taken at once, in
        arrival order; its checkpoint write is shared with the other decisions of the batch
        (collected for ``GROUP_COMMIT_WINDOW_S`` and while the previous write runs) and the call
        returns once that write is done, with ``snapshot_version`` (the published version that
        contains it). A failed write: code ``unavailable`` (nothing of the batch happened).
        ``explain``: ``"chosen"`` (default) or ``"full"`` candidate list of an admission."""
        out = await self._batched(self.admit, spec, dry_run, queue, explain)
        if "unavailable" in out:
            return {"job_id": spec.get("job_id") if isinstance(spec, dict) else None, "admitted": False,
                    "code": Code.UNAVAILABLE, "reason": out["unavailable"]}
        return out

    async def admit_many(self, calls: list) -> list[dict]:
        """Several :meth:`admit_batched` calls in ONE actor call (a Serve replica's batch of
        ``POST /v1/jobs``: ``[[spec, dry_run, queue, explain], ...]``): decided one at a time in list
        order, sharing the group commit's write; the answers in the same order."""
        return list(await asyncio.gather(*(self.admit_batched(*c) for c in calls)))

    async def depart_batched(self, job_id: str) -> Optional[dict]:
        """:meth:`depart` with group commit (see :meth:`admit_batched`); ``{"unavailable": reason}``
        when the batch's write failed (the departure did not happen)."""
        return await self._batched(self.depart, job_id)

    async def _batched(self, fn, *args):
        loop = asyncio.get_running_loop()
        self.snapshots.bind_loop(loop)
        with self._lock:
            self._defer = True
            try:
                out = fn(*args)
            finally:
                self._defer = False
            if not (self._pending_jobs or self._pending_groups or self._queue_dirty):
                if isinstance(out, dict):
                    out["snapshot_version"] = self.version
                return out
            fut = loop.create_future()
            self._waiters.append(fut)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.create_task(self._flush_soon())
        try:
            version = await fut
        except Exception as e:  # the batch's write failed: nothing of it happened
            return {"unavailable": f"the checkpoint write failed ({type(e).__name__}: {e}); nothing changed, retry"}
        if isinstance(out, dict):
            out["snapshot_version"] = version
        return out

    async def _flush_soon(self) -> None:
        await asyncio.sleep(GROUP_COMMIT_WINDOW_S)
        with self._lock:
            self._flush_scheduled = False
            try:
                self._flush()
            except Exception:  # logged by _flush; the waiters got the error
                pass

