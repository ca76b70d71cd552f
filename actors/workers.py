"""RolloutWorker / TrainWorker: per-node actors hosting the jobs pinned to a node (RollMux §5.1).

One worker actor per RollMux node and pool, named ``rollmux-worker-<node>`` (detached,
get-if-exists), pinned to the node by the custom resource ``rollmux_node:<node>``
(:func:`rollmux.nodes.node_resource`), 0 CPUs (it *is* the node's "device"), computing on one
thread (``torch.set_num_threads(1)``). It hosts every job pinned to its node:

- between phases a job's phase state (a dict: modules, optimizer, generator, sampler position)
  lives in the Ray object store of this node (``ray.put``), except ``rollmux_resident`` values
  (the control plane: engines, communicators) which stay alive in the process;
- a granted phase *warm-starts* (``ray.get`` of the stored state -> live objects, ``load()``
  hooks), runs the user's phase function, *offloads* (``offload()`` hooks, ``ray.put``) and
  releases the permit to the GroupController;
- a *cold start* rebuilds the state from the builder plus, when one exists, the checkpoint on disk
  (first phase of a job, or every phase with ``switch="cold"``). Both are timed (``switch_s``)
  and reported in the timeline and metrics;
- a *move* (departure re-packing put the job in another group on other nodes): ``export_job`` on
  the old node's worker hands over the stored state (ObjectRef, or the cold-start checkpoint's
  bytes) and pending weights and drops the job; ``register_job(..., moved=payload)`` on the new
  node's worker makes the job's first phase there start from it (builder() + ``restore_state``,
  switch kind ``"moved"``; the copy to the new node is part of its ``switch_s``). Resident values
  stay behind: they are control plane and the builder recreates them on the new node.

Weight sync (scheduled mode): the TrainWorkers run the job's ``sync`` function and send the weights
N -> M through the :mod:`collectives` executor (RollMux §5.2 plan; endpoints opened at the first
sync and kept alive in the workers; ``sync_backend="auto"``: cupy-NCCL where every worker holds its
own GPU, else gloo); the rollout side applies them at the start of the job's next rollout
(RoundRobinQueues models sync as holding the training nodes only). The object-store fallback
(``sync_backend="object_store"``, or endpoints that cannot be built) puts the weights in the
leader's object store and every RolloutWorker pulls them (``receive_weights``). A peer whose task
dies during a sync aborts it on every endpoint within about a second (see ``TrainWorkerImpl._sync``).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from actors.naming import NAMESPACE, get_actor, worker_name  # noqa: F401  (re-exported)
from rollmux.nodes import node_resource, pool_of
from rollmux.phase_state import (  # noqa: F401  (restore_state re-exported)
    ParallelContext, RuntimeHook, call_phase, parallel_scope, restore_state, split_state, state_resume, state_suspend,
)

SYNC_TIMEOUT_S = 120.0
KEEP_COMMITS = 3  # committed phase states kept per job, pool and rank (a redo needs the one before the last)


class JobNotHosted(KeyError):
    """The job is not hosted on this worker (never registered here, ended, or the worker
    restarted and lost it: the driver then re-registers the job and redoes the phase)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "job not hosted"


class WorkerLost(RuntimeError):
    """A phase was interrupted because one of the job's workers was lost (died, or restarted
    without the job's state). The driver redoes the phase from the job's last committed state."""
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


def _commit_path(prefix: str, seq: int) -> Path:
    return Path(f"{prefix}.commit{seq}.pt")


def _weights_path(prefix: str) -> Path:
    return Path(f"{prefix}.weights.pt")


def _commit_files(prefix: str) -> list[Path]:
    """The job's commit and weights files (and leftovers of interrupted writes) under ``prefix``."""
    p = Path(prefix)
    if not p.parent.is_dir():
        return []
    return [f for f in p.parent.iterdir() if f.name.startswith(p.name + ".commit") or f.name.startswith(p.name + ".weights")]


def _commit_seq(path: Path) -> Optional[int]:
    """The phase number of a commit file (None for the weights file or a temp file)."""
    tail = path.name.rsplit(".commit", 1)[-1]
    return int(tail[:-3]) if tail.endswith(".pt") and tail[:-3].isdigit() else None


