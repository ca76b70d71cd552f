"""The rollout service's per-request, per-replica and per-session state (written by the service
actor only, :mod:`actors.rollout.service`). No Ray."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Optional

from rollmux.rollout_sched import RadixPrefixIndex, Request, RequestType, RolloutRequestScheduler
from rollmux.rollout_sched.api import ByteTokenizer, ChainIn, Priority, RolloutIn, RolloutView, Status, Timings

MAX_TURNS = 1024  # request ids a session remembers for its stream


@dataclass
class RequestRecord:
    """One request's state and result."""

    id: str
    req: Request
    src: RolloutIn | ChainIn
    priority: Priority
    status: Status = Status.QUEUED
    replica: Optional[int] = None
    session_id: Optional[str] = None
    matched: int = 0
    submitted_s: float = 0.0
    dispatched_s: Optional[float] = None
    finished_s: Optional[float] = None
    out: list[int] = field(default_factory=list)
    partial: list[int] = field(default_factory=list)  # a streamed request's tokens so far, while it runs
    stream_tokens: bool = False  # its tokens are reported as they are produced (OpenAI stream: true)
    token_versions: Optional[list[int]] = None
    score: Optional[float] = None
    logprobs: Optional[list[float]] = None
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    retries: int = 0
    requeued: int = 0
    lease_until: Optional[float] = None  # a stream holds it until then
    chained_id: Optional[str] = None  # the request that follows it (then)
    chained_from: Optional[str] = None  # the generation it follows

    @property
    def wants_logprobs(self) -> bool:
        return bool(getattr(self.src, "logprobs", False))

    def view(self) -> RolloutView:
        t = Timings(submitted_s=round(self.submitted_s, 6), dispatched_s=self.dispatched_s, finished_s=self.finished_s,
                    queue_wait_s=None if self.dispatched_s is None else round(self.dispatched_s - self.submitted_s, 6),
                    run_s=None if self.finished_s is None or self.dispatched_s is None
                    else round(self.finished_s - self.dispatched_s, 6))
        gen = self.req.type in (RequestType.GENERATION, RequestType.STATE_QUERY)
        tv = self.token_versions
        return RolloutView(id=self.id, status=self.status, task_type=self.req.type, priority=self.priority,
                           policy_version=self.req.policy_version, task_family=self.req.task_family,
                           replica=self.replica, session_id=self.session_id, matched_prefix_tokens=self.matched,
                           output_token_ids=list(self.out),
                           text=ByteTokenizer.decode(self.out) if gen and self.status is Status.FINISHED else None,
                           logprobs=self.logprobs, token_versions=list(tv) if tv is not None else None,
                           version_span=[min(tv), max(tv)] if tv else None, score=self.score,
                           finish_reason=self.finish_reason, error=self.error, retries=self.retries,
                           requeued=self.requeued, chained_id=self.chained_id, chained_from=self.chained_from, timings=t)


@dataclass
class ReplicaState:
    """One engine replica as its serving loop sees it."""

    index: int
    handle: Any  # actors.handles.RolloutReplicaHandle
    sched: RolloutRequestScheduler
    name: str
    alive: bool = True
    version: int = 0  # the policy version its engine holds
    weights_version: Optional[int] = None  # the weights version it serves (None: its initial weights)
    weights_sha256: Optional[str] = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    windows: int = 0
    engine_s: float = 0.0
    task: Optional[asyncio.Task] = None
    #: prompts routed here (queued ones included): routing affinity before the engine holds their KV
    affinity: Optional[RadixPrefixIndex] = None

    def backlog_kv(self) -> int:
        es = self.sched.engine_state()
        return sum(e.req.kv_tokens for e in self.sched.queue.values()) + es.kv_long_in_use_tokens + es.kv_short_in_use_tokens


@dataclass
class Session:
    replica: Optional[int]
    tokens: list[int]
    turns: list[str] = field(default_factory=list)  # request ids, oldest first (at most MAX_TURNS kept)


__all__ = ["MAX_TURNS", "ReplicaState", "RequestRecord", "Session"]
