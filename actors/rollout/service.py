"""The rollout service: one actor owning a serving loop per engine replica of a rollout pool.

Trainers reach it over HTTP (``serve_api/rollouts.py``, on the admission API's Serve app and
port); the HTTP face calls it through :class:`actors.handles.RolloutServiceHandle`. Per replica
the actor holds a :class:`rollmux.rollout_sched.RolloutRequestScheduler` (the mixed-request
policy: classes, prefix index with version expiry, two-stage budget, cold start) and runs its
loop as an asyncio task: choose the window's batch (stage 1 budget + stage 2 ordering), send it
with the aborts and the current policy version to the replica's engine actor
(``actors/rollout/replica.py``, one call per window), record what finished. Weight updates are
applied between windows. Requests are routed to the replica with the best prefix match and room in
its budget (:func:`rollmux.rollout_sched.routing.route`).

Bounds and faults:

- at most ``queue_capacity`` requests queued over all replicas: a submit that would pass it is
  refused whole (nothing enqueued); finished results kept: ``max_results`` (oldest dropped);
- a replica whose engine dies: its queued requests are routed to the live replicas; its running
  critical requests are retried once there (a second loss fails them, ``replica_lost``); its
  running non-critical requests fail with ``finish_reason = "replica_lost"``; none is lost silently;
  a replacement replica is started in its place (at most ``max_replica_restarts`` times);
- a stream's requests carry a lease renewed by each poll; when it lapses (the client went away)
  the unfinished ones are cancelled, ``disconnect_grace_s`` after the last poll.

Source: the rollout service interface and metrics of the mixed-request scheduler (docs/ROLLOUT_SERVICE.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Optional

from actors.handles import ActorLost, RolloutReplicaHandle, RolloutServiceHandle, start_actor
from actors.naming import NAMESPACE, control_plane_resources
from rollmux.rollout_sched import RadixPrefixIndex, Request, RequestType, RolloutRequestScheduler, RolloutSchedConfig
from rollmux.rollout_sched.api import (
    TERMINAL, Accepted, ByteTokenizer, CancelReply, FieldError, Limits, PolicyView, PollReply, Priority, Refusal,
    RolloutIn, RolloutView, Status, SubmitBatch, SubmitReply, Timings, WindowCall,
)
from rollmux.rollout_sched.config import DEFAULT_CONFIG_PATH, load_rollout_sched_config
from rollmux.rollout_sched.routing import ReplicaLoad, expected_window, route
from rollmux.rollout_sched.service_config import ServiceConfig

log = logging.getLogger("rollmux.rollout_service")

DEFAULT_SECTION = "cpu_engine"
IDLE_WAIT_S = 0.5  # an idle loop wakes at least this often
DIVERSITY_WINDOW = 256  # dispatched generations the diversity score looks back on


def service_name(app_name: str) -> str:
    """Ray name of the rollout service of the Serve app ``app_name``."""
    return f"rollmux-rollouts-{app_name}"


@dataclass
class _Rec:
    """One request's state, written by the service only."""

    id: str
    req: Request
    src: RolloutIn
    priority: Priority
    status: Status = Status.QUEUED
    replica: Optional[int] = None
    session_id: Optional[str] = None
    matched: int = 0
    submitted_s: float = 0.0
    dispatched_s: Optional[float] = None
    finished_s: Optional[float] = None
    out: list[int] = field(default_factory=list)
    score: Optional[float] = None
    logprobs: Optional[list[float]] = None
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    retries: int = 0
    lease_until: Optional[float] = None  # a stream holds it until then

    def view(self) -> RolloutView:
        t = Timings(submitted_s=round(self.submitted_s, 6), dispatched_s=self.dispatched_s, finished_s=self.finished_s,
                    queue_wait_s=None if self.dispatched_s is None else round(self.dispatched_s - self.submitted_s, 6),
                    run_s=None if self.finished_s is None or self.dispatched_s is None
                    else round(self.finished_s - self.dispatched_s, 6))
        gen = self.req.type in (RequestType.GENERATION, RequestType.STATE_QUERY)
        return RolloutView(id=self.id, status=self.status, task_type=self.req.type, priority=self.priority,
                           policy_version=self.req.policy_version, task_family=self.req.task_family,
                           replica=self.replica, session_id=self.session_id, matched_prefix_tokens=self.matched,
                           output_token_ids=list(self.out),
                           text=ByteTokenizer.decode(self.out) if gen and self.status is Status.FINISHED else None,
                           logprobs=self.logprobs, score=self.score, finish_reason=self.finish_reason,
                           error=self.error, retries=self.retries, timings=t)