class _Hosted:
    """One job hosted on this worker."""

    def __init__(self, job_id: str, cfg: dict):
        self.job_id = job_id  # the hosting key (:func:`actors.naming.hosted_key`: job id @ scheduler)
        self.real_id: str = cfg.get("job_id") or job_id  # the job id the controller knows
        self.builder: Callable[[], dict] = cfg["builder"]
        self.phases: dict[str, Callable] = cfg.get("phases", {})
        self.apply: Optional[Callable] = cfg.get("apply")
        self.hooks: list[Callable] = cfg.get("hooks", [])
        self.switch: str = cfg.get("switch", "warm")
        self.controller: str = cfg["controller"]
        self.ctrl: Any = None  # cached handle of the controller (looked up again only when it died)
        self.rollout_workers: list[str] = cfg.get("rollout_workers", [])
        self.ckpt: Path = Path(cfg.get("checkpoint_dir") or os.path.join(tempfile.gettempdir(), "rollmux-ckpt")) / \
            (f"{job_id}-{cfg['admission'][:16]}-{cfg['pool']}.pt" if cfg.get("admission") else f"{job_id}-{cfg['pool']}.pt")
        self.admission: Optional[str] = cfg.get("admission")  # the scheduler's token of this admission
        self.ref: Any = None  # ObjectRef of the stored (storable) state
        self.resident: dict = {}
        self.pending_weights: Optional[dict] = None  # {"ref": [ObjectRef]} | {"dict": {name: tensor}}
        self.last_weights: Optional[dict] = None  # applied weights, kept for a cold-rebuilt resident engine
        self.sync_backend: str = cfg.get("sync_backend") or "auto"  # asked: auto | nccl | gloo | object_store
        self.endpoint: Any = None  # collectives endpoint (control plane, alive across phases)
        self.plan: Any = None
        # generation of the job's sync endpoints: the leader counts its (re)builds from the time it
        # started hosting the job, so a leader re-hosted after a lost worker never reuses a number
        # that a surviving rank's old endpoint carries
        self.sync_gen = time.time_ns() // 1_000_000
        self.endpoint_gen = -1  # generation of this worker's endpoint
        self.sync_used: Optional[str] = None  # transport of the current endpoints: nccl | gloo
        self.sync_note: Optional[str] = None  # why that transport (or why the object store)
        self.sync_fallback: Optional[str] = None  # collectives could not be built: object store from now on
        self.sync_signals: dict[int, tuple[str, str]] = {}  # leader -> rank: gen -> ("abort"|"object_store", why)
        self.switches: list[dict] = []
        self.moved: Optional[dict] = None  # state carried over by a move: {"ref"} | {"ckpt": bytes}
        # SPMD place of this worker among the job's workers of its pool (multi-node phases)
        par = cfg.get("parallel") or {}
        self.rank: int = int(par.get("rank", 0))
        self.world_size: int = int(par.get("world_size", 1))
        self.peers: list[str] = list(par.get("peers") or [])  # worker names of the pool, rank order
        self.nodes: list[str] = list(par.get("nodes") or [])
        self.addr: Optional[str] = par.get("addr")  # the job's rendezvous store (hosted by rank 0)
        self.host: Optional[str] = par.get("host")  # address the job's gloo groups bind to
        self.store: Any = None  # job's rendezvous store (PrefixStore), control plane
        self.group: Any = None  # job's gloo process group over its workers of this pool, control plane
        self.ctx_lock = threading.Lock()
        self.endpoint_ready = threading.Event()
        # durable commits (a worker may die): after every phase, the state the phase left (and its
        # result) is written next to the cold-start file; a phase redone after a lost worker starts
        # from the commit before it. ``seq``: how many of the job's phases of this pool the state
        # in memory holds (None: nothing in memory, e.g. just re-registered on a restarted worker)
        self.durable: bool = bool(cfg.get("durable", True))
        self.seq: Optional[int] = None
        self.commit_prefix: str = str(self.ckpt)[: -len(".pt")] + (f"-rank{self.rank}" if self.world_size > 1 else "")
        self.weights_after: Optional[int] = None  # the rollout commit the pending weights follow


