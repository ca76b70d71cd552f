"""RolloutWorker / TrainWorker: per-node actors hosting the jobs pinned to a node (RollMux §5.1).

One worker actor per RollMux node and pool, named ``rollmux-worker-<node>`` (detached,
get-if-exists), pinned to the node by the custom resource ``rollmux_node:<node>``
(:func:`rollmux.nodes.node_resource`), 0 CPUs (it *is* the node's "device"), computing on one
thread (``torch.set_num_threads(1)`` once a job has loaded torch: the worker itself never imports
it, so that workers hosting only emulated-accelerator jobs stay light, :mod:`actors.worker.emulated`). It hosts every job pinned to its node (one
:class:`_Hosted` each, registered from a :class:`rollmux.messages.JobHosting`):

- between phases a job's phase state (a dict: modules, optimizer, generator, sampler position)
  lives in the Ray object store of this node (``ray.put``), except ``rollmux_resident`` values
  (the control plane: engines, communicators) which stay alive in the process;
- a granted phase (a :class:`rollmux.messages.PhaseCall`) *warm-starts* (``ray.get`` of the
  stored state -> live objects, ``load()`` hooks), runs the user's phase function, *offloads*
  (``offload()`` hooks, ``ray.put``), commits (:mod:`actors.worker.commits`) and releases the permit to
  the grant's GroupController: the leader worker is the grant's releaser
  (:class:`rollmux.messages.Releaser` says why), so the nodes stay held until the phase ended on
  them, even when the driver dies meanwhile;
- a *cold start* rebuilds the state from the builder plus, when one exists, the checkpoint on disk
  (first phase of a job, or every phase with ``switch="cold"``). Both are timed (``switch_s``)
  and reported in the timeline and metrics;
- a *move* (departure re-packing put the job in another group on other nodes): ``export_job`` on
  the old node's worker hands over the stored state (a :class:`rollmux.messages.MovedState`) and
  drops the job; ``register_job(..., moved=...)`` on the new node's worker makes the job's first
  phase there start from it (builder() + ``restore_state``, switch kind ``"moved"``; the copy to
  the new node is part of its ``switch_s``). Resident values stay behind: they are control plane
  and the builder recreates them on the new node.

The weight-sync protocol is one :class:`actors.worker.weight_sync.SyncSession` per hosted job (its
entry points here only route to it); the durable commits are :class:`actors.worker.commits.Commits`.
One hosted job's record (:class:`_Hosted`, :class:`JobNotHosted`) is :mod:`actors.worker.hosted`; the
warm / cold start, offload and recovery of its state is :mod:`actors.worker.state_switch` (a base of
the pool workers); both names are re-exported here. Every call to another actor goes through
:mod:`actors.handles`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Optional

from actors.worker.commits import KEEP_COMMITS, WorkerLost, commit_files  # noqa: F401  (KEEP_COMMITS re-exported)
from actors.handles import ControllerHandle, WorkerHandle, gather, start_actor
from actors.naming import NAMESPACE, worker_name  # noqa: F401  (re-exported)
from actors.worker.hosted import JobNotHosted, _Hosted  # noqa: F401  (re-exported)
from actors.worker.state_switch import StateSwitch, _close_all
from actors.worker.weight_sync import SYNC_TIMEOUT_S, sync_caps_of
from rollmux.messages import (
    EndpointCaps, EndpointOpened, HostedJob, JobHosting, MovedState, PendingWeights, PhaseCall, PhaseOutcome,
    PhaseRecord, RolloutProgress, SyncAck, SyncSignal, WorkerPlace,
)
from rollmux.nodes import node_resource, pool_of
from rollmux.phase_state import (  # noqa: F401  (restore_state re-exported)
    ParallelContext, RuntimeHook, call_phase, parallel_scope, restore_state,
)

if TYPE_CHECKING:
    from rollmux.sync_plan import SyncPlan

_commit_files = commit_files  # the name the tests and tools used before the commits had their own module
PROGRESS_BUCKETS = 20  # progress is forwarded to the controller at most once per 1/20 of the responses


def pin_to_cpus(node: str) -> Optional[list[int]]:
    """Pin this process to ``node``'s CPUs from env ``ROLLMUX_CPU_PIN`` (JSON ``{node: [cpu]}``,
    set by ``start_local_cluster(pin_cpus=True)``); returns the CPUs, or None when unpinned."""
    raw = os.environ.get("ROLLMUX_CPU_PIN")
    if not raw:
        return None
    import json

    cpus = json.loads(raw).get(node)
    if not cpus:
        return None
    os.sched_setaffinity(0, set(int(c) for c in cpus))
    return sorted(os.sched_getaffinity(0))


def torch_one_thread() -> Optional[int]:
    """Set torch to one compute thread if this process has loaded torch (a job's builder or phase
    did); returns the thread count, None when torch is not loaded (it is never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    return 1


class _PoolWorker:
    """Shared logic of the two pool workers (plain class; see :func:`get_or_create_worker`)."""

    pool = "?"

    def __init__(self, node: str):
        self._one_thread = torch_one_thread() is not None  # torch set to 1 thread (once it is loaded)
        self.node = node
        self.cpus = pin_to_cpus(node)
        self.jobs: dict[str, _Hosted] = {}
        self._stores: dict[str, Any] = {}  # job_id -> its rendezvous TCPStore (see reserve_store)
        self._reserved: set[str] = set()  # jobs whose store was reserved and that did not register since
        self._lock = threading.Lock()
        self._controllers: dict[str, ControllerHandle] = {}  # by actor name (each looked up again after it died)
        self._switch = StateSwitch(self.pool, self._parallel)  # warm / cold start, offload, recovery

    def _controller(self, name: str) -> ControllerHandle:
        """The handle of the controller ``name`` (a grant's; cached: looked up by name only the
        first time and after the actor died)."""
        h = self._controllers.get(name)
        if h is None:
            h = self._controllers[name] = ControllerHandle(name=name)
        return h

    # ---- hosting
    def _hosted(self, job_id: str) -> _Hosted:
        h = self.jobs.get(job_id)
        if h is None:
            raise JobNotHosted(f"job {job_id!r} is not hosted on {worker_name(self.node)}")
        return h

    def hosts(self, job_id: str, admission: Optional[str] = None) -> bool:
        """Whether this worker hosts ``job_id`` (of that admission, when given): False after the
        worker restarted (its hosted state is gone)."""
        h = self.jobs.get(job_id)
        return h is not None and (admission is None or h.admission in (None, admission))

    def register_job(self, job_id: str, cfg: JobHosting | dict | bytes, moved: Optional[MovedState] = None,
                     recover: bool = False) -> bool:
        """Host ``job_id`` (a :class:`rollmux.messages.JobHosting`: builder, phase functions,
        switch mode, ...). Idempotent for the same admission; a registration carrying another
        admission token (``cfg.admission``: the job id was admitted again, e.g. after its driver
        was killed) first drops the previous run's state here (stored state, pending weights,
        sync endpoint, cold-start file), so the new run starts fresh.

        ``cfg`` may arrive cloudpickled (bytes): it is then unpickled here under the worker's lock,
        so that several jobs registering at once never import / build user classes concurrently.
        ``moved``: the :meth:`export_job` state of the node the job moved from; the job's first
        phase here then starts from it (builder() + :func:`restore_state`, switch kind
        ``"moved"``) and its pending weights are applied at its next rollout.
        ``recover``: one of the job's workers was lost; whatever this worker still holds of the
        job is dropped (its committed files are kept) and the job's next phase here starts from
        its last commit (switch kind ``"recovered"``).
        """
        with self._lock:
            if isinstance(cfg, bytes):
                from ray import cloudpickle

                cfg = cloudpickle.loads(cfg)
            cfg = JobHosting.of(cfg)
            old = self.jobs.get(job_id)
            if old is not None and recover and old.admission == cfg.admission:
                keep = self._stores.get(job_id) if job_id in self._reserved else None
                self.unregister_job(job_id, keep_files=True)
                if keep is not None:
                    self._stores[job_id] = keep
            elif old is not None:
                if not cfg.admission or old.admission == cfg.admission:
                    return False
                # a previous admission of this id: its state is not this run's (a rendezvous store
                # this run's driver reserved just before registering is kept)
                keep = self._stores.get(job_id) if job_id in self._reserved else None
                self.unregister_job(job_id)
                if keep is not None:
                    self._stores[job_id] = keep
            self._reserved.discard(job_id)
            h = self.jobs[job_id] = _Hosted(job_id, cfg, self.pool, self.node)
            if moved is not None:
                if moved.ref is not None or moved.ckpt is not None:
                    h.moved = moved
                h.sync.adopt(moved.pending_weights, moved.held_weights, moved.policy_version)
            return True

    def reserve_store(self, job_id: str, host: str) -> str:
        """Host the rendezvous store of ``job_id``'s workers of this pool on a port the kernel picks on
        ``host`` (this worker is their rank 0); returns ``"host:port"``. Called by the driver
        before :meth:`register_job`; the store lives until the job is unregistered here."""
        from collectives import host_store

        self._stores[job_id], addr = host_store(host, timeout_s=SYNC_TIMEOUT_S)
        self._reserved.add(job_id)  # reserved for the registration that follows
        return addr

    def _job_store(self, h: _Hosted):
        """The job's rendezvous store for this pool (rank 0: the one :meth:`reserve_store` made;
        others connect to it), prefixed by job and pool; built once, kept for the job's life."""
        from collectives.base import open_job_store

        with h.ctx_lock:
            if h.store is None:
                base = self._stores.get(h.job_id)
                if base is None and h.addr is None:
                    raise RuntimeError(f"job {h.job_id!r}: no rendezvous address for its {self.pool} workers")
                h.store = open_job_store(h.addr, base, prefix=f"rollmux-job/{h.job_id}/{self.pool}/",
                                         timeout_s=SYNC_TIMEOUT_S)
            return h.store

    def _job_group(self, h: _Hosted):
        """The job's gloo process group over its workers of this pool (rank = its index in the
        placement). Built on first use by every rank at the same point of an SPMD step (a
        rendezvous), kept across phases and other jobs' phases (control plane)."""
        from datetime import timedelta

        import torch.distributed as dist

        store = self._job_store(h)
        with h.ctx_lock:
            if h.group is None:
                opts = dist.ProcessGroupGloo._Options()
                opts._timeout = timedelta(seconds=SYNC_TIMEOUT_S)
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=h.host or "127.0.0.1")]
                h.group = dist.ProcessGroupGloo(dist.PrefixStore("group/", store), h.rank, h.world_size, opts)
            return h.group

    def _parallel(self, h: _Hosted) -> ParallelContext:
        """The :class:`ParallelContext` handed to the job's builder and phases on this worker."""
        return ParallelContext(self.pool, h.rank, h.world_size, tuple(h.nodes or [self.node]),
                               group_factory=lambda: self._job_group(h),
                               store_factory=(lambda: self._job_store(h)) if (h.addr or h.job_id in self._stores) else None)

    def export_job(self, job_id: str) -> Optional[MovedState]:
        """Hand a job's stored state over for a move (departure re-packing) and stop hosting it.

        Returns a :class:`rollmux.messages.MovedState` (None if the job is not hosted here):
        ``ref`` is the ObjectRef of the storable state (warm switch), ``ckpt`` the bytes of the
        cold-start checkpoint file (cold switch), ``pending_weights`` the synced weights not yet
        applied (rollout side); ``bytes`` the size of ``ckpt`` (None for a ref). Resident values
        (``rollmux_resident``: engines, communicators, the sync endpoint) stay behind by design:
        they are control plane, rebuilt by the builder on the new node. The job is unregistered
        here (endpoint closed, checkpoint file deleted) after the read.
        """
        with self._lock:
            h = self.jobs.get(job_id)
            if h is None:
                return None
            carried = h.moved  # moved here but never ran: pass the carried state on
            if h.ref is not None:
                ref, ckpt = h.ref, None
            else:
                ref, ckpt = (carried.ref, carried.ckpt) if carried is not None else (None, None)
            if ref is None and ckpt is None and h.ckpt.is_file():
                ckpt = h.ckpt.read_bytes()
            out = MovedState(job_id=job_id, node=self.node, pool=self.pool, ref=ref, ckpt=ckpt,
                             pending_weights=h.sync.pending, bytes=None if ckpt is None else len(ckpt),
                             held_weights=tuple(h.sync.held.values()),
                             policy_version=h.sync.applied if h.sync.max_staleness else None)
        self.unregister_job(job_id, keep_files=True)  # the job's commits (shared path) stay its own
        return out

    def unregister_job(self, job_id: str, admission: Optional[str] = None, keep_files: bool = False) -> bool:
        """Drop a job's state (departure / failure / eviction): its object-store state is freed,
        its pending weights dropped, its sync endpoint closed and its cold-start checkpoint file
        and committed phase states on this node deleted (the commits are kept with
        ``keep_files``: a move or a recovery continues from them). ``admission``: only when the hosted run is that admission (a late release of
        an earlier run never drops a re-admitted one). False if nothing was dropped."""
        h = self.jobs.get(job_id)
        if h is None or (admission is not None and h.admission is not None and h.admission != admission):
            return False
        self.jobs.pop(job_id, None)
        self._stores.pop(job_id, None)
        h.ref = h.moved = None
        h.sync.close()
        _close_all(h.resident.values())  # control plane: engines
        h.resident = {}
        if h.group is not None:
            try:
                h.group.shutdown()
            except Exception:
                pass
        h.group = h.store = None
        h.ckpt.unlink(missing_ok=True)
        if not keep_files:
            h.commits.delete()
        return True

    def hosted(self) -> list[HostedJob]:
        """The jobs hosted here, each by its hosting key (``job_id`` or ``job_id@scheduler``, see
        :func:`actors.naming.hosted_key`): ``job_id``, whether state is stored, resident values,
        switches, pending weights."""
        return [HostedJob(j, h.real_id, h.ref is not None, tuple(sorted(h.resident)), tuple(h.switches),
                          h.sync.pending is not None) for j, h in self.jobs.items()]

    def where(self) -> WorkerPlace:
        """Placement check: this actor's Ray node id, RollMux node id, pool, IP, pid, torch threads
        (1 also while no job has loaded torch here: the count it gets when one does), CPUs."""
        import ray

        torch = sys.modules.get("torch")
        if torch is not None:  # another thread may be importing it (a job's registration): wait for the module
            import torch
        return WorkerPlace(ray_node_id=ray.get_runtime_context().get_node_id(), node=self.node, pool=self.pool,
                           ip=ray.util.get_node_ip_address(), pid=os.getpid(),
                           torch_threads=torch.get_num_threads() if torch is not None else 1,
                           cpus=None if self.cpus is None else tuple(self.cpus),
                           gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()))

    # ---- failures, permits, progress (the warm / cold start and commits: :mod:`actors.worker.state_switch`)
    def _peer_lost(self, h: _Hosted) -> Optional[str]:
        """After a phase failed: the first of the job's other workers (this pool's ranks, and the
        rollout workers a sync sends to) that is unreachable or no longer hosts the job (it
        restarted), as ``"<node>"``; None when all of them still host it."""
        names = [n for n in dict.fromkeys([*h.peers, *h.rollout_workers]) if n != worker_name(self.node)]
        for n in names:
            try:
                if not WorkerHandle(name=n).hosts(h.job_id, h.admission, timeout_s=30):
                    return n
            except Exception:
                return n
        return None

    def _release(self, call: PhaseCall, record: PhaseRecord) -> PhaseRecord:
        """Give the permit back to the grant's controller (this worker is the grant's releaser).
        Returns the record, with ``release_error`` when the release failed (a restarted controller
        that forgot the grant has nothing to release)."""
        g = call.grant
        if g.controller is None:
            return record
        try:
            self._controller(g.controller).release(g, record)
            return record
        except Exception as e:
            return record.replace(release_error=f"{type(e).__name__}: {e}")

    def _emit(self, h: _Hosted, ctrl: Optional[ControllerHandle], event: dict, last: list) -> None:
        for fn in h.hooks:
            try:
                fn(event)
            except Exception:
                pass
        if event.get("event") == "progress" and ctrl is not None:
            bucket = int(PROGRESS_BUCKETS * event["done"] / event["total"])
            if bucket != last[0]:
                last[0] = bucket
                ctrl.progress_nowait(RolloutProgress(h.real_id, int(event["done"]), int(event["total"])))

    # ---- phases
    def run(self, job_id: str, call: PhaseCall, follower: bool = False) -> PhaseOutcome:
        """Run a granted phase (a :class:`rollmux.messages.PhaseCall`): warm/cold start, the user's
        function, offload, commit, release the permit.

        A job on several nodes of the phase's pool runs it as one SPMD step: the driver calls its
        rank-0 worker (the *leader*), which starts the same phase on the other ranks
        (``follower=True``: no permit bookkeeping), runs its own shard, gathers the ranks' results
        in rank order and releases the permit once, after every rank finished (the leader is the
        grant's releaser).

        Returns a :class:`rollmux.messages.PhaseOutcome` (``result``: the rank results in rank
        order when the job has several workers of this pool). Raises the phase's own exception
        (after releasing the permit with ``ok=False``), JobNotHosted for a job not hosted here and
        WorkerLost when a worker of the job was lost (the driver redoes the phase).
        """
        phase = call.phase
        h = self.jobs.get(job_id)
        if h is None:
            raise JobNotHosted(f"job {job_id!r} is not hosted on {worker_name(self.node)}")
        seq = call.pool_seq  # the driver's number of this phase among its pool's phases
        if call.replay:  # the phase was released before a worker was lost: its committed result
            return self._replay(h, job_id, call, follower)
        start = time.time()
        rec = PhaseRecord(node=self.node, nodes=tuple(h.nodes or [self.node]), start=start)
        result = None
        ctrl: Optional[ControllerHandle] = None
        peers: list = []
        if not follower:
            if call.grant.controller is not None:
                ctrl = self._controller(call.grant.controller)
                ctrl.phase_started_nowait(h.real_id, phase)
            if h.world_size > 1:  # SPMD: the other ranks run the same phase now (the permit covers them)
                if phase == "sync":  # the endpoint generation this sync uses (followers wait for it)
                    call = dataclasses.replace(call, sync_gen=h.sync.next_gen())
                peers = [WorkerHandle(name=n).run_follower(job_id, call) for n in h.peers[1:]]
        try:
            state, kind, sw = self._switch.materialise(h, seq)
            if not self._one_thread:  # the first job that loaded torch here (its builder did)
                self._one_thread = torch_one_thread() is not None
            rec = rec.replace(switch=kind, switch_s=sw)
            h.switches.append({"phase": phase, "kind": kind, "seconds": sw})
            t1 = time.perf_counter()
            ctx = self._parallel(h)
            if phase == "sync":
                fn = h.phases.get("sync")
                if fn is None:
                    raise KeyError(f"job {h.job_id!r} has no sync phase")
                with parallel_scope(ctx):
                    result = h.sync.run(fn, state, follower, gen=call.sync_gen,
                                        watch=dict(zip(peers, h.peers[1:])), version=call.grant.version)
                acks = result.get("receivers")
                rec = rec.replace(sync_backend=result.get("backend", h.sync_backend), sync_backend_requested=h.sync_backend,
                                  sync_note=result.get("note"), sync_s=result.get("sync_s"),
                                  sync_receivers=None if acks is None else tuple(_ack(a) for a in acks),
                                  sync_cross_bytes=result.get("cross_bytes"))
                if acks is not None:
                    result = dict(result, receivers=[_ack(a) for a in acks])
            else:
                if h.apply is not None and phase == "rollout":
                    # an async job applies the version its staleness contract prescribes (refused
                    # with StalenessError when it is not here); a synchronous one the newest
                    weights, version = h.sync.take_due(call.iteration, cold=h.switch == "cold")
                    rec = rec.replace(policy_version=call.grant.version if version is None else version)
                    if weights is not None:
                        with parallel_scope(ctx):
                            h.apply(state, weights)
                last = [-1]
                hook = RuntimeHook(h.real_id, phase, call.iteration, lambda e: self._emit(h, ctrl, e, last))
                with parallel_scope(ctx):
                    result = call_phase(h.phases[phase], phase, state, tuple(call.args), dict(call.kwargs), hook)
            rec = rec.replace(run_s=time.perf_counter() - t1)
            offload_s, storable = self._switch.offload(h, state)
            rec = rec.replace(offload_s=offload_s)
            del state
            h.seq = None  # until committed: a redo of this phase starts from the commit before it
            if h.durable and seq is not None:
                rec = rec.replace(commit_s=h.commits.write(seq, phase, storable, h.resident, result, h.admission),
                                  commit=seq)
            del storable
            h.seq = seq
            if peers:
                outs: list[PhaseOutcome] = gather(peers, timeout_s=SYNC_TIMEOUT_S * 10)
                peers = []
                ranks = [_rank_view(rec)] + [_rank_view(o.record) for o in outs]
                rec = rec.replace(ranks=tuple(ranks), nodes=tuple(r["node"] for r in ranks))
                if phase == "sync":
                    cross = [result.get("cross_bytes")] + [o.result.get("cross_bytes") for o in outs]
                    total = sum(int(c or 0) for c in cross)
                    rec = rec.replace(sync_cross_bytes_by_rank=tuple(cross), sync_cross_bytes=total)
                    result = dict(result, cross_bytes=total)
                else:
                    result = [result] + [o.result for o in outs]
            rec = rec.replace(ok=True)
        except BaseException as e:
            rec = rec.replace(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
            lost = None if isinstance(e, WorkerLost) and not e.recoverable else \
                (str(e) if isinstance(e, WorkerLost) else self._peer_lost(h) if h.durable and seq is not None else None)
            if lost is not None:
                # a peer died (or restarted without the job): not the job's fault; the driver
                # re-hosts the job and redoes this phase from its last commit
                rec = rec.replace(lost=True)
                h.seq = None
                if not follower:
                    self._release(call, rec.replace(end=time.time()))
                if not isinstance(e, WorkerLost):
                    raise WorkerLost(f"worker {lost} was lost during {job_id}'s {phase}: {rec.error}") from e
                raise
            if not follower:
                self._release(call, rec.replace(end=time.time()))
            raise
        rec = rec.replace(end=time.time())
        if not follower:
            rec = self._release(call, rec)
        return PhaseOutcome(result=result, record=rec)

    def _replay(self, h: _Hosted, job_id: str, call: PhaseCall, follower: bool) -> PhaseOutcome:
        """The committed result of phase ``call.pool_seq`` (it finished and was released, but the
        driver lost the answer with a worker): nothing runs, no permit is released. The leader
        gathers its ranks' results in rank order, as :meth:`run` does."""
        body = h.commits.load(int(call.pool_seq))
        now = time.time()
        rec = PhaseRecord(node=self.node, nodes=tuple(h.nodes or [self.node]), start=now, end=now, switch="replayed",
                          switch_s=0.0, ok=True, replayed=True, commit=int(call.pool_seq))
        result = body.get("result")
        if not follower and h.world_size > 1:
            outs = gather([WorkerHandle(name=n).run_follower(job_id, call) for n in h.peers[1:]],
                          timeout_s=SYNC_TIMEOUT_S)
            result = result if call.phase == "sync" else [result] + [o.result for o in outs]
        return PhaseOutcome(result=result, record=rec)

    # ---- weight sync entry points (the protocol is the job's SyncSession: :mod:`actors.worker.weight_sync`)
    def open_sync_endpoint(self, job_id: str, plan: SyncPlan, addr: str, index: int, host: str, backend: str = "gloo",
                           gen: int = 0) -> EndpointOpened:
        """Join the job's collectives group as this pool's worker ``index`` (see
        :meth:`actors.worker.weight_sync.SyncSession.open_endpoint`)."""
        return self._hosted(job_id).sync.open_endpoint(plan, addr, index, host, backend, gen)

    def sync_caps(self) -> EndpointCaps:
        """What this worker can use for a sync endpoint (:func:`actors.worker.weight_sync.sync_caps_of`)."""
        return sync_caps_of(self.node)

    def sync_signal(self, job_id: str, signal: SyncSignal) -> bool:
        """The job's sync leader's word about a sync generation (:class:`rollmux.messages.SyncSignal`:
        abort, or go through the object store). False when the job is not hosted here."""
        h = self.jobs.get(job_id)
        if h is None:
            return False
        h.sync.signal(signal)
        return True


def _ack(a: SyncAck | dict) -> dict:
    return a.to_dict() if isinstance(a, SyncAck) else dict(a)


def _rank_view(r: PhaseRecord) -> dict:
    return {"node": r.node, "switch": r.switch, "switch_s": r.switch_s, "run_s": r.run_s, "offload_s": r.offload_s}


class RolloutWorkerImpl(_PoolWorker):
    """Hosts the rollout phases of the jobs pinned to a rollout node."""

    pool = "rollout"

    def receive_weights(self, job_id: str, refs: list, version: Optional[int] = None) -> SyncAck:
        """Object-store sync, receive side: pull the weights object to this node; applied at the
        next rollout (``version``: the policy version they are)."""
        return self._hosted(job_id).sync.receive_object_store(refs, version)

    def receive_sync(self, job_id: str, version: Optional[int] = None) -> SyncAck:
        """Collectives sync, receive side (atomic); applied at the job's next rollout."""
        return self._hosted(job_id).sync.receive_collective(version)

    def receive_counted(self, job_id: str, weights: PendingWeights, cross_bytes: int, intra_bytes: int,
                        version: Optional[int] = None) -> SyncAck:
        """Counted sync (emulated accelerators), receive side: the weights' metadata and the bytes
        the plan has this worker receive; applied at the job's next rollout."""
        return self._hosted(job_id).sync.receive_counted(weights, cross_bytes, intra_bytes, version)


class TrainWorkerImpl(_PoolWorker):
    """Hosts the training and sync (send side) phases of the jobs pinned to a training node."""

    pool = "train"


def worker_num_gpus() -> float:
    """GPUs each worker actor requests: env ``ROLLMUX_WORKER_GPUS`` (a float; e.g. ``0.25`` lets
    four workers share one GPU on a single-GPU test host), else 1 where the Ray cluster has GPUs
    (each worker then gets its own ``CUDA_VISIBLE_DEVICES``) and 0 on CPU clusters.
    Raises ValueError for a malformed or negative value."""
    v = os.environ.get("ROLLMUX_WORKER_GPUS")
    if v is not None:
        g = float(v)
        if g < 0:
            raise ValueError(f"ROLLMUX_WORKER_GPUS must be >= 0, got {v!r}")
        return g
    import ray

    return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0


def get_or_create_worker(node: str):
    """The named, detached worker of ``node`` (RolloutWorker or TrainWorker by the node's pool),
    pinned with ``rollmux_node:<node>``, requesting :func:`worker_num_gpus` GPUs (without a GPU
    request Ray hides no device, so every worker would compute on GPU 0); Ray's actor handle
    (wrap it in :class:`actors.handles.WorkerHandle`). Raises ValueError for a malformed node id."""
    pool = pool_of(node)
    return start_actor(RolloutWorkerImpl if pool == "rollout" else TrainWorkerImpl, (node,), name=worker_name(node),
                       namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
                       num_gpus=worker_num_gpus(), resources={node_resource(node): 1.0}, max_concurrency=8,
                       max_restarts=-1)


def worker_handle(node: str) -> WorkerHandle:
    """The handle of ``node``'s worker (created if absent)."""
    return WorkerHandle.of_node(node, get_or_create_worker(node))


# Public names of the two actor classes (RollMux §5.1 terms).
RolloutWorker = RolloutWorkerImpl
TrainWorker = TrainWorkerImpl
