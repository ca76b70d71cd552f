"""The weight-sync protocol of one hosted job on one worker: :class:`SyncSession` (RollMux §5.2).

The training workers run the job's ``sync`` function and send the weights N -> M through the
:mod:`collectives` executor (the §5.2 plan between the job's N training and M rollout workers:
one model copy crosses the pool boundary, the rest is broadcast inside the rollout pool; the
endpoints are opened at the first sync and kept alive in the workers; ``sync_backend="auto"``:
cupy-NCCL where every worker holds its own GPU, else gloo). The rollout workers keep what they
received (:attr:`SyncSession.pending`) until the job's next rollout applies it (RoundRobinQueues
models sync as holding the training nodes only). Each sync is tagged with the policy version it
publishes (its grant); an asynchronous job's rollout applies the version its staleness contract
prescribes (:meth:`SyncSession.take_due`, :mod:`rollmux.staleness`), so an ``exact`` job keeps the
versions published ahead of their rollout (:attr:`SyncSession.held`). The object-store fallback
(``sync_backend="object_store"``, or endpoints that cannot be built) puts the weights in the
leader's object store and every rollout worker pulls them.

Fail fast: when a peer's task dies during a sync (a rollout worker's receive, a training rank's
phase), the leader aborts every endpoint of the job within a fraction of a second
(``SyncAbortedError`` naming the peer; the rollout weights stay the previous sync's) and tells
every worker (:class:`rollmux.messages.SyncSignal`); the endpoints get a new *generation* and are
rebuilt at the next sync (training ranks wait for the generation the leader announces in their
:attr:`rollmux.messages.PhaseCall.sync_gen`).

One session per hosted job and worker holds every fact of the protocol (endpoint, plan,
generation, transport used and why, the fallback, the leader's signals, the weights waiting to be
applied); the worker actor only routes its entry points (``receive_weights``, ``receive_sync``,
``open_sync_endpoint``, ``sync_signal``) here. Peers are reached through
:class:`actors.handles.WorkerHandle` (``workers``: name -> handle, injectable in tests).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from actors.handles import WorkerHandle, gather, watch_failures
from rollmux.messages import EndpointCaps, EndpointOpened, PendingWeights, SyncAck, SyncSignal, SyncSignalKind
from rollmux.staleness import version_for

if TYPE_CHECKING:
    from rollmux.sync_plan import SyncPlan

__all__ = ["SYNC_TIMEOUT_S", "SyncSession", "sync_caps_of"]

SYNC_TIMEOUT_S = 120.0


def sync_caps_of(node: str) -> EndpointCaps:
    """What this process can use for a sync endpoint (:func:`collectives.endpoint_caps`), named by
    ``node``, with the IP its endpoint would bind to."""
    import ray

    from collectives import endpoint_caps

    return EndpointCaps(name=node, ip=ray.util.get_node_ip_address(), **endpoint_caps())


class SyncSession:
    """One job's weight sync on one worker (see the module docstring).

    Args:
        key: the job's hosting key (what its workers host it under).
        pool: ``"rollout"`` | ``"train"``; ``node``: this worker's node id.
        backend: the transport asked for: ``auto`` | ``nccl`` | ``gloo`` | ``object_store``.
        rank / world_size / peers: this worker's place among the job's workers of its pool
            (``peers``: their worker names in rank order, this one included).
        rollout_workers: training side: the job's rollout worker names (the sync targets).
        host: the address the endpoints bind to (None: 127.0.0.1 when every peer is on this
            machine, else this node's IP; env ``ROLLMUX_SYNC_HOST`` overrides).
        workers: worker name -> :class:`WorkerHandle` (default: looked up by name).
        max_staleness / mode: the job's staleness contract (rollout side: :meth:`take_due`).
        keep: rollout side: ``keep(tensors)`` writes received weights durably (None: not durable).
    """

    def __init__(self, key: str, pool: str, node: str, *, backend: str = "auto", rank: int = 0, world_size: int = 1,
                 peers: tuple[str, ...] = (), rollout_workers: tuple[str, ...] = (), host: Optional[str] = None,
                 workers: Optional[Callable[[str], WorkerHandle]] = None,
                 keep: Optional[Callable[[dict], None]] = None, max_staleness: int = 0, mode: str = "exact"):
        self.key, self.pool, self.node = key, pool, node
        self.backend = backend or "auto"  # asked: auto | nccl | gloo | object_store
        self.rank, self.world_size = rank, world_size
        self.peers, self.rollout_workers, self.host = tuple(peers), tuple(rollout_workers), host
        self._workers = workers or (lambda name: WorkerHandle(name=name))
        self._keep = keep
        self.endpoint: Any = None  # collectives endpoint (control plane, alive across phases)
        self.plan: Any = None
        # generation of the job's sync endpoints: the leader counts its (re)builds from the time it
        # started hosting the job, so a leader re-hosted after a lost worker never reuses a number
        # that a surviving rank's old endpoint carries
        self.gen = time.time_ns() // 1_000_000
        self.endpoint_gen = -1  # generation of this worker's endpoint
        self.used: Optional[str] = None  # transport of the current endpoints: nccl | gloo
        self.note: Optional[str] = None  # why that transport (or why the object store)
        self.fallback: Optional[str] = None  # collectives could not be built: object store from now on
        self.signals: dict[int, SyncSignal] = {}  # leader -> rank: gen -> its signal
        self.ready = threading.Event()  # an endpoint was opened or a signal arrived
        self.pending: Optional[PendingWeights] = None  # rollout side: received, applied at the next rollout
        self.last: Optional[PendingWeights] = None  # applied weights, re-fed to a cold-rebuilt rollout engine
        self.max_staleness, self.mode = int(max_staleness), mode
        self.held: dict[int, PendingWeights] = {}  # async rollout side: version -> weights published, not applied yet
        self.applied = 0  # async rollout side: the policy version the rollout state holds
        self.publishing: Optional[int] = None  # training side: the version the running sync publishes
        self._lock = threading.Lock()

    def _receive(self, pw: PendingWeights) -> None:
        """Keep received weights for the job's next rollout (an async job: under their version)."""
        with self._lock:
            self.pending = pw
            if self.max_staleness and pw.version is not None:
                if self.mode != "exact":  # bounded: only the newest is ever used (rollmux.staleness.weight_copies)
                    self.held.clear()
                self.held[pw.version] = pw

    def take_due(self, rollout: int, cold: bool) -> tuple[Optional[dict], Optional[int]]:
        """An asynchronous job's rollout ``rollout``: the weights of the version its mode
        prescribes (:func:`rollmux.staleness.version_for` over the versions published here; None
        when the rollout state holds it already) and that version; the versions no later
        rollout needs are dropped. A synchronous job: :meth:`take_pending` and None.
        Raises :class:`rollmux.staleness.StalenessError` when the version it needs is not here
        (the rollout must not start: it would break the job's bound)."""
        if self.max_staleness == 0:
            return self.take_pending(cold), None
        with self._lock:
            v = version_for(rollout, self.max_staleness, self.mode, max([self.applied, *self.held]))
            pw = self.held.get(v) if v != self.applied else (
                self.pending if self.pending is not None and self.pending.version == v else None)  # a cold refeed
            for old in [x for x in self.held if x <= v]:
                del self.held[old]
            if self.pending is not None and (self.pending.version is None or self.pending.version <= v):
                self.pending = None
            self.applied = v
        if pw is None:
            return None, v
        if cold:
            self.last = pw
        if pw.tensors is not None:
            return pw.tensors, v
        import ray

        return ray.get(pw.refs[0]), v

    def adopt(self, pending: Optional[PendingWeights], held: tuple = (), applied: Optional[int] = None) -> None:
        """A moved job's weights (:class:`rollmux.messages.MovedState`): the pending ones, an async
        job's held versions and the version its rollout state holds."""
        self.pending = pending
        self.held = {pw.version: pw for pw in held if pw.version is not None}
        if applied is not None:
            self.applied = int(applied)

    # ---- the rollout side: weights waiting for the job's next rollout
    def take_pending(self, cold: bool) -> Optional[dict]:
        """The weights to apply at this rollout (pulled from the object store when needed), or
        None; they are then no longer pending (``cold``: kept to re-feed a rebuilt engine)."""
        pw = self.pending
        if pw is None:
            return None
        if pw.tensors is not None:
            weights = pw.tensors
        else:
            import ray

            weights = ray.get(pw.refs[0])
        self.pending = None
        if cold:  # re-applied to a rollout engine rebuilt by the next cold start
            self.last = pw
        return weights

    def refeed(self) -> None:
        """A cold start rebuilt the rollout engine: the last applied weights are applied again."""
        if self.pending is None and self.last is not None:
            self.pending = self.last

    def receive_object_store(self, refs: list, version: Optional[int] = None) -> SyncAck:
        """Object-store sync, receive side: pull the weights object to this node."""
        import ray

        t0 = time.perf_counter()
        ray.wait(list(refs), fetch_local=True, timeout=600)
        if self._keep is not None:
            self._keep(ray.get(refs[0]))
        self._receive(PendingWeights(refs=tuple(refs), version=version))
        return SyncAck(node=self.node, fetch_s=time.perf_counter() - t0, backend="object_store")

    def receive_collective(self, version: Optional[int] = None) -> SyncAck:
        """Collectives sync, receive side (atomic: all tensors or none)."""
        import torch

        ep = self.endpoint
        if ep is None or self.plan is None:
            raise RuntimeError(f"job {self.key!r}: no sync endpoint on {self.node} (worker restarted?)")
        t0 = time.perf_counter()
        template = {m.name: torch.empty(m.shape, dtype=getattr(torch, m.dtype)) for m in self.plan.tensors}
        tensors = ep.receive(template)
        self._receive(PendingWeights(tensors=tensors, version=version))
        if self._keep is not None:
            self._keep(tensors)
        st = ep.last_stats
        return SyncAck(node=self.node, fetch_s=time.perf_counter() - t0, backend=ep.backend,
                       cross_recv_bytes=getattr(st, "cross_recv_bytes", None),
                       intra_recv_bytes=getattr(st, "intra_recv_bytes", None))

    # ---- every peer: endpoints and the leader's signals
    def open_endpoint(self, plan: SyncPlan, addr: str, index: int, host: str, backend: str = "gloo",
                      gen: int = 0) -> EndpointOpened:
        """Join the job's collectives group as this pool's worker ``index`` over ``backend``
        (``"gloo"``, or ``"nccl"`` on this worker's CUDA device), endpoint generation ``gen``; kept
        for the job's life (until the leader rebuilds the endpoints). Raises what
        :func:`collectives.open_endpoint` raises (SyncError when NCCL cannot run here)."""
        from collectives import open_endpoint

        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        self.plan = plan
        kw: dict = {}
        if backend == "nccl":
            import torch

            kw["device"] = torch.cuda.current_device()  # the GPU Ray gave this worker
        self.endpoint = open_endpoint(plan, self.pool, index, backend=backend, addr=addr, job_id=self.key,
                                      bind_host=host, timeout_s=SYNC_TIMEOUT_S, **kw)
        self.endpoint_gen, self.used = gen, backend
        self.ready.set()
        return EndpointOpened(self.node, index, backend)

    def signal(self, sig: SyncSignal) -> None:
        """The leader's word about generation ``sig.gen``: abort (an endpoint of that generation
        aborts now) or object store (from now on, as the leader)."""
        self.signals[sig.gen] = sig
        if sig.kind == SyncSignalKind.OBJECT_STORE:  # the leader stays on the object store for the job's life
            self.fallback = sig.why
        for g in [g for g in self.signals if g < sig.gen - 2]:
            self.signals.pop(g, None)
        ep = self.endpoint
        if sig.kind == SyncSignalKind.ABORT and ep is not None and self.endpoint_gen <= sig.gen:
            ep.abort(sig.why)
        self.ready.set()

    def close(self) -> None:
        if self.endpoint is not None:
            try:
                self.endpoint.close()
            except Exception:
                pass
        self.endpoint = None
        self.pending = self.last = None
        self.held = {}

    # ---- the training side
    def next_gen(self) -> int:
        """The endpoint generation the next sync uses: the current one while the endpoints are
        healthy, a new one when the leader is about to (re)build them."""
        ep = self.endpoint
        healthy = ep is not None and not ep.broken and self.endpoint_gen == self.gen
        return self.gen if healthy else self.gen + 1

    def run(self, fn: Callable[[dict], dict], state: dict, follower: bool = False, gen: Optional[int] = None,
            watch: Optional[dict] = None, version: Optional[int] = None) -> dict:
        """Sync send side. Every training rank runs the job's ``sync`` function ``fn(state)``; with
        a collectives transport each rank sends its shard of the N->M plan (N = the job's training
        workers, M = its rollout workers; RollMux §5.2), so one model copy crosses the boundary in
        all; ``cross_bytes`` is what this rank's executor sent (the leader adds the ranks up). The
        object store (asked, or ``"auto"`` when the collectives endpoints could not be built:
        ``note`` says why) puts the leader's weights once and every rollout worker pulls them.
        ``gen``: the endpoint generation (the leader's :meth:`next_gen`; a follower gets it in its
        phase call). ``watch``: the follower ranks' phase calls -> worker names (the leader aborts
        when one fails). ``version``: the policy version this sync publishes (its grant's; the
        receivers keep the weights under it). Returns ``{backend, cross_bytes, note, sync_s, receivers}``."""
        if gen is None:
            gen = self.gen if follower else self.next_gen()
        self.publishing = version
        try:
            weights = fn(state)
        except BaseException as e:
            if not follower and self.world_size > 1:  # ranks waiting for this sync's endpoints give up
                self._abort(gen, f"training rank 0 ({self.node}): sync function raised {type(e).__name__}: {e}",
                            rollout=False)
            raise
        t0 = time.perf_counter()
        if self.backend == "counted":
            return dict(self._sync_counted(weights, follower), sync_s=time.perf_counter() - t0)
        if self.backend != "object_store" and self.fallback is None:
            out = self._send_follower(weights, gen) if follower else self._sync_collective(weights, gen, watch or {})
            if out is not None:
                return dict(out, sync_s=time.perf_counter() - t0)
        if follower:
            return {"cross_bytes": 0, "backend": "object_store"}
        out = self._sync_object_store(weights)
        return dict(out, note=self.fallback or "object_store asked for", sync_s=time.perf_counter() - t0)

    def _sync_counted(self, weights: dict, follower: bool) -> dict:
        """The ``"counted"`` transport (emulated accelerators, :mod:`actors.worker.emulated`): the same
        §5.2 plan as a collectives sync (:func:`rollmux.sync_plan.build_plan` over the job's N
        training ranks and M rollout workers, from the weights' metadata), with every byte
        counted and none moved. Each rank counts the shards it would send across the pool
        boundary (``cross_bytes``; the leader adds the ranks up); the leader hands each rollout
        worker the (metadata-only) weights with the bytes the plan has it receive across the
        boundary and inside its pool (``receive_counted``: a real round trip, durable on the
        rollout side like any sync). The time the bytes would take is the job's own timed wait
        (the emulated sync function's, from :func:`rollmux.profiler.sync_time`)."""
        from rollmux.sync_plan import build_plan, metas_of

        plan = build_plan(metas_of(weights), max(1, self.world_size), max(1, len(self.rollout_workers)), scheme="topo")
        mine = sum(s.nbytes for s in plan.shards_sent_by(self.rank))
        if follower:
            return {"cross_bytes": int(mine), "backend": "counted"}
        cross_in = plan.received_bytes()  # each receiver then gets the other shards from its rollout peers
        sent = PendingWeights(tensors=weights)
        acks = gather([self._workers(w).receive_counted_nowait(self.key, sent, int(cross_in[j]),
                                                                int(plan.model_bytes - cross_in[j]), self.publishing)
                       for j, w in enumerate(self.rollout_workers)], timeout_s=SYNC_TIMEOUT_S)
        return {"receivers": acks, "cross_bytes": int(mine), "backend": "counted",
                "note": f"counted, not moved: plan of {plan.model_bytes} B, {plan.cross_bytes} B across the boundary"}

    def receive_counted(self, weights: PendingWeights, cross_bytes: int, intra_bytes: int,
                        version: Optional[int] = None) -> SyncAck:
        """Counted sync, receive side: keep the (metadata-only) weights for the next rollout (as the
        policy version ``version``); the ack carries the bytes the plan has this worker receive
        (none were moved)."""
        t0 = time.perf_counter()
        self._receive(PendingWeights(tensors=weights.tensors, version=version))
        if self._keep is not None:
            self._keep(weights.tensors)
        return SyncAck(node=self.node, fetch_s=time.perf_counter() - t0, backend="counted",
                       cross_recv_bytes=int(cross_bytes), intra_recv_bytes=int(intra_bytes))

    def _sync_object_store(self, weights: dict) -> dict:
        import ray

        nbytes = sum(int(v.numel() * v.element_size()) for v in weights.values() if hasattr(v, "element_size"))
        ref = ray.put(weights)
        del weights
        acks = gather([self._workers(w).receive_weights_nowait(self.key, [ref], self.publishing) for w in self.rollout_workers],
                      timeout_s=600)
        # object store: every rollout node pulls the whole object across the boundary
        return {"receivers": acks, "cross_bytes": nbytes * len(acks), "backend": "object_store"}

    def _abort(self, gen: int, why: str, rollout: bool = True) -> None:
        """Leader: abort sync generation ``gen`` everywhere: this rank's endpoint (its pending
        waits give up and publish the abort in the job's store), the other ranks (and rollout
        workers) by a signal; the next sync rebuilds the endpoints as generation ``gen + 1``."""
        self.gen = max(self.gen, gen)
        if self.endpoint is not None:
            self.endpoint.abort(why)
        self._signal_ranks(SyncSignal(gen, SyncSignalKind.ABORT, why), rollout=rollout)

    def _signal_ranks(self, sig: SyncSignal, rollout: bool = False) -> None:
        """Tell the job's other training ranks (and its rollout workers) about a sync generation
        (fire and forget: a dead peer is not waited for)."""
        for n in list(self.peers[1:]) + (list(self.rollout_workers) if rollout else []):
            try:
                self._workers(n).sync_signal_nowait(self.key, sig)
            except Exception:  # the peer's actor is gone: nothing to tell
                pass

    def _send_follower(self, weights: dict, gen: int) -> Optional[dict]:
        """A non-leader training rank: wait for the endpoint of generation ``gen`` the leader opens
        here (or its word that the sync goes through the object store / was aborted), then send
        this rank's shard. Returns None for the object store."""
        from rollmux.sync_plan import SyncAbortedError

        t_end = time.monotonic() + SYNC_TIMEOUT_S
        while True:
            sig = self.signals.get(gen)
            if sig is not None and sig.kind == SyncSignalKind.OBJECT_STORE:
                return None
            if sig is not None:
                raise SyncAbortedError(f"job {self.key!r}: sync aborted before {self.node} sent: {sig.why}")
            ep = self.endpoint
            if ep is not None and self.endpoint_gen == gen and not ep.broken:
                break
            if time.monotonic() > t_end:
                raise TimeoutError(f"job {self.key!r}: no sync endpoint opened on {self.node} in {SYNC_TIMEOUT_S:g} s")
            self.ready.wait(0.05)
            self.ready.clear()
        st = ep.send(weights)
        return {"cross_bytes": int(st.cross_sent_bytes), "backend": ep.backend}

    def _build_endpoints(self, weights: dict, gen: int) -> str:
        """Build the job's sync endpoints (generation ``gen``) over the transport :func:`collectives.
        choose_backend` picks for these workers; returns why that transport. Raises when they
        cannot be built (a peer's ``open_sync_endpoint`` failed, or the rendezvous timed out)."""
        from collectives import choose_backend, host_store, open_endpoint
        from rollmux.sync_plan import build_plan, metas_of

        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        receivers = [self._workers(w) for w in self.rollout_workers]
        trainers = [self._workers(w) for w in self.peers[1:]]
        caps = gather([t.sync_caps_nowait() for t in trainers] + [p.sync_caps_nowait() for p in receivers],
                      timeout_s=SYNC_TIMEOUT_S)
        mine = sync_caps_of(self.node)
        backend, why = choose_backend("auto" if self.backend == "auto" else self.backend,
                                      [c.to_dict() for c in (mine, *caps)])
        host = os.environ.get("ROLLMUX_SYNC_HOST") or self.host
        if host is None:
            host = "127.0.0.1" if {c.ip for c in caps} <= {mine.ip} else mine.ip
        plan = build_plan(metas_of(weights), max(1, self.world_size), len(receivers), scheme="topo")
        store, addr = host_store(host, timeout_s=SYNC_TIMEOUT_S)  # hosted before anyone connects
        names = [f"{w} (open_sync_endpoint)" for w in self.rollout_workers + self.peers[1:]]
        opening = [p.open_sync_endpoint_nowait(self.key, plan, addr, j, host, backend, gen) for j, p in enumerate(receivers)]
        opening += [t.open_sync_endpoint_nowait(self.key, plan, addr, i, host, backend, gen)
                    for i, t in enumerate(trainers, 1)]
        box: dict = {}
        done = threading.Event()

        def build() -> None:  # the rendezvous blocks: run it beside a watch on the peers' opening
            try:
                kw = {"device": __import__("torch").cuda.current_device()} if backend == "nccl" else {}
                box["ep"] = open_endpoint(plan, "train", 0, backend=backend, store=store, job_id=self.key,
                                          bind_host=host, timeout_s=SYNC_TIMEOUT_S, **kw)
            except BaseException as e:
                box["error"] = f"{type(e).__name__}: {e}"
            finally:
                done.set()

        failed: list = []
        stop = threading.Event()
        threading.Thread(target=build, name=f"rollmux-sync-build-{self.node}", daemon=True).start()
        watch_failures(dict(zip(opening, names)), stop, lambda why_: (failed.append(why_), done.set()),
                       name=f"rollmux-sync-watch-{self.node}")
        done.wait(SYNC_TIMEOUT_S + 10)
        stop.set()
        if failed or "ep" not in box:
            if box.get("ep") is not None:
                box["ep"].close()
            raise RuntimeError(failed[0] if failed else box.get("error", f"rendezvous timed out after {SYNC_TIMEOUT_S:g} s"))
        try:
            gather(opening, timeout_s=SYNC_TIMEOUT_S)
        except Exception:
            box["ep"].close()
            raise
        self.plan, self.endpoint, self.endpoint_gen, self.gen, self.used = plan, box["ep"], gen, gen, backend
        return why

    def _sync_collective(self, weights: dict, gen: int, watch: dict) -> Optional[dict]:
        """RollMux §5.2 through collectives/, N training ranks -> M rollout workers: the plan and
        endpoints are built at the first sync (and after an aborted one; by the leader, on every
        endpoint) and kept alive in the worker processes; each sync every rank sends its shards
        and the rollout workers receive atomically. Returns None when the collectives cannot be
        built and the backend asked is ``"auto"`` (the caller then uses the object store, for
        this sync and the job's next ones)."""
        from rollmux.sync_plan import SyncAbortedError, SyncPlanError

        note = self.note
        if self.endpoint is None or self.endpoint.broken or self.endpoint_gen != gen:
            try:
                note = self.note = self._build_endpoints(weights, gen)
            except SyncPlanError as e:  # e.g. "nccl" asked where it cannot run: the user's choice, not ours
                self._abort(gen, f"sync endpoints refused: {e}")
                raise
            except Exception as e:
                why = f"collectives sync endpoints could not be built ({str(e)[:400]}); object store used"
                if self.backend != "auto":
                    self._abort(gen, why)
                    raise
                self.fallback, self.gen = why, max(self.gen, gen)
                self._signal_ranks(SyncSignal(gen, SyncSignalKind.OBJECT_STORE, why))
                return None
        ep = self.endpoint
        receiving = [self._workers(w).receive_sync_nowait(self.key, self.publishing) for w in self.rollout_workers]
        failed: list = []
        stop = threading.Event()

        def on_fail(why: str) -> None:
            failed.append(why)
            ep.abort(why)  # this rank's send gives up now and publishes the abort to the others

        watch_failures({**dict(zip(receiving, self.rollout_workers)), **watch}, stop, on_fail,
                       name=f"rollmux-sync-watch-{self.node}")
        try:
            ep.send(weights)
            acks = gather(receiving, timeout_s=SYNC_TIMEOUT_S)
        except Exception as e:
            why = failed[0] if failed else f"{type(e).__name__}: {e}"
            self._abort(gen, why)
            raise SyncAbortedError(f"job {self.key!r}: sync aborted: {why}; rollout weights unchanged, "
                                   f"the sync endpoints are rebuilt at the next sync") from e
        finally:
            stop.set()
        st = ep.last_stats  # what this rank's executor sent across the boundary
        return {"receivers": acks, "cross_bytes": int(getattr(st, "cross_sent_bytes", 0) or 0),
                "backend": self.used, "note": note}