class _PoolWorker:
    """Shared logic of the two pool workers (plain class; see :func:`get_or_create_worker`)."""

    pool = "?"

    def __init__(self, node: str):
        import torch

        torch.set_num_threads(1)
        self.node = node
        self.cpus = pin_to_cpus(node)
        self.jobs: dict[str, _Hosted] = {}
        self._stores: dict[str, Any] = {}  # job_id -> its rendezvous TCPStore (see reserve_store)
        self._reserved: set[str] = set()  # jobs whose store was reserved and that did not register since
        self._lock = threading.Lock()

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

    def register_job(self, job_id: str, cfg: dict | bytes, moved: Optional[dict] = None,
                     recover: bool = False) -> bool:
        """Host ``job_id`` (builder, phase functions, switch mode, controller name). Idempotent
        for the same admission; a registration carrying another admission token (``cfg
        ["admission"]``: the job id was admitted again, e.g. after its driver was killed) first
        drops the previous run's state here (stored state, pending weights, sync endpoint,
        cold-start file), so the new run starts fresh.

        ``cfg`` may arrive cloudpickled (bytes): it is then unpickled here under the worker's lock,
        so that several jobs registering at once never import / build user classes concurrently.
        ``moved``: the :meth:`export_job` payload of the node the job moved from; the job's first
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
            old = self.jobs.get(job_id)
            if old is not None and recover and old.admission == cfg.get("admission"):
                keep = self._stores.get(job_id) if job_id in self._reserved else None
                self.unregister_job(job_id, keep_files=True)
                if keep is not None:
                    self._stores[job_id] = keep
            elif old is not None:
                if not cfg.get("admission") or old.admission == cfg.get("admission"):
                    return False
                # a previous admission of this id: its state is not this run's (a rendezvous store
                # this run's driver reserved just before registering is kept)
                keep = self._stores.get(job_id) if job_id in self._reserved else None
                self.unregister_job(job_id)
                if keep is not None:
                    self._stores[job_id] = keep
            self._reserved.discard(job_id)
            h = self.jobs[job_id] = _Hosted(job_id, {**cfg, "pool": self.pool})
            if moved:
                if moved.get("ref") is not None or moved.get("ckpt") is not None:
                    h.moved = {"ref": moved.get("ref"), "ckpt": moved.get("ckpt")}
                h.pending_weights = moved.get("pending_weights")
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

    def export_job(self, job_id: str) -> Optional[dict]:
        """Hand a job's stored state over for a move (departure re-packing) and stop hosting it.

        Returns ``{job_id, node, pool, ref, ckpt, pending_weights, bytes}`` (None if the job is not
        hosted here): ``ref`` is the ObjectRef of the storable state (warm switch), ``ckpt`` the
        bytes of the cold-start checkpoint file (cold switch), ``pending_weights`` the synced
        weights not yet applied (rollout side); ``bytes`` the size of ``ckpt`` (None for a ref).
        Resident values (``rollmux_resident``: engines, communicators, the sync endpoint) stay
        behind by design: they are control plane, rebuilt by the builder on the new node. The
        job is unregistered here (endpoint closed, checkpoint file deleted) after the read.
        """
        with self._lock:
            h = self.jobs.get(job_id)
            if h is None:
                return None
            carried = h.moved or {}  # moved here but never ran: pass the carried state on
            ref, ckpt = (h.ref, None) if h.ref is not None else (carried.get("ref"), carried.get("ckpt"))
            if ref is None and ckpt is None and h.ckpt.is_file():
                ckpt = h.ckpt.read_bytes()
            out = {"job_id": job_id, "node": self.node, "pool": self.pool, "ref": ref, "ckpt": ckpt,
                   "pending_weights": h.pending_weights, "bytes": None if ckpt is None else len(ckpt)}
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
        h.ref = h.pending_weights = h.last_weights = h.moved = None
        for v in [h.endpoint, *h.resident.values()]:  # control plane: communicators, engines
            close = getattr(v, "close", None)
            if v is not None and callable(close):
                try:
                    close()
                except Exception:
                    pass
        h.resident = {}
        if h.group is not None:
            try:
                h.group.shutdown()
            except Exception:
                pass
        h.group = h.store = None
        h.ckpt.unlink(missing_ok=True)
        if not keep_files:
            for f in _commit_files(h.commit_prefix):
                f.unlink(missing_ok=True)
        return True

    def hosted(self) -> dict:
        """Hosted jobs by hosting key (``job_id`` or ``job_id@scheduler``, see
        :func:`actors.naming.hosted_key`): ``job_id``, whether state is stored, resident values,
        switches, pending weights."""
        return {j: {"job_id": h.real_id, "stored": h.ref is not None, "resident": sorted(h.resident),
                    "switches": list(h.switches), "pending_weights": h.pending_weights is not None}
                for j, h in self.jobs.items()}

    def where(self) -> dict:
        """Placement check: this actor's Ray node id, RollMux node id, pool, pid, torch threads."""
        import ray
        import torch

        return {"ray_node_id": ray.get_runtime_context().get_node_id(), "node": self.node, "pool": self.pool,
                "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "torch_threads": torch.get_num_threads(), "cpus": self.cpus}

    # ---- warm / cold start
    def _materialise(self, h: _Hosted, seq: Optional[int] = None) -> tuple[dict, str, float]:
        """The job's live state at the start of its pool's phase number ``seq`` (1-based; None:
        an old driver without numbering). Warm: the stored state; cold: builder + cold-start file;
        moved: builder + the carried state; recovered (the state in memory is not the one this
        phase starts from, e.g. the worker restarted): builder + the commit of phase ``seq - 1``.
        Raises WorkerLost when that commit is missing (the state cannot be recovered)."""
        import ray
        import torch

        t0 = time.perf_counter()
        recovering = (seq is not None and h.moved is None and h.durable and h.seq != seq - 1
                      and (seq > 1 or h.seq is not None))
        if recovering:
            state = self._recover(h, seq)
            kind = "recovered"
        elif h.moved is None and h.ref is not None and h.switch == "warm":
            state, kind = dict(ray.get(h.ref)), "warm"
        else:  # cold start, or the first phase after a move: builder + the saved / carried state
            with parallel_scope(self._parallel(h)):
                state = h.builder()
            if not isinstance(state, dict):
                raise TypeError(f"job {h.job_id}: the {self.pool} state builder must return a dict")
            mv, saved = h.moved, None
            if mv is not None:
                if mv.get("ref") is not None:
                    saved = ray.get(mv["ref"])
                else:
                    import io

                    saved = torch.load(io.BytesIO(mv["ckpt"]), weights_only=False)
            elif h.ckpt.is_file():
                saved = torch.load(h.ckpt, weights_only=False)
            if saved is not None:
                state = restore_state(state, dict(saved))
            kind, h.moved = ("cold" if mv is None else "moved"), None
            if h.resident:
                # a cold start rebuilds the control plane too: a fresh resident value (engine) is
                # used when it can take the old one's state (``state_dict`` -> ``load_state_dict``)
                # or is a rollout engine (re-fed with the last synced weights below); otherwise the
                # old one stays (e.g. a training engine holding optimizer state) and the fresh
                # duplicate is dropped. Replaced / dropped values are closed.
                old, h.resident = h.resident, {}
                for k, v in old.items():
                    fresh = state.get(k)
                    if hasattr(v, "state_dict") and hasattr(fresh, "load_state_dict"):
                        fresh.load_state_dict(v.state_dict())
                        gone = v
                    elif self.pool == "rollout" and fresh is not None:
                        gone = v
                    else:
                        state[k], gone = v, fresh
                    close = getattr(gone, "close", None)
                    if gone is not None and gone is not state.get(k) and callable(close):
                        try:
                            close()
                        except Exception:
                            pass
                del old
                if h.pending_weights is None and h.last_weights is not None:
                    h.pending_weights = h.last_weights
        if kind == "warm":
            state.update(h.resident)
        state_resume(state)
        return state, kind, time.perf_counter() - t0

    def _offload(self, h: _Hosted, state: dict) -> tuple[float, dict]:
        """Suspend and store the state (warm: object store; cold: the cold-start file).
        Returns (seconds, the storable part)."""
        import ray
        import torch

        t0 = time.perf_counter()
        state_suspend(state)
        storable, h.resident = split_state(state)
        if h.switch == "warm":
            h.ref = ray.put(storable)
        else:
            h.ckpt.parent.mkdir(parents=True, exist_ok=True)
            tmp = h.ckpt.with_suffix(".tmp")
            torch.save(storable, tmp)
            os.replace(tmp, h.ckpt)
            h.ref = None
        return time.perf_counter() - t0, storable

    # ---- durable commits (a lost worker's jobs resume from them)
    def _commit(self, h: _Hosted, seq: int, phase: str, storable: dict, result: Any) -> float:
        """Write the state phase ``seq`` left and its result to ``<prefix>.commit<seq>.pt``
        (atomic: temp file + rename), before the permit is released and the result returned, so
        a phase the driver saw finish is always committed. A sync leaves the training state as
        it was: its commit refers to the previous one instead of copying it. Keeps the last
        :data:`KEEP_COMMITS` commits. Returns seconds."""
        import torch
        from ray import cloudpickle

        t0 = time.perf_counter()
        body: dict = {"rollmux_commit": 1, "seq": seq, "phase": phase, "result": result, "admission": h.admission}
        if phase == "sync" and seq > 1 and _commit_path(h.commit_prefix, seq - 1).is_file():
            body["state_of"] = seq - 1
        else:
            body["state"] = storable
            body["resident_state"] = {k: v.state_dict() for k, v in h.resident.items() if hasattr(v, "state_dict")}
            # resident values whose state cannot be written (no state_dict: e.g. a DeepSpeed or vLLM
            # engine): a recovery from this commit would silently restart them, so it refuses
            body["resident_unsaved"] = {k: type(v).__name__ for k, v in h.resident.items()
                                        if not hasattr(v, "state_dict")}
        path = _commit_path(h.commit_prefix, seq)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(body, tmp, pickle_module=cloudpickle)
        os.replace(tmp, path)
        for f in _commit_files(h.commit_prefix):
            k = _commit_seq(f)
            if k is not None and k <= seq - KEEP_COMMITS:
                f.unlink(missing_ok=True)
        return time.perf_counter() - t0

    def _load_commit(self, h: _Hosted, seq: int) -> dict:
        import torch

        path = _commit_path(h.commit_prefix, seq)
        if not path.is_file():
            raise WorkerLost(f"worker on {self.node} was lost and job {h.job_id!r}'s state after its {self.pool} "
                             f"phase {seq} was not committed ({path.name} missing): it cannot be recovered")
        body = torch.load(path, weights_only=False)
        if "state_of" in body:
            body = {**self._load_commit(h, int(body["state_of"])), "result": body.get("result")}
        return body

    def _recover(self, h: _Hosted, seq: int) -> dict:
        """builder() + the commit of phase ``seq - 1`` (nothing committed before phase 1: the
        fresh builder state) and, on the rollout side, the synced weights received after that
        commit (re-applied at this rollout). Returns the live state."""
        import torch

        with parallel_scope(self._parallel(h)):
            state = h.builder()
        if not isinstance(state, dict):
            raise TypeError(f"job {h.job_id}: the {self.pool} state builder must return a dict")
        if seq > 1:
            body = self._load_commit(h, seq - 1)
            unsaved = body.get("resident_unsaved") or {}
            if unsaved:
                raise WorkerLost(f"worker on {self.node} was lost and job {h.real_id!r}'s state cannot be recovered: "
                                 f"its resident {', '.join(f'{k} ({t})' for k, t in sorted(unsaved.items()))} "
                                 "keeps state outside the commits (no state_dict)")
            state = restore_state(state, dict(body["state"]))
            for k, sd in (body.get("resident_state") or {}).items():
                if hasattr(state.get(k), "load_state_dict"):
                    state[k].load_state_dict(sd)
        for v in h.resident.values():  # nothing of the lost run's control plane is reused
            close = getattr(v, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    pass
        h.resident = {}
        wf = _weights_path(h.commit_prefix)
        if self.pool == "rollout" and wf.is_file():
            w = torch.load(wf, weights_only=False)
            if int(w.get("after", -1)) == seq - 1:  # received after that commit: not in it yet
                h.pending_weights, h.weights_after = {"dict": w["weights"]}, seq - 1
        return state

    def _keep_weights(self, h: _Hosted, weights: dict) -> None:
        """Rollout side: write received weights durably (applied at the job's next rollout; a
        recovery re-applies them when the rollout they precede is redone), tagged with the
        rollout commit they follow."""
        import torch

        if not h.durable:
            return
        after = h.seq
        if after is None:  # nothing in memory (recovered, no rollout since): the last commit on disk
            after = max((k for k in map(_commit_seq, _commit_files(h.commit_prefix)) if k is not None), default=0)
        h.weights_after = after
        path = _weights_path(h.commit_prefix)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"after": after, "weights": weights}, tmp)
        os.replace(tmp, path)

    def _peer_lost(self, h: _Hosted) -> Optional[str]:
        """After a phase failed: the first of the job's other workers (this pool's ranks, and the
        rollout workers a sync sends to) that is unreachable or no longer hosts the job (it
        restarted), as ``"<node>"``; None when all of them still host it."""
        import ray

        names = [n for n in dict.fromkeys([*h.peers, *h.rollout_workers]) if n != worker_name(self.node)]
        for n in names:
            try:
                if not ray.get(get_actor(n).hosts.remote(h.job_id, h.admission), timeout=30):
                    return n
            except Exception:
                return n
        return None

    def _controller(self, h: _Hosted, fresh: bool = False):
        """The job's controller handle: cached per hosted job, looked up by name only the first
        time and after the actor died (``fresh``)."""
        if h.ctrl is None or fresh:
            h.ctrl = get_actor(h.controller)
        return h.ctrl

    def _release(self, h: _Hosted, phase: str, record: dict) -> None:
        import ray
        from ray.exceptions import RayActorError

        for attempt in range(2):
            try:
                ray.get(self._controller(h, fresh=attempt > 0).release.remote(h.real_id, phase, record), timeout=120)
                record.pop("release_error", None)
                return
            except (RayActorError, ValueError) as e:  # the controller died: look it up again once
                record["release_error"] = f"{type(e).__name__}: {e}"
            except Exception as e:  # a restarted controller forgot the grant: nothing to release
                record["release_error"] = f"{type(e).__name__}: {e}"
                return

    def _emit(self, h: _Hosted, ctrl, event: dict, last: list) -> None:
        for fn in h.hooks:
            try:
                fn(event)
            except Exception:
                pass
        if event.get("event") == "progress" and ctrl is not None:
            bucket = int(PROGRESS_BUCKETS * event["done"] / event["total"])
            if bucket != last[0]:
                last[0] = bucket
                ctrl.progress.remote(h.real_id, event["done"], event["total"])

    # ---- phases
    def run(self, job_id: str, phase: str, args: tuple, kwargs: dict, grant: dict, follower: bool = False) -> dict:
        """Run a granted phase: warm/cold start, the user's function, offload, release the permit.

        A job on several nodes of the phase's pool runs it as one SPMD step: the driver calls its
        rank-0 worker (the *leader*), which starts the same phase on the other ranks
        (``follower=True``: no permit bookkeeping), runs its own shard, gathers the ranks' results
        in rank order and releases the permit once, after every rank finished.

        Returns ``{"result": ..., "record": timeline record}`` (``result``: the rank results in
        rank order when the job has several workers of this pool). Raises the phase's own exception
        (after releasing the permit with ``ok=False``) and KeyError for a job not hosted here.
        """
        import ray

        h = self.jobs.get(job_id)
        if h is None:
            raise JobNotHosted(f"job {job_id!r} is not hosted on {worker_name(self.node)}")
        seq = grant.get("pool_seq")  # the driver's number of this phase among its pool's phases
        if grant.get("replay"):  # the phase was released before a worker was lost: its committed result
            return self._replay(h, job_id, phase, args, kwargs, grant, follower)
        rec: dict = {"node": self.node, "nodes": list(h.nodes or [self.node]), "iteration": grant.get("iteration"),
                     "start": time.time(), "switch": None, "switch_s": None, "ok": False, "error": None}
        result = None
        ctrl = None
        peers: list = []
        if not follower:
            try:
                ctrl = self._controller(h)
                ctrl.phase_started.remote(h.real_id, phase)
            except Exception:  # the controller died: look it up again (it restarts with max_restarts=-1)
                ctrl = self._controller(h, fresh=True)
                ctrl.phase_started.remote(h.real_id, phase)
            if h.world_size > 1:  # SPMD: the other ranks run the same phase now (the permit covers them)
                if phase == "sync":  # the endpoint generation this sync uses (followers wait for it)
                    grant = dict(grant, sync_gen=self._next_sync_gen(h))
                peers = [get_actor(n).run.remote(job_id, phase, args, kwargs, grant, True) for n in h.peers[1:]]
        try:
            state, kind, sw = self._materialise(h, seq)
            rec.update(switch=kind, switch_s=sw)
            h.switches.append({"phase": phase, "kind": kind, "seconds": sw})
            t1 = time.perf_counter()
            ctx = self._parallel(h)
            if phase == "sync":
                with parallel_scope(ctx):
                    result = self._sync(h, state, follower, grant=grant, watch=dict(zip(peers, h.peers[1:])))
                rec["sync_backend"] = result.get("backend", h.sync_backend)
                rec["sync_backend_requested"] = h.sync_backend
                rec["sync_note"] = result.get("note")
                rec["sync_s"] = result.get("sync_s")
                rec["sync_receivers"] = result.get("receivers")
                rec["sync_cross_bytes"] = result.get("cross_bytes")
            else:
                if h.pending_weights is not None and h.apply is not None:
                    pw = h.pending_weights
                    with parallel_scope(ctx):
                        h.apply(state, pw["dict"] if "dict" in pw else ray.get(pw["ref"][0]))
                    h.pending_weights = None
                    if h.switch == "cold":  # re-applied to a rollout engine rebuilt by the next cold start
                        h.last_weights = pw
                last = [-1]
                hook = RuntimeHook(h.real_id, phase, grant.get("iteration", 0), lambda e: self._emit(h, ctrl, e, last))
                with parallel_scope(ctx):
                    result = call_phase(h.phases[phase], phase, state, tuple(args), dict(kwargs), hook)
            rec["run_s"] = time.perf_counter() - t1
            rec["offload_s"], storable = self._offload(h, state)
            del state
            h.seq = None  # until committed: a redo of this phase starts from the commit before it
            if h.durable and seq is not None:
                rec["commit_s"] = self._commit(h, seq, phase, storable, result)
            del storable
            h.seq = seq
            if peers:
                outs = ray.get(peers, timeout=SYNC_TIMEOUT_S * 10)
                peers = []
                rec["ranks"] = [{k: rec.get(k) for k in ("node", "switch", "switch_s", "run_s", "offload_s")}] + \
                    [{k: o["record"].get(k) for k in ("node", "switch", "switch_s", "run_s", "offload_s")} for o in outs]
                rec["nodes"] = [r["node"] for r in rec["ranks"]]
                if phase == "sync":
                    cross = [result.get("cross_bytes")] + [o["result"].get("cross_bytes") for o in outs]
                    rec["sync_cross_bytes_by_rank"] = cross
                    rec["sync_cross_bytes"] = sum(int(c or 0) for c in cross)
                    result = dict(result, cross_bytes=rec["sync_cross_bytes"])
                else:
                    result = [result] + [o["result"] for o in outs]
            rec["ok"] = True
        except BaseException as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc(limit=8)
            lost = None if isinstance(e, WorkerLost) and "cannot be recovered" in str(e) else \
                (str(e) if isinstance(e, WorkerLost) else self._peer_lost(h) if h.durable and seq is not None else None)
            if lost is not None:
                # a peer died (or restarted without the job): not the job's fault; the driver
                # re-hosts the job and redoes this phase from its last commit
                rec["lost"] = True
                h.seq = None
                if not isinstance(e, WorkerLost):
                    raise WorkerLost(f"worker {lost} was lost during {job_id}'s {phase}: {rec['error']}") from e
            raise
        finally:
            rec["end"] = time.time()
            if not follower:
                self._release(h, phase, rec)
        return {"result": result, "record": rec}

    def _replay(self, h: _Hosted, job_id: str, phase: str, args: tuple, kwargs: dict, grant: dict,
                follower: bool) -> dict:
        """The committed result of phase ``grant["pool_seq"]`` (it finished and was released,
        but the driver lost the answer with a worker): nothing runs, no permit is released.
        The leader gathers its ranks' results in rank order, as :meth:`run` does."""
        import ray

        body = self._load_commit(h, int(grant["pool_seq"]))
        rec = {"node": self.node, "nodes": list(h.nodes or [self.node]), "iteration": grant.get("iteration"),
               "start": time.time(), "end": time.time(), "switch": "replayed", "switch_s": 0.0, "ok": True,
               "error": None, "replayed": True}
        result = body.get("result")
        if not follower and h.world_size > 1:
            outs = ray.get([get_actor(n).run.remote(job_id, phase, args, kwargs, grant, True) for n in h.peers[1:]],
                           timeout=SYNC_TIMEOUT_S)
            result = result if phase == "sync" else [result] + [o["result"] for o in outs]
        return {"result": result, "record": rec}

    def open_sync_endpoint(self, job_id: str, plan, addr: str, index: int, host: str, backend: str = "gloo",
                           gen: int = 0) -> dict:
        """Join the job's collectives group as this pool's worker ``index`` over ``backend``
        (``"gloo"``, or ``"nccl"`` on this worker's CUDA device), endpoint generation ``gen``;
        kept for the job's life (until the leader rebuilds the endpoints). Raises what
        :func:`collectives.open_endpoint` raises (SyncError when NCCL cannot run here)."""
        from collectives import open_endpoint

        h = self._hosted(job_id)
        if h.endpoint is not None:
            h.endpoint.close()
            h.endpoint = None
        h.plan = plan
        kw: dict = {}
        if backend == "nccl":
            import torch

            kw["device"] = torch.cuda.current_device()  # the GPU Ray gave this worker
        h.endpoint = open_endpoint(plan, self.pool, index, backend=backend, addr=addr, job_id=job_id,
                                   bind_host=host, timeout_s=SYNC_TIMEOUT_S, **kw)
        h.endpoint_gen, h.sync_used = gen, backend
        h.endpoint_ready.set()
        return {"node": self.node, "index": index, "backend": backend}

    def sync_caps(self) -> dict:
        """What this worker can use for a sync endpoint (see :func:`collectives.select.endpoint_caps`),
        named by its node, with the IP its endpoint would bind to."""
        import ray

        from collectives import endpoint_caps

        return {"name": self.node, "ip": ray.util.get_node_ip_address(), **endpoint_caps()}

    def sync_signal(self, job_id: str, gen: int, kind: str, why: str) -> bool:
        """The job's sync leader tells this worker about sync generation ``gen``: ``"abort"`` (a
        peer failed: an endpoint of that generation aborts now, a rank waiting for one gives up)
        or ``"object_store"`` (the collectives could not be built: this sync goes through the
        object store). False when the job is not hosted here."""
        h = self.jobs.get(job_id)
        if h is None:
            return False
        h.sync_signals[gen] = (kind, why)
        if kind == "object_store":  # the leader stays on the object store for the job's life
            h.sync_fallback = why
        for g in [g for g in h.sync_signals if g < gen - 2]:
            h.sync_signals.pop(g, None)
        ep = h.endpoint
        if kind == "abort" and ep is not None and h.endpoint_gen <= gen:
            ep.abort(why)
        h.endpoint_ready.set()
        return True

    def _sync(self, h: _Hosted, state: dict, follower: bool = False, grant: Optional[dict] = None,
              watch: Optional[dict] = None) -> dict:
        raise NotImplementedError

    def _next_sync_gen(self, h: _Hosted) -> int:
        return h.sync_gen


