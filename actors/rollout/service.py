"""The rollout service: one actor owning a serving loop per engine replica of a rollout pool.

Trainers reach it over HTTP (``serve_api/rollouts.py``, ``serve_api/weights.py``: on the admission
API's Serve app, and on the rollout ingress without Serve's proxy) through
:class:`actors.handles.RolloutServiceHandle`. Per replica the actor holds a
:class:`rollmux.rollout_sched.RolloutRequestScheduler` (mixed-request policy: classes, prefix index
with version expiry, two-stage budget, cold start) and runs serving windows
(:func:`actors.rollout.window.run_window`, the function the in-process loop runs too) on the
replica's engine actor (``actors/rollout/replica.py``). Requests go to the replica with the best
prefix match and room in its budget (:func:`rollmux.rollout_sched.routing.route`). A generation
may name the request that follows it (``then``): the service queues it when the sample ends.

Weights (:mod:`actors.rollout.weight_updater`): a checked update becomes the latest complete
version; each replica loads it at a window boundary after its pause mode (``keep`` / ``abort`` /
``wait``); the update answers when every live replica serves it. A replacement replica loads the
latest complete version before it serves anything.

Bounds and faults: at most ``queue_capacity`` requests queued (a submit past it is refused whole);
``max_results`` finished results kept. A replica that dies (or fails a window): its queued
requests are routed to the live replicas, its running critical ones retried once there, its running
non-critical ones fail with ``finish_reason = "replica_lost"`` (none lost silently), and a
replacement starts (at most ``max_replica_restarts``). A stream's requests carry a lease renewed by
each poll; ``disconnect_grace_s`` after the last one (the client went away) they are cancelled.

Source: the rollout service interface and metrics of the mixed-request scheduler (docs/ROLLOUT_SERVICE.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, deque
from typing import Any, Optional

from actors.handles import ActorLost, RolloutReplicaHandle, RolloutServiceHandle, start_actor
from actors.naming import NAMESPACE, control_plane_resources
from actors.rollout.intake import check_request
from actors.rollout.records import MAX_TURNS, ReplicaState, RequestRecord, Session
from actors.rollout.streams import ResultStreams
from actors.rollout.weight_updater import WeightUpdater
from actors.rollout.window import run_window
from rollmux.rollout_sched import RadixPrefixIndex, Request, RequestType, RolloutRequestScheduler, RolloutSchedConfig
from rollmux.rollout_sched.api import (
    Accepted, CancelReply, ChainIn, FieldError, Limits, PolicyView, PollReply, Priority, Refusal,
    RolloutView, ServiceStats, Status, SubmitBatch, SubmitReply, TokenCursor, TokensReply,
)
from rollmux.rollout_sched.config import DEFAULT_CONFIG_PATH, load_rollout_sched_config
from rollmux.rollout_sched.routing import ReplicaLoad, expected_window, route
from rollmux.rollout_sched.service_config import ServiceConfig
from rollmux.rollout_sched.weights import (
    DiskUpdateBody, SyncOffer, UploadStartBody, UploadView, WeightsView, WeightUpdateView,
)

log = logging.getLogger("rollmux.rollout_service")

DEFAULT_SECTION = "cpu_engine"
IDLE_WAIT_S = 0.5  # an idle loop wakes at least this often
DIVERSITY_WINDOW = 256  # dispatched generations the diversity score looks back on
MAX_STEPS_KEPT = 1024  # training steps the idle ratio and step time look back on


def service_name(app_name: str) -> str:
    """Ray name of the rollout service of the Serve app ``app_name``."""
    return f"rollmux-rollouts-{app_name}"


def _priority(req: Request) -> Priority:
    return Priority.CRITICAL if req.critical else Priority.BACKGROUND if req.request_class().value == 2 else Priority.REUSABLE


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
        self.recs: dict[str, RequestRecord] = {}  # live (queued / running / a chained request waiting on its sample)
        self.done: OrderedDict[str, RequestRecord] = OrderedDict()  # ended, bounded by max_results
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.version, self.min_version = 0, 0
        self.streams = ResultStreams(self.recs, self.done, self.sessions, self._now, lambda: self.svc.disconnect_grace_s)
        self._started = False
        self._stopping = False
        self.replicas: list[ReplicaState] = []
        self.counters = {k: 0 for k in ("submitted", "finished", "cancelled", "failed", "refused", "rerouted",
                                        "retried", "lease_cancelled", "samples", "replica_restarts", "chained",
                                        "requeued", "weight_updates", "weight_updates_refused")}
        self._families: deque[str] = deque(maxlen=DIVERSITY_WINDOW)
        self._step_first: OrderedDict[int, float] = OrderedDict()  # policy version -> first critical submit
        self._step_last: dict[int, float] = {}  # -> last critical result
        self._policy_times: deque[float] = deque(maxlen=MAX_STEPS_KEPT)
        self._submit_ms: deque[float] = deque(maxlen=4096)
        self._first_submit: Optional[float] = None
        self._critical_live = 0
        self.updater = WeightUpdater(self.svc, replicas=lambda: self.replicas, advance=self._advance,
                                     requeue=self._requeue_running, now=self._now, counters=self.counters)

    # ------------------------------------------------------------------ life cycle
    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self.replicas = [self._spawn(i) for i in range(self.svc.num_replicas)]
        asyncio.get_running_loop().create_task(self._reaper())

    def _spawn(self, i: int) -> ReplicaState:
        """Engine replica ``i`` (a new actor) and its serving loop."""
        from actors.rollout.replica import EngineReplica

        opts: dict[str, Any] = {"num_cpus": 0, "namespace": NAMESPACE, "lifetime": "detached", "max_restarts": 0}
        if res := control_plane_resources():
            opts["resources"] = res
        rname = f"{self.name}-replica-{i}-{uuid.uuid4().hex[:6]}"  # fresh: never a killed predecessor's handle
        actor = start_actor(EngineReplica, (i, self.cfg.model_dump(mode="json")), name=rname, **opts)
        rep = ReplicaState(i, RolloutReplicaHandle(actor, name=rname), RolloutRequestScheduler(self.cfg, self.svc.policy,
                           log_limit=0), rname, affinity=self._affinity_index())
        rep.sched.set_policy_version(self.version)
        rep.task = asyncio.get_running_loop().create_task(self._loop(rep))
        return rep

    def _affinity_index(self) -> RadixPrefixIndex:
        ic = self.cfg.index
        return RadixPrefixIndex(ttl_versions=1 << 30, max_bytes=ic.max_bytes, node_overhead_bytes=ic.node_overhead_bytes,
                                bytes_per_token=ic.bytes_per_token, evict_low_watermark=ic.evict_low_watermark)

    async def ready(self) -> Limits:
        """Wait until every replica's engine is built (and the engine's tensors are known) -> the limits."""
        self._start()
        await asyncio.gather(*(r.handle.ping(timeout_s=300) for r in self.replicas if r.alive))
        await self.updater.manifest()
        return self.limits_now()

    async def shutdown(self) -> None:
        self._stopping = self.updater.stopping = True
        for r in self.replicas:
            r.wake.set()
            try:
                r.handle.kill()
            except Exception:  # already gone
                pass

    async def replica_names(self) -> list[str]:
        self._start()
        return [r.name for r in self.replicas]

    async def configure(self, change: ServiceConfig) -> ServiceConfig:
        """Change the run-time settings: the fields set in ``change`` replace the current ones -> the new
        settings (``num_replicas`` / ``policy`` only take effect before the first call)."""
        self.svc = ServiceConfig.model_validate({**self.svc.model_dump(), **change.model_dump(include=change.model_fields_set)})
        self.updater.configure(self.svc)
        return self.svc

    def limits_now(self) -> Limits:
        s = self.svc
        return Limits(vocab_size=self.cfg.coldstart.vocab_size, max_tokens_limit=s.max_tokens_limit,
                      context_tokens=min(s.context_tokens, self.cfg.budget.kv_capacity_tokens),
                      max_submit_requests=s.max_submit_requests, max_request_bytes=s.max_request_bytes,
                      queue_capacity=s.queue_capacity, num_replicas=s.num_replicas, policy=s.policy,
                      policy_version=self.version, model_name=s.model_name,
                      weights_chunk_bytes=s.weights_chunk_bytes, max_weights_bytes=s.max_weights_bytes)

    async def limits(self) -> Limits:
        return self.limits_now()

    # ------------------------------------------------------------------ submit
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
            refusal, toks, sess = check_request(i, r, lim, self.sessions, self.version, self.min_version)
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
            version = self.version if r.policy_version is None else r.policy_version
            req = Request(request_id=rid, prompt_token_ids=tuple(full), type=r.task_type, max_tokens=r.max_tokens,
                          arrival_s=now, critical=critical, background=background, policy_version=version,
                          task_family=r.task_family, seed=r.seed, ignore_eos=r.ignore_eos,
                          temperature=r.temperature)
            rec = RequestRecord(rid, req, r, _priority(req), submitted_s=now, stream_tokens=r.stream_tokens)
            if r.open_session:
                rec.session_id = rid
                self.sessions[rid] = sess = Session(None, list(full))
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
            if r.then is not None:
                self._hold_chain(rec, r.then, now)
            if critical and version not in self._step_first:
                self._step_first[version] = now
                while len(self._step_first) > MAX_STEPS_KEPT:
                    self._step_last.pop(self._step_first.popitem(last=False)[0], None)
            short = rep.sched.queue[rid].short
            out.append(Accepted(id=rid, replica=rep.index, queue_position=rep.sched.pending, matched_prefix_tokens=rec.matched,
                                expected_window=expected_window(rep.sched.window, rep.sched.pending,
                                                                rep.sched.profile.max_batch_requests, short=short,
                                                                short_slots_per_window=self.cfg.budget.short_slots_per_window,
                                                                shorts_ahead=len(rep.sched.shorts) - 1),
                                session_id=rec.session_id, chained_id=rec.chained_id, policy_version=version))
        self.counters["submitted"] += len(out)
        if self._first_submit is None:
            self._first_submit = now
        self._submit_ms.append((time.perf_counter() - t0) * 1e3)
        return SubmitReply(requests=out)

    def _hold_chain(self, gen: RequestRecord, c: ChainIn, now: float) -> None:
        """The request that follows ``gen``: live (its id streams and cancels) but queued only when
        ``gen``'s sample ends (:meth:`_release_chain`)."""
        g = gen.req
        prio = c.priority or gen.priority
        placeholder = Request(request_id=f"{gen.id}-then", prompt_token_ids=tuple(c.prefix_ids() or (0,)),
                              type=c.task_type, max_tokens=c.max_tokens, arrival_s=now,
                              critical=prio is Priority.CRITICAL, background=prio is Priority.BACKGROUND,
                              policy_version=g.policy_version, task_family=g.task_family, seed=c.seed)
        rec = RequestRecord(placeholder.request_id, placeholder, c, prio, submitted_s=now, chained_from=gen.id)
        gen.chained_id = rec.id
        self.recs[rec.id] = rec
        if placeholder.critical:
            self._critical_live += 1

    def _release_chain(self, gen: RequestRecord) -> None:
        """``gen`` ended: queue its chained request on its sample (finished), or cancel it (no sample)."""
        rec = self.recs.get(gen.chained_id or "")
        if rec is None or rec.status is not Status.QUEUED or rec.replica is not None:
            return
        if gen.status is not Status.FINISHED:
            self._end(rec, Status.CANCELLED, "cancelled", f"the generation it follows ({gen.id}) ended {gen.status.value}")
            self.counters["cancelled"] += 1
            return
        c: ChainIn = rec.src  # type: ignore[assignment]
        prompt = c.prompt_for(gen.req.prompt_token_ids, gen.out) or [0]
        rec.submitted_s = self._now()  # it enters the queue now: its queueing delay counts from here
        rec.req = rec.req.model_copy(update={"prompt_token_ids": tuple(prompt), "arrival_s": rec.submitted_s})
        if rec.req.critical:
            self._critical_live -= 1  # _enqueue counts it again
        self.recs.pop(rec.id, None)
        try:
            self._enqueue(rec, [r.backlog_kv() for r in self.replicas])
        except LookupError:
            self._end(rec, Status.FAILED, "replica_lost", "no engine replica is alive")
            self.counters["failed"] += 1
            return
        self.counters["chained"] += 1

    def _enqueue(self, rec: RequestRecord, backlog: list[int], sticky: Optional[int] = None,
                 exclude: Optional[int] = None) -> ReplicaState:
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
    def _dispatched(self, batch: list[Request]) -> None:
        now = self._now()
        for r in batch:
            rec = self.recs.get(r.request_id)
            if rec is not None:
                rec.status, rec.dispatched_s = Status.RUNNING, now
                if r.type is RequestType.GENERATION:
                    self._families.append(r.task_family)

    async def _loop(self, rep: ReplicaState) -> None:
        s = rep.sched
        while not self._stopping and rep.alive:
            try:
                load, hold = self.updater.for_window(rep)
                try:
                    out = await run_window(s, rep.handle, self._now(), version=self.version, cache_reset=True,
                                           trainer_waiting=self._critical_live > 0, weights=load,
                                           engine_version=rep.version, hold=hold, on_dispatch=self._dispatched,
                                           logprobs=lambda r: (x := self.recs.get(r.request_id)) is not None
                                           and x.wants_logprobs, now=self._now,
                                           stream=lambda r: (x := self.recs.get(r.request_id)) is not None
                                           and x.stream_tokens)
                except ActorLost as e:
                    self._replica_lost(rep, str(e).splitlines()[0][:200] if str(e) else "died")
                    return
                except Exception as e:  # the engine failed the window: its requests must not hang; replace it
                    log.exception("rollout service: engine replica %d failed a window", rep.index)
                    try:
                        rep.handle.kill()
                    except Exception:  # already gone
                        pass
                    self._replica_lost(rep, f"window failed ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})")
                    return
                if out.idle:
                    rep.wake.clear()
                    try:
                        await asyncio.wait_for(rep.wake.wait(), IDLE_WAIT_S)
                    except asyncio.TimeoutError:
                        pass
                    continue
                reply = out.reply
                rep.version = self.version
                rep.windows += 1
                rep.engine_s += reply.engine_s
                if load is not None:
                    self.updater.on_loaded(rep, reply.weights_version, reply.weights_sha256)
                for rid, toks in reply.partial.items():
                    if (rec := self.recs.get(rid)) is not None and rec.status is Status.RUNNING:
                        rec.partial.extend(toks)
                if reply.partial and not out.completed:
                    self.streams.notify()
                for req, res in out.completed:
                    rec = self.recs.get(res.id)
                    if rec is None:
                        continue
                    rec.out, rec.score, rec.logprobs, rec.finish_reason = (res.output_token_ids, res.score,
                                                                           res.logprobs, res.finish_reason)
                    rec.token_versions, rec.partial = res.token_versions, []
                    if req.type in (RequestType.GENERATION, RequestType.STATE_QUERY):
                        self.counters["samples"] += 1
                    if rec.session_id and (sess := self.sessions.get(rec.session_id)) is not None:
                        sess.tokens = list(req.prompt_token_ids) + list(res.output_token_ids)
                    self._end(rec, Status.FINISHED)
                    self.counters["finished"] += 1
            except Exception:  # a bug must not stop the loop silently
                log.exception("rollout service loop of replica %d", rep.index)
                await asyncio.sleep(0.2)

    def _end(self, rec: RequestRecord, status: Status, reason: Optional[str] = None, error: Optional[str] = None) -> None:
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
        if rec.chained_id is not None:
            self._release_chain(rec)
        self.streams.notify()

    def _replica_lost(self, rep: ReplicaState, why: str) -> None:
        """Re-route the dead replica's queued requests; retry its running critical ones once; start
        a replacement replica (at most ``max_replica_restarts`` in the service's life), which loads
        the latest complete weights version before it serves anything."""
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
        self.updater.on_lost(rep)  # an update waiting on the dead replica looks again

    def _move(self, rec: RequestRecord, dead: int, exclude: Optional[int], backlog: list[int], retry: bool) -> None:
        rec.dispatched_s, rec.partial = None, []
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

    # ------------------------------------------------------------------ reads, streams (actors/rollout/streams.py), cancel
    async def get(self, request_id: str) -> Optional[RolloutView]:
        return self.streams.get(request_id)

    async def wait_result(self, request_id: str, timeout_s: float) -> Optional[RolloutView]:
        return await self.streams.wait_result(request_id, timeout_s)

    async def poll(self, ids: list[str], session_id: Optional[str], wait_s: float) -> PollReply:
        return await self.streams.poll(ids, session_id, wait_s)

    async def tokens(self, cursors: list[TokenCursor], wait_s: float) -> TokensReply:
        return await self.streams.tokens(cursors, wait_s)

    async def detach(self, ids: list[str]) -> None:
        self.streams.detach(ids)

    async def _reaper(self) -> None:
        """Cancel the unfinished requests whose stream lease lapsed (their client went away)."""
        while not self._stopping:
            await asyncio.sleep(min(0.5, max(0.05, self.svc.disconnect_grace_s / 4)))
            if lapsed := self.streams.lapsed():
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
    async def _advance(self, version: int) -> None:
        if version > self.version:
            await self.set_policy(version, None)

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

    # ------------------------------------------------------------------ weights (actors/rollout/weight_updater.py)
    async def start_upload(self, body: UploadStartBody) -> UploadView | Refusal:
        """Announce an upload (``size_bytes``, ``sha256``, ``weight_version``, ``pause_mode``)."""
        self._start()
        return await self.updater.start_upload(body)

    async def put_chunk(self, upload_id: str, index: int, data: bytes) -> UploadView | Refusal:
        return await self.updater.put_chunk(upload_id, index, data)

    async def cancel_upload(self, upload_id: str) -> bool:
        return await self.updater.cancel_upload(upload_id)

    async def commit_upload(self, upload_id: str) -> WeightUpdateView | Refusal:
        """Check the upload and apply it (every replica serves it when this answers)."""
        self._start()
        return await self.updater.commit_upload(upload_id)

    async def update_from_disk(self, body: DiskUpdateBody) -> WeightUpdateView | Refusal:
        self._start()
        return await self.updater.update_from_disk(body)

    async def update_from_sync(self, offer: SyncOffer) -> WeightUpdateView | Refusal:
        self._start()
        return await self.updater.update_from_sync(offer)

    async def weights_view(self) -> WeightsView:
        self._start()
        return await self.updater.view()

    async def replica_digests(self) -> list[Optional[str]]:
        return await self.updater.replica_digests()

    def _requeue_running(self, rep: ReplicaState) -> None:
        """Stop a replica's running requests and queue them again (pause mode ``abort``)."""
        for rid in list(rep.sched.inflight):
            if rep.sched.requeue(rid) and (rec := self.recs.get(rid)) is not None:
                rec.status, rec.dispatched_s, rec.requeued, rec.partial = Status.QUEUED, None, rec.requeued + 1, []
                self.counters["requeued"] += 1

    # ------------------------------------------------------------------ metrics
    async def stats(self) -> ServiceStats:
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
