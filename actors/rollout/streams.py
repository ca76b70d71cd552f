"""Readers of the rollout service's results: reads, long polls, token streams and the stream leases
that cancel the requests of a client gone away. Owned by the service actor
(:mod:`actors.rollout.service`), which delegates its read methods here and calls :meth:`ResultStreams.notify`
whenever a record changed (a request ended, a streamed request produced tokens). It reads the
service's records and writes only their ``lease_until``. No Ray.

Waiting is one event, replaced at every change: a waiter wakes, looks at the records it wants and
waits again (bounded by its deadline), so a long-lived HTTP stream costs the service one pending
await, not a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Optional

from actors.rollout.records import RequestRecord, Session
from rollmux.rollout_sched.api import TERMINAL, PollReply, RolloutView, Status, TokenCursor, TokenDelta, TokensReply


class ResultStreams:
    """Reads and waits on the service's request records.

    Args:
        recs: the live records (queued, running, chained ones waiting on their sample), by id.
        done: the ended records kept for reading, by id.
        sessions: the service's sessions, by id.
        now: the service's clock, s. grace_s: the service's ``disconnect_grace_s`` now.
    """

    def __init__(self, recs: Mapping[str, RequestRecord], done: Mapping[str, RequestRecord],
                 sessions: Mapping[str, Session], now: Callable[[], float], grace_s: Callable[[], float]):
        self._recs, self._done, self._sessions, self._now, self._grace = recs, done, sessions, now, grace_s
        self._changed = asyncio.Event()

    def notify(self) -> None:
        """A record changed: every waiter looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self, deadline: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), max(0.01, deadline - self._now()))
        except asyncio.TimeoutError:
            pass

    def find(self, rid: str) -> Optional[RequestRecord]:
        return self._recs.get(rid) or self._done.get(rid)

    def get(self, request_id: str) -> Optional[RolloutView]:
        """The request's view (None: unknown); a live streamed request's lease is renewed (a reader claims it)."""
        rec = self.find(request_id)
        if rec is not None and rec.lease_until is not None:
            rec.lease_until = self._now() + self._grace()
        return None if rec is None else rec.view()

    async def wait_result(self, request_id: str, timeout_s: float) -> Optional[RolloutView]:
        """The request's view once it ended, or as it is after ``timeout_s``."""
        deadline = self._now() + timeout_s
        while True:
            rec = self.find(request_id)
            if rec is None or rec.status in TERMINAL or self._now() >= deadline:
                return None if rec is None else rec.view()
            await self._wait(deadline)

    async def poll(self, ids: list[str], session_id: Optional[str], wait_s: float) -> PollReply:
        """Ended requests among ``ids`` (plus the live and ended ones of ``session_id``), waiting up
        to ``wait_s`` for one; every live one named gets its stream lease renewed."""
        deadline = self._now() + wait_s
        while True:
            want = list(dict.fromkeys(ids))
            if session_id is not None and (sess := self._sessions.get(session_id)) is not None:
                seen = set(want)
                want += [rid for rid in sess.turns if rid not in seen]
            ended, pending, unknown = [], [], []
            lease = self._now() + self._grace()
            for rid in want:
                rec = self.find(rid)
                if rec is None:
                    unknown.append(rid)
                elif rec.status in TERMINAL:
                    ended.append(rec.view())
                else:
                    rec.lease_until = lease
                    pending.append(rid)
            if ended or not pending or self._now() >= deadline:
                return PollReply(results=ended, pending=pending, unknown=unknown)
            await self._wait(deadline)

    async def tokens(self, cursors: list[TokenCursor], wait_s: float) -> TokensReply:
        """What the requests of ``cursors`` produced past them, waiting up to ``wait_s`` for news:
        new tokens (those submitted with ``stream_tokens`` as the engine produces them, the others
        at their end), a restart (re-queued by a weight update with ``pause_mode: abort``, or a
        lost replica's retry: its tokens start again from 0, the delta's ``offset`` is then 0), or
        the end (the delta carries its view). A live request with a stream lease has it renewed."""
        deadline = self._now() + wait_s
        while True:
            deltas, unknown = [], []
            lease = self._now() + self._grace()
            for c in cursors:
                rec = self.find(c.id)
                if rec is None:
                    unknown.append(c.id)
                    continue
                ended, restarts = rec.status in TERMINAL, rec.requeued + rec.retries
                if not ended and rec.lease_until is not None:
                    rec.lease_until = lease
                offset = c.offset if restarts == c.restarts else 0
                toks = rec.out if rec.status is Status.FINISHED else rec.partial
                if ended or len(toks) > offset or restarts != c.restarts:
                    deltas.append(TokenDelta(id=rec.id, offset=offset, tokens=list(toks[offset:]), restarts=restarts,
                                             view=rec.view() if ended else None))
            if deltas or unknown or self._now() >= deadline:
                return TokensReply(deltas=deltas, unknown=unknown)
            await self._wait(deadline)

    def detach(self, ids: list[str]) -> None:
        """The stream of ``ids`` ended early: their leases lapse after the grace period unless claimed again."""
        lease = self._now() + self._grace()
        for rid in ids:
            if (rec := self._recs.get(rid)) is not None:
                rec.lease_until = min(rec.lease_until or lease, lease)

    def lapsed(self) -> list[str]:
        """Live requests whose stream lease lapsed (their client went away)."""
        now = self._now()
        return [r.id for r in list(self._recs.values()) if r.lease_until is not None and r.lease_until < now]


__all__ = ["ResultStreams"]