class RolloutWorkerImpl(_PoolWorker):
    """Hosts the rollout phases of the jobs pinned to a rollout node."""

    pool = "rollout"

    def receive_weights(self, job_id: str, refs: list) -> dict:
        """Sync receive side: pull the weights object to this node; applied at the next rollout."""
        import ray

        h = self._hosted(job_id)
        t0 = time.perf_counter()
        ray.wait(list(refs), fetch_local=True, timeout=600)
        if h.durable:
            self._keep_weights(h, ray.get(refs[0]))
        h.pending_weights = {"ref": list(refs)}
        return {"node": self.node, "fetch_s": time.perf_counter() - t0, "backend": "object_store"}

    def receive_sync(self, job_id: str) -> dict:
        """Sync receive side over collectives/ (atomic); applied at the job's next rollout."""
        import torch

        h = self._hosted(job_id)
        ep = h.endpoint
        if ep is None or h.plan is None:
            raise RuntimeError(f"job {job_id!r}: no sync endpoint on {worker_name(self.node)} (worker restarted?)")
        t0 = time.perf_counter()
        template = {m.name: torch.empty(m.shape, dtype=getattr(torch, m.dtype)) for m in h.plan.tensors}
        h.pending_weights = {"dict": ep.receive(template)}
        self._keep_weights(h, h.pending_weights["dict"])
        st = ep.last_stats
        return {"node": self.node, "fetch_s": time.perf_counter() - t0, "backend": ep.backend,
                "cross_recv_bytes": getattr(st, "cross_recv_bytes", None),
                "intra_recv_bytes": getattr(st, "intra_recv_bytes", None)}