@dataclass
class _Replica:
    index: int
    handle: RolloutReplicaHandle
    sched: RolloutRequestScheduler
    name: str
    alive: bool = True
    version: int = 0  # the version its engine holds
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
class _Session:
    replica: Optional[int]
    tokens: list[int]
    turns: list[str] = field(default_factory=list)  # request ids, oldest first (at most MAX_TURNS kept)


MAX_TURNS = 1024  # request ids a session remembers for its stream
MAX_STEPS_KEPT = 1024  # training steps the idle ratio and step time look back on


class RolloutService:
    """Actor body (async). Args: ``name`` (its Ray name; replicas are ``<name>-replica-<i>-<suffix>``),
    ``config_path`` / ``section`` of ``configs/rollout_sched.yaml``, ``overrides`` of the
    section's ``service`` settings (validated)."""

    def __init__(self, name: str, config_path: str = str(DEFAULT_CONFIG_PATH), section: str = DEFAULT_SECTION,
                 overrides: Optional[dict] = None):
        cfg = load_rollout_sched_config(config_path, section)
        if overrides:
            cfg = cfg.model_copy(update={"service": ServiceConfig.model_validate({**cfg.service.model_dump(), **overrides})})
        self.cfg: RolloutSchedConfig = cfg
        self.svc: ServiceConfig = cfg.service
        self.name = name
        self._t0 = time.monotonic()
        self.recs: dict[str, _Rec] = {}  # live (queued / running)
        self.done: OrderedDict[str, _Rec] = OrderedDict()  # ended, bounded by max_results
        self.sessions: OrderedDict[str, _Session] = OrderedDict()
        self.version, self.min_version = 0, 0
        self._changed = asyncio.Event()
        self._started = False
        self._stopping = False
        self.replicas: list[_Replica] = []
        self.counters = {k: 0 for k in ("submitted", "finished", "cancelled", "failed", "refused", "rerouted",
                                        "retried", "lease_cancelled", "samples", "replica_restarts")}
        self._families: deque[str] = deque(maxlen=DIVERSITY_WINDOW)
        self._step_first: OrderedDict[int, float] = OrderedDict()  # policy version -> first critical submit
        self._step_last: dict[int, float] = {}  # -> last critical result
        self._policy_times: deque[float] = deque(maxlen=MAX_STEPS_KEPT)
        self._submit_ms: deque[float] = deque(maxlen=4096)
        self._first_submit: Optional[float] = None
        self._critical_live = 0

    # ------------------------------------------------------------------ life cycle
    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self.replicas = [self._spawn(i) for i in range(self.svc.num_replicas)]
        asyncio.get_running_loop().create_task(self._reaper())

    def _spawn(self, i: int) -> _Replica:
        """Engine replica ``i`` (a new actor) and its serving loop."""
        from actors.rollout.replica import EngineReplica

        opts: dict[str, Any] = {"num_cpus": 0, "namespace": NAMESPACE, "lifetime": "detached", "max_restarts": 0}
        if res := control_plane_resources():
            opts["resources"] = res
        rname = f"{self.name}-replica-{i}-{uuid.uuid4().hex[:6]}"  # fresh: never a killed predecessor's handle
        actor = start_actor(EngineReplica, (i, self.cfg.model_dump(mode="json")), name=rname, **opts)
        rep = _Replica(i, RolloutReplicaHandle(actor, name=rname), RolloutRequestScheduler(self.cfg, self.svc.policy,
                       log_limit=0), rname, affinity=self._affinity_index())
        rep.sched.set_policy_version(self.version)
        rep.task = asyncio.get_running_loop().create_task(self._loop(rep))
        return rep

    def _affinity_index(self) -> RadixPrefixIndex:
        ic = self.cfg.index
        return RadixPrefixIndex(ttl_versions=1 << 30, max_bytes=ic.max_bytes, node_overhead_bytes=ic.node_overhead_bytes,
                                bytes_per_token=ic.bytes_per_token, evict_low_watermark=ic.evict_low_watermark)

    async def ready(self) -> dict:
        self._start()
        await asyncio.gather(*(r.handle.ping(timeout_s=300) for r in self.replicas if r.alive))
        return self.limits_now().model_dump()

    async def shutdown(self) -> None:
        self._stopping = True
        for r in self.replicas:
            r.wake.set()
            try:
                r.handle.kill()
            except Exception:  # already gone
                pass

    async def replica_names(self) -> list[str]:
        self._start()
        return [r.name for r in self.replicas]

    async def configure(self, overrides: dict) -> dict:
        """Change the run-time settings (``queue_capacity``, ``disconnect_grace_s``, limits...);
        ``num_replicas`` / ``policy`` only take effect before the first call."""
        self.svc = ServiceConfig.model_validate({**self.svc.model_dump(), **overrides})
        return self.svc.model_dump()

    def limits_now(self) -> Limits:
        s = self.svc
        return Limits(vocab_size=self.cfg.coldstart.vocab_size, max_tokens_limit=s.max_tokens_limit,
                      context_tokens=min(s.context_tokens, self.cfg.budget.kv_capacity_tokens),
                      max_submit_requests=s.max_submit_requests, max_request_bytes=s.max_request_bytes,
                      queue_capacity=s.queue_capacity, num_replicas=s.num_replicas, policy=s.policy)

    async def limits(self) -> Limits:
        return self.limits_now()

    # ------------------------------------------------------------------ submit
    def _check(self, i: int, r: RolloutIn, lim: Limits) -> tuple[Optional[Refusal], list[int], Optional[_Session]]:
        f = f"requests.{i}"
        bad = lambda fld, msg, typ="value_error": (Refusal(  # noqa: E731
            status=422, error="invalid_request", detail=f"{f}.{fld}: {msg}",
            errors=[FieldError(field=f"{f}.{fld}", msg=msg, type=typ)]), [], None)
        toks = r.token_ids()
        if max(toks) >= lim.vocab_size:
            return bad("prompt_token_ids" if r.prompt_token_ids is not None else "prompt",
                       f"token id {max(toks)} is outside the vocabulary [0, {lim.vocab_size})", "vocab_range")
        if r.max_tokens > lim.max_tokens_limit:
            return bad("max_tokens", f"{r.max_tokens} exceeds the engine's limit {lim.max_tokens_limit}", "less_than_equal")
        sess = None
        if r.session_id is not None:
            sess = self.sessions.get(r.session_id)
            if sess is None:
                return bad("session_id", f"unknown session {r.session_id!r} (open one with open_session: true)",
                           "unknown_session")
        ctx = (len(sess.tokens) if sess else 0) + len(toks) + r.max_tokens
        if ctx > lim.context_tokens:
            return bad("max_tokens", f"session history + prompt + max_tokens = {ctx} tokens exceeds the context "
                       f"of {lim.context_tokens} tokens", "context_length")
        if r.policy_version < self.min_version:
            return (Refusal(status=409, error="stale_policy_version",
                            detail=f"{f}.policy_version: {r.policy_version} is older than the service's minimum "
                                   f"{self.min_version} (current policy version {self.version})"), [], None)
        return None, toks, sess

    async def submit(self, batch: SubmitBatch) -> SubmitReply | Refusal:
        """Queue every request of ``batch`` or none: a field error -> 422 naming it, an old policy
        version -> 409, a full queue -> 429 (``retry_after_s``)."""
        t0 = time.perf_counter()
        self._start()
        lim = self.limits_now()
        if len(batch.requests) > lim.max_submit_requests:
            return Refusal(status=422, error="invalid_request", detail=f"requests: at most {lim.max_submit_requests} per submit",
                           errors=[FieldError(field="requests", msg=f"at most {lim.max_submit_requests}", type="too_long")])
        checked = []
        for i, r in enumerate(batch.requests):
            refusal, toks, sess = self._check(i, r, lim)
            if refusal is not None:
                self.counters["refused"] += 1
                return refusal
            checked.append((r, toks, sess))
        queued = sum(r.sched.pending for r in self.replicas)
        if queued + len(checked) > self.svc.queue_capacity:
            self.counters["refused"] += 1
            return Refusal(status=429, error="queue_full", retry_after_s=self.svc.retry_after_s,
                           detail=f"{queued} requests are queued; {len(checked)} more would pass queue_capacity "
                                  f"{self.svc.queue_capacity}")
        if not any(r.alive for r in self.replicas):
            return Refusal(status=503, error="no_replica", detail="no engine replica of the rollout service is alive",
                           retry_after_s=self.svc.retry_after_s)
        now = self._now()
        out = []
        backlog = [r.backlog_kv() for r in self.replicas]
        for r, toks, sess in checked:
            rid = f"r-{uuid.uuid4().hex[:16]}"
            critical, background = r.flags()
            full = (sess.tokens if sess else []) + toks
            req = Request(request_id=rid, prompt_token_ids=tuple(full), type=r.task_type, max_tokens=r.max_tokens,
                          arrival_s=now, critical=critical, background=background, policy_version=r.policy_version,
                          task_family=r.task_family)
            prio = Priority.CRITICAL if critical else Priority.BACKGROUND if req.request_class().value == 2 else Priority.REUSABLE
            rec = _Rec(rid, req, r, prio, submitted_s=now)
            if r.open_session:
                rec.session_id = rid
                self.sessions[rid] = sess = _Session(None, list(full))
                while len(self.sessions) > self.svc.max_sessions:
                    self.sessions.popitem(last=False)
            elif r.session_id is not None:
                rec.session_id = r.session_id
                self.sessions.move_to_end(r.session_id)
            rep = self._enqueue(rec, backlog, sticky=sess.replica if sess else None)
            if sess is not None:
                sess.replica = rep.index
                sess.turns.append(rid)
                del sess.turns[:-MAX_TURNS]
            if critical:
                if r.policy_version not in self._step_first:
                    self._step_first[r.policy_version] = now
                    while len(self._step_first) > MAX_STEPS_KEPT:
                        self._step_last.pop(self._step_first.popitem(last=False)[0], None)
            q = rep.sched.queue[rid]
            short = q.short
            out.append(Accepted(id=rid, replica=rep.index, queue_position=rep.sched.pending, matched_prefix_tokens=rec.matched,
                                expected_window=expected_window(rep.sched.window, rep.sched.pending,
                                                                rep.sched.profile.max_batch_requests, short=short,
                                                                short_slots_per_window=self.cfg.budget.short_slots_per_window,
                                                                shorts_ahead=len(rep.sched.shorts) - 1),
                                session_id=rec.session_id))
        self.counters["submitted"] += len(out)
        if self._first_submit is None:
            self._first_submit = now
        self._submit_ms.append((time.perf_counter() - t0) * 1e3)
        return SubmitReply(requests=out)

    def _enqueue(self, rec: _Rec, backlog: list[int], sticky: Optional[int] = None,
                 exclude: Optional[int] = None) -> _Replica:
        """Route ``rec`` (prefix-aware; ``backlog``: KV tokens queued and running per replica,
        updated here) and queue it there. Raises LookupError without a live replica."""
        req = rec.req
        p = req.prompt_token_ids
        held = [min(r.sched.index.match(p, touch=False), len(p) - 1) for r in self.replicas]
        loads = [ReplicaLoad(r.index, r.alive and r.index != exclude, max(held[r.index], r.affinity.match(p)),
                             backlog[r.index], self.cfg.budget.kv_capacity_tokens) for r in self.replicas]
        i = route(req.kv_tokens, loads, sticky=sticky)
        if i is None:
            raise LookupError("no engine replica is alive")
        backlog[i] += req.kv_tokens
        rep = self.replicas[i]
        rep.affinity.insert(p)
        rec.replica, rec.matched, rec.status = i, held[i], Status.QUEUED
        rep.sched.submit(req)
        self.recs[rec.id] = rec
        if req.critical:
            self._critical_live += 1
        rep.wake.set()
        return rep

    # ------------------------------------------------------------------ the serving loop of one replica
    async def _loop(self, rep: _Replica) -> None:
        s = rep.sched
        while not self._stopping and rep.alive:
            try:
                if s.policy_version != self.version:
                    s.set_policy_version(self.version)  # expiry at once is done by set_policy; this catches up
                s.set_trainer_waiting(self._critical_live > 0)
                now = self._now()
                batch = s.next_batch(now) if s.pending else []
                aborts = s.take_aborts()
                if not batch and not aborts and s.running == 0 and rep.version == self.version:
                    rep.wake.clear()
                    try:
                        await asyncio.wait_for(rep.wake.wait(), IDLE_WAIT_S)
                    except asyncio.TimeoutError:
                        pass
                    continue
                for r in batch:
                    rec = self.recs.get(r.request_id)
                    if rec is not None:
                        rec.status, rec.dispatched_s = Status.RUNNING, now
                        if r.type is RequestType.GENERATION:
                            self._families.append(r.task_family)
                call = WindowCall(policy_version=self.version, aborts=aborts, batch=batch,
                                  hits={r.request_id: s.hit_of(r.request_id) for r in batch},
                                  logprobs=[r.request_id for r in batch if (x := self.recs.get(r.request_id)) and x.src.logprobs])
                try:
                    reply = await rep.handle.window(call)
                except ActorLost as e:
                    self._replica_lost(rep, str(e).splitlines()[0][:200] if str(e) else "died")
                    return
                rep.version = call.policy_version
                rep.windows += 1
                rep.engine_s += reply.engine_s
                now = self._now()
                for res in reply.results:
                    if res.id not in s.inflight:
                        continue  # aborted meanwhile
                    s.on_complete(res.id, tuple(res.output_token_ids), now)
                    rec = self.recs.get(res.id)
                    if rec is not None:
                        rec.out, rec.score, rec.logprobs, rec.finish_reason = (res.output_token_ids, res.score,
                                                                               res.logprobs, res.finish_reason)
                        if rec.req.type in (RequestType.GENERATION, RequestType.STATE_QUERY):
                            self.counters["samples"] += 1
                        if rec.session_id and (sess := self.sessions.get(rec.session_id)) is not None:
                            sess.tokens = list(rec.req.prompt_token_ids) + list(res.output_token_ids)
                        self._end(rec, Status.FINISHED)
                        self.counters["finished"] += 1
            except Exception:  # a bug must not stop the loop silently
                log.exception("rollout service loop of replica %d", rep.index)
                await asyncio.sleep(0.2)

    def _end(self, rec: _Rec, status: Status, reason: Optional[str] = None, error: Optional[str] = None) -> None:
        rec.status, rec.finished_s = status, self._now()
        if reason:
            rec.finish_reason = reason
        if error:
            rec.error = error
        if self.recs.pop(rec.id, None) is not None and rec.req.critical:
            self._critical_live -= 1
            if rec.req.policy_version in self._step_first:
                self._step_last[rec.req.policy_version] = rec.finished_s
        self.done[rec.id] = rec
        while len(self.done) > self.svc.max_results:
            self.done.popitem(last=False)
        self._changed.set()
        self._changed = asyncio.Event()

    def _replica_lost(self, rep: _Replica, why: str) -> None:
        """Re-route the dead replica's queued requests; retry its running critical ones once; start
        a replacement replica (at most ``max_replica_restarts`` in the service's life)."""
        rep.alive = False
        log.warning("rollout service: engine replica %d lost (%s)", rep.index, why)
        s = rep.sched
        queued = [self.recs[rid] for rid in list(s.queue) if rid in self.recs]
        running = [self.recs[rid] for rid in list(s.inflight) if rid in self.recs]
        for rec in queued + running:
            self.recs.pop(rec.id, None)
            if rec.req.critical:
                self._critical_live -= 1
        for sess in self.sessions.values():
            if sess.replica == rep.index:
                sess.replica = None
        rep.sched = RolloutRequestScheduler(self.cfg, self.svc.policy, log_limit=0)
        rep.affinity.clear()
        if self.counters["replica_restarts"] < self.svc.max_replica_restarts and not self._stopping:
            self.replicas[rep.index] = self._spawn(rep.index)  # the replacement; the dead one's work goes elsewhere first
            self.counters["replica_restarts"] += 1
        others = any(r.alive and r.index != rep.index for r in self.replicas)
        exclude = rep.index if others else None
        backlog = [r.backlog_kv() for r in self.replicas]
        for rec in queued:
            self._move(rec, rep.index, exclude, backlog, retry=False)
        for rec in running:
            if rec.req.critical and rec.retries == 0:
                self._move(rec, rep.index, exclude, backlog, retry=True)
            else:
                why_not = "retried once already" if rec.req.critical else "not critical (resubmit it)"
                self._end(rec, Status.FAILED, "replica_lost",
                          f"engine replica {rep.index} died while running it; not retried: {why_not}")
                self.counters["failed"] += 1

    def _move(self, rec: _Rec, dead: int, exclude: Optional[int], backlog: list[int], retry: bool) -> None:
        rec.dispatched_s = None
        try:
            self._enqueue(rec, backlog, exclude=exclude)
        except LookupError:
            self._end(rec, Status.FAILED, "replica_lost", f"engine replica {dead} died and no other replica is alive")
            self.counters["failed"] += 1
            return
        if retry:
            rec.retries += 1
            self.counters["retried"] += 1
        else:
            self.counters["rerouted"] += 1

    # ------------------------------------------------------------------ reads, streams, cancel
    def _find(self, rid: str) -> Optional[_Rec]:
        return self.recs.get(rid) or self.done.get(rid)

    async def get(self, request_id: str) -> Optional[RolloutView]:
        rec = self._find(request_id)
        if rec is not None and rec.lease_until is not None:
            rec.lease_until = self._now() + self.svc.disconnect_grace_s  # a reader claims it
        return None if rec is None else rec.view()

    async def wait_result(self, request_id: str, timeout_s: float) -> Optional[RolloutView]:
        deadline = self._now() + timeout_s
        while True:
            rec = self._find(request_id)
            if rec is None or rec.status in TERMINAL or self._now() >= deadline:
                return None if rec is None else rec.view()
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.01, deadline - self._now()))
            except asyncio.TimeoutError:
                pass

    async def poll(self, ids: list[str], session_id: Optional[str], wait_s: float) -> PollReply:
        """Ended requests among ``ids`` (plus the live and ended ones of ``session_id``), waiting up
        to ``wait_s`` for one; every live one named gets its stream lease renewed."""
        deadline = self._now() + wait_s
        while True:
            want = list(dict.fromkeys(ids))
            if session_id is not None and (sess := self.sessions.get(session_id)) is not None:
                seen = set(want)
                want += [rid for rid in sess.turns if rid not in seen]
            ended, pending, unknown = [], [], []
            lease = self._now() + self.svc.disconnect_grace_s
            for rid in want:
                rec = self._find(rid)
                if rec is None:
                    unknown.append(rid)
                elif rec.status in TERMINAL:
                    ended.append(rec.view())
                else:
                    rec.lease_until = lease
                    pending.append(rid)
            if ended or not pending or self._now() >= deadline:
                return PollReply(results=ended, pending=pending, unknown=unknown)
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.01, deadline - self._now()))
            except asyncio.TimeoutError:
                pass

    async def detach(self, ids: list[str]) -> None:
        lease = self._now() + self.svc.disconnect_grace_s
        for rid in ids:
            if (rec := self.recs.get(rid)) is not None:
                rec.lease_until = min(rec.lease_until or lease, lease)

    async def _reaper(self) -> None:
        """Cancel the unfinished requests whose stream lease lapsed (their client went away)."""
        while not self._stopping:
            await asyncio.sleep(min(0.5, max(0.05, self.svc.disconnect_grace_s / 4)))
            now = self._now()
            lapsed = [r.id for r in list(self.recs.values()) if r.lease_until is not None and r.lease_until < now]
            if lapsed:
                self._cancel(lapsed, "stream client disconnected")
                self.counters["lease_cancelled"] += len(lapsed)

    def _cancel(self, ids: list[str], why: str = "cancelled by the client") -> CancelReply:
        out = CancelReply()
        for rid in dict.fromkeys(ids):
            rec = self.recs.get(rid)
            if rec is None:
                (out.already_ended if rid in self.done else out.unknown).append(rid)
                continue
            rep = self.replicas[rec.replica] if rec.replica is not None else None
            running = rec.status is Status.RUNNING
            if rep is not None:
                rep.sched.cancel(rid)  # queued: dropped; running: KV freed now, the engine aborts it next window
                rep.wake.set()
            (out.aborted if running else out.dropped).append(rid)
            self._end(rec, Status.CANCELLED, "cancelled", why)
            self.counters["cancelled"] += 1
        return out

    async def cancel(self, ids: list[str]) -> CancelReply:
        return self._cancel(ids)

    # ------------------------------------------------------------------ policy versions
    async def set_policy(self, version: int, min_version: Optional[int]) -> PolicyView | Refusal:
        """The trainer's weights advanced to ``version``: every replica's scheduler drops the prefix
        entries the new weights invalidate now (the engines load the version before their next
        window); requests older than the new minimum are refused from now on. An older version
        than the current minimum -> 409."""
        self._start()
        if version < self.min_version:
            return Refusal(status=409, error="stale_policy_version",
                           detail=f"version: {version} is older than the service's minimum {self.min_version} "
                                  f"(current policy version {self.version})")
        prev = self.version
        dropped = 0
        if version != prev:
            for r in self.replicas:
                before = r.sched.index.num_nodes
                r.sched.set_policy_version(version)
                dropped += max(0, before - r.sched.index.num_nodes)
                r.wake.set()
            self._policy_times.append(self._now())
        self.version = version
        self.min_version = max(self.min_version, min_version if min_version is not None
                               else max(0, version - self.svc.max_policy_lag_versions))
        return PolicyView(version=version, min_version=self.min_version, previous_version=prev,
                          prefix_entries_dropped=dropped)

    # ------------------------------------------------------------------ metrics
    async def stats(self) -> dict:
        """The six service metrics and the per-replica scheduler figures (see docs/ROLLOUT_SERVICE.md)."""
        from actors.rollout.metrics import service_stats

        return service_stats(self)


def ensure_rollout_service(name: str, *, config_path: str | None = None, section: str = DEFAULT_SECTION,
                           overrides: Optional[dict] = None, timeout_s: float = 30.0) -> RolloutServiceHandle:
    """The rollout service actor ``name`` (created detached when missing; its replicas start on
    its first call). Needs a connected Ray driver."""
    opts: dict[str, Any] = {"num_cpus": 0, "namespace": NAMESPACE, "lifetime": "detached", "max_concurrency": 10_000}
    if res := control_plane_resources():
        opts["resources"] = res
    actor = start_actor(RolloutService, (name, config_path or str(DEFAULT_CONFIG_PATH), section, overrides),
                        name=name, get_if_exists=True, **opts)
    return RolloutServiceHandle(name, timeout_s=timeout_s, actor=actor)


__all__ = ["RolloutService", "ensure_rollout_service", "service_name"]