class TrainWorkerImpl(_PoolWorker):
    """Hosts the training and sync (send side) phases of the jobs pinned to a training node."""

    pool = "train"

    def _sync(self, h: _Hosted, state: dict, follower: bool = False, grant: Optional[dict] = None,
              watch: Optional[dict] = None) -> dict:
        """Sync send side. Every training rank runs the job's ``sync`` function; with a collectives
        transport (``sync_backend`` ``"auto"``: cupy-NCCL where every worker holds its own CUDA
        device, else gloo; or ``"nccl"`` / ``"gloo"`` as asked) each rank sends its shard of the
        N->M plan (N = the job's training workers, M = its rollout workers; RollMux §5.2), so one
        model copy crosses the boundary in all; ``cross_bytes`` is what this rank's executor sent
        (the leader adds the ranks up). The object store (``sync_backend="object_store"``, or
        ``"auto"`` when the collectives endpoints could not be built: ``note`` says why) puts the
        leader's weights once and every rollout worker pulls them.

        Fails fast: when a peer's task dies during the sync (a rollout worker's receive, a training
        rank's phase), the leader aborts every endpoint of the job within a fraction of a second
        (SyncAbortedError naming the peer; rollout weights unchanged) and the endpoints are rebuilt
        at the next sync. ``watch``: the follower ranks' phase ObjectRefs -> worker names."""
        fn = h.phases.get("sync")
        if fn is None:
            raise KeyError(f"job {h.job_id!r} has no sync phase")
        grant = grant or {}
        gen = int(grant["sync_gen"]) if "sync_gen" in grant else (h.sync_gen if follower else self._next_sync_gen(h))
        try:
            weights = fn(state)
        except BaseException as e:
            if not follower and h.world_size > 1:  # ranks waiting for this sync's endpoints give up
                self._abort_sync(h, gen, f"training rank 0 ({self.node}): sync function raised "
                                         f"{type(e).__name__}: {e}", rollout=False)
            raise
        t0 = time.perf_counter()
        if h.sync_backend != "object_store" and h.sync_fallback is None:
            if follower:
                out = self._send_follower(h, weights, gen)
            else:
                out = self._sync_collective(h, weights, gen, watch or {})
            if out is not None:
                return dict(out, sync_s=time.perf_counter() - t0)
        if follower:
            return {"cross_bytes": 0, "backend": "object_store"}
        out = self._sync_object_store(h, weights)
        note = h.sync_fallback or "object_store asked for"
        return dict(out, note=note, sync_s=time.perf_counter() - t0)

    def _sync_object_store(self, h: _Hosted, weights: dict) -> dict:
        import ray

        nbytes = sum(int(v.numel() * v.element_size()) for v in weights.values() if hasattr(v, "element_size"))
        ref = ray.put(weights)
        del weights
        acks = ray.get([get_actor(w).receive_weights.remote(h.job_id, [ref]) for w in h.rollout_workers], timeout=600)
        # object store: every rollout node pulls the whole object across the boundary
        return {"receivers": acks, "cross_bytes": nbytes * len(acks), "backend": "object_store"}

    def _abort_sync(self, h: _Hosted, gen: int, why: str, rollout: bool = True) -> None:
        """Leader: abort sync generation ``gen`` everywhere: this rank's endpoint (its pending
        waits give up and publish the abort in the job's store), the other ranks (and rollout
        workers) by ``sync_signal``; the next sync rebuilds the endpoints as generation ``gen + 1``."""
        h.sync_gen = max(h.sync_gen, gen)
        if h.endpoint is not None:
            h.endpoint.abort(why)
        self._signal_ranks(h, gen, "abort", why, rollout=rollout)

    def _signal_ranks(self, h: _Hosted, gen: int, kind: str, why: str, rollout: bool = False) -> None:
        """Tell the job's other training ranks (and its rollout workers) about sync ``gen``
        (fire and forget: a dead peer is not waited for)."""
        names = list(h.peers[1:]) + (list(h.rollout_workers) if rollout else [])
        for n in names:
            try:
                get_actor(n).sync_signal.remote(h.job_id, gen, kind, why)
            except Exception:  # the peer's actor is gone: nothing to tell
                pass

    def _send_follower(self, h: _Hosted, weights: dict, gen: int) -> Optional[dict]:
        """A non-leader training rank: wait for the endpoint of generation ``gen`` the leader opens
        here (or its word that the sync goes through the object store / was aborted), then send
        this rank's shard. Returns None for the object store."""
        from rollmux.sync_plan import SyncAbortedError

        t_end = time.monotonic() + SYNC_TIMEOUT_S
        while True:
            sig = h.sync_signals.get(gen)
            if sig is not None and sig[0] == "object_store":
                return None
            if sig is not None:
                raise SyncAbortedError(f"job {h.job_id!r}: sync aborted before {self.node} sent: {sig[1]}")
            ep = h.endpoint
            if ep is not None and h.endpoint_gen == gen and not ep.broken:
                break
            if time.monotonic() > t_end:
                raise TimeoutError(f"job {h.job_id!r}: no sync endpoint opened on {self.node} in {SYNC_TIMEOUT_S:g} s")
            h.endpoint_ready.wait(0.05)
            h.endpoint_ready.clear()
        st = ep.send(weights)
        return {"cross_bytes": int(st.cross_sent_bytes), "backend": ep.backend}

    def _next_sync_gen(self, h: _Hosted) -> int:
        """The endpoint generation the next sync uses: the current one while the endpoints are
        healthy, a new one when the leader is about to (re)build them."""
        ep = h.endpoint
        healthy = ep is not None and not ep.broken and h.endpoint_gen == h.sync_gen
        return h.sync_gen if healthy else h.sync_gen + 1

    def _watched(self, refs: dict, stop: threading.Event, on_fail: Callable[[str], None]) -> threading.Thread:
        """A thread that calls ``on_fail(reason)`` as soon as one of ``refs`` (ObjectRef -> name of
        the worker running it) fails, until ``stop`` is set."""
        import ray

        def loop() -> None:
            pending = dict(refs)
            while pending and not stop.is_set():
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
                for r in ready:
                    name = pending.pop(r)
                    try:
                        ray.get(r, timeout=0)
                    except Exception as e:
                        msg = str(e).strip().splitlines()
                        on_fail(f"{name}: its sync task failed ({type(e).__name__}: {msg[-1][:300] if msg else ''})")
                        return

        t = threading.Thread(target=loop, name=f"rollmux-sync-watch-{self.node}", daemon=True)
        t.start()
        return t

    def _build_endpoints(self, h: _Hosted, weights: dict, gen: int, peers: list, trainers: list) -> str:
        """Build the job's sync endpoints (generation ``gen``) over the transport :func:`collectives.
        choose_backend` picks for these workers; returns why that transport. Raises when they
        cannot be built (a peer's ``open_sync_endpoint`` failed, or the rendezvous timed out)."""
        import ray

        from collectives import choose_backend, endpoint_caps, host_store, open_endpoint
        from rollmux.sync_plan import build_plan, metas_of

        if h.endpoint is not None:
            h.endpoint.close()
            h.endpoint = None
        caps = ray.get([t.sync_caps.remote() for t in trainers] + [p.sync_caps.remote() for p in peers],
                       timeout=SYNC_TIMEOUT_S)
        mine = {"name": self.node, "ip": ray.util.get_node_ip_address(), **endpoint_caps()}
        backend, why = choose_backend("auto" if h.sync_backend == "auto" else h.sync_backend, [mine, *caps])
        host = os.environ.get("ROLLMUX_SYNC_HOST") or h.host
        if host is None:
            host = "127.0.0.1" if {c["ip"] for c in caps} <= {mine["ip"]} else mine["ip"]
        plan = build_plan(metas_of(weights), max(1, h.world_size), len(peers), scheme="topo")
        store, addr = host_store(host, timeout_s=SYNC_TIMEOUT_S)  # hosted before anyone connects
        names = [f"{w} (open_sync_endpoint)" for w in h.rollout_workers + h.peers[1:]]
        opening = [p.open_sync_endpoint.remote(h.job_id, plan, addr, j, host, backend, gen) for j, p in enumerate(peers)]
        opening += [t.open_sync_endpoint.remote(h.job_id, plan, addr, i, host, backend, gen)
                    for i, t in enumerate(trainers, 1)]
        box: dict = {}
        done = threading.Event()

        def build() -> None:  # the rendezvous blocks: run it beside a watch on the peers' opening
            try:
                kw = {"device": __import__("torch").cuda.current_device()} if backend == "nccl" else {}
                box["ep"] = open_endpoint(plan, "train", 0, backend=backend, store=store, job_id=h.job_id,
                                          bind_host=host, timeout_s=SYNC_TIMEOUT_S, **kw)
            except BaseException as e:
                box["error"] = f"{type(e).__name__}: {e}"
            finally:
                done.set()

        failed: list = []
        stop = threading.Event()
        threading.Thread(target=build, name=f"rollmux-sync-build-{self.node}", daemon=True).start()
        self._watched(dict(zip(opening, names)), stop, lambda why_: (failed.append(why_), done.set()))
        done.wait(SYNC_TIMEOUT_S + 10)
        stop.set()
        if failed or "ep" not in box:
            if box.get("ep") is not None:
                box["ep"].close()
            raise RuntimeError(failed[0] if failed else box.get("error", f"rendezvous timed out after {SYNC_TIMEOUT_S:g} s"))
        try:
            ray.get(opening, timeout=SYNC_TIMEOUT_S)
        except Exception:
            box["ep"].close()
            raise
        h.plan, h.endpoint, h.endpoint_gen, h.sync_gen, h.sync_used = plan, box["ep"], gen, gen, backend
        return why

    def _sync_collective(self, h: _Hosted, weights: dict, gen: int, watch: dict) -> Optional[dict]:
        """RollMux §5.2 through collectives/, N training ranks -> M rollout workers: the plan and
        endpoints are built at the first sync (and after an aborted one; by the leader, on every
        endpoint) and kept alive in the worker processes; each sync every rank sends its shards
        and the rollout workers receive atomically. Endpoints bind to the job's host (127.0.0.1
        when all of its workers share this machine, else the node IP; env ROLLMUX_SYNC_HOST
        overrides). Returns None when the collectives cannot be built and ``sync_backend`` is
        ``"auto"`` (the caller then uses the object store, for this sync and the job's next ones)."""
        import ray

        from rollmux.sync_plan import SyncAbortedError, SyncPlanError

        peers = [get_actor(w) for w in h.rollout_workers]
        trainers = [get_actor(w) for w in h.peers[1:]]
        note = h.sync_note
        if h.endpoint is None or h.endpoint.broken or h.endpoint_gen != gen:
            try:
                note = h.sync_note = self._build_endpoints(h, weights, gen, peers, trainers)
            except SyncPlanError as e:  # e.g. "nccl" asked where it cannot run: the user's choice, not ours
                self._abort_sync(h, gen, f"sync endpoints refused: {e}")
                raise
            except Exception as e:
                why = f"collectives sync endpoints could not be built ({str(e)[:400]}); object store used"
                if h.sync_backend != "auto":
                    self._abort_sync(h, gen, why)
                    raise
                h.sync_fallback, h.sync_gen = why, max(h.sync_gen, gen)
                self._signal_ranks(h, gen, "object_store", why)
                return None
        ep = h.endpoint
        receiving = [p.receive_sync.remote(h.job_id) for p in peers]
        failed: list = []
        stop = threading.Event()

        def on_fail(why: str) -> None:
            failed.append(why)
            ep.abort(why)  # this rank's send gives up now and publishes the abort to the others

        self._watched({**dict(zip(receiving, h.rollout_workers)), **watch}, stop, on_fail)
        try:
            ep.send(weights)
            acks = ray.get(receiving, timeout=SYNC_TIMEOUT_S)
        except Exception as e:
            why = failed[0] if failed else f"{type(e).__name__}: {e}"
            self._abort_sync(h, gen, why)
            raise SyncAbortedError(f"job {h.job_id!r}: sync aborted: {why}; rollout weights unchanged, "
                                   f"the sync endpoints are rebuilt at the next sync") from e
        finally:
            stop.set()
        st = ep.last_stats  # what this rank's executor sent across the boundary
        return {"receivers": acks, "cross_bytes": int(getattr(st, "cross_sent_bytes", 0) or 0),
                "backend": h.sync_used, "note": note}


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
    request Ray hides no device, so every worker would compute on GPU 0). Raises ValueError for
    a malformed node id."""
    import ray

    pool = pool_of(node)
    cls = ray.remote(RolloutWorkerImpl if pool == "rollout" else TrainWorkerImpl)
    return cls.options(name=worker_name(node), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                       num_cpus=0, num_gpus=worker_num_gpus(), resources={node_resource(node): 1.0},
                       max_concurrency=8, max_restarts=-1).remote(node)


# Public names of the two actor classes (RollMux §5.1 terms).
RolloutWorker = RolloutWorkerImpl
TrainWorker = TrainWorkerImpl
