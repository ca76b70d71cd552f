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
  and reported in the timeline and metrics.

Weight sync (scheduled mode): the TrainWorker runs the job's ``sync`` function, puts the weights
in its object store and hands the reference to the job's RolloutWorker(s) (``receive_weights``
pulls the object to the rollout node); the rollout side applies them at the start of the job's
next rollout (RoundRobinQueues models sync as holding the training nodes only). This is the
object-store path; the collectives/ executor is not wired in yet.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from rollmux.nodes import node_resource, pool_of
from rollmux.phase_api import RuntimeHook, call_phase, split_state, state_resume, state_suspend

NAMESPACE = "rollmux"
PROGRESS_BUCKETS = 20  # progress is forwarded to the controller at most once per 1/20 of the responses


def worker_name(node: str) -> str:
    """Actor name of the worker hosting jobs on ``node``."""
    return f"rollmux-worker-{node}"


def restore_state(fresh: dict, saved: dict) -> dict:
    """Cold start: builder's fresh state + the saved state. Modules/optimizers load the saved
    ``state_dict``; other values are replaced by the saved ones. Returns ``fresh`` updated."""
    for k, v in saved.items():
        cur = fresh.get(k)
        if hasattr(cur, "load_state_dict") and hasattr(v, "state_dict"):
            cur.load_state_dict(v.state_dict())
        else:
            fresh[k] = v
    return fresh


class _Hosted:
    """One job hosted on this worker."""

    def __init__(self, job_id: str, cfg: dict):
        self.job_id = job_id
        self.builder: Callable[[], dict] = cfg["builder"]
        self.phases: dict[str, Callable] = cfg.get("phases", {})
        self.apply: Optional[Callable] = cfg.get("apply")
        self.hooks: list[Callable] = cfg.get("hooks", [])
        self.switch: str = cfg.get("switch", "warm")
        self.controller: str = cfg["controller"]
        self.rollout_workers: list[str] = cfg.get("rollout_workers", [])
        self.ckpt: Path = Path(cfg.get("checkpoint_dir") or os.path.join(tempfile.gettempdir(), "rollmux-ckpt")) / \
            f"{job_id}-{cfg['pool']}.pt"
        self.ref: Any = None  # ObjectRef of the stored (storable) state
        self.resident: dict = {}
        self.pending_weights: Optional[list] = None
        self.switches: list[dict] = []


class _PoolWorker:
    """Shared logic of the two pool workers (plain class; see :func:`get_or_create_worker`)."""

    pool = "?"

    def __init__(self, node: str):
        import torch

        torch.set_num_threads(1)
        self.node = node
        self.jobs: dict[str, _Hosted] = {}
        self._lock = threading.Lock()

    # ---- hosting
    def register_job(self, job_id: str, cfg: dict) -> bool:
        """Host ``job_id`` (builder, phase functions, switch mode, controller name). Idempotent."""
        if job_id in self.jobs:
            return False
        self.jobs[job_id] = _Hosted(job_id, {**cfg, "pool": self.pool})
        return True

    def unregister_job(self, job_id: str) -> bool:
        """Drop a job's state (departure / failure); its object-store state is freed."""
        return self.jobs.pop(job_id, None) is not None

    def hosted(self) -> dict:
        return {j: {"stored": h.ref is not None, "resident": sorted(h.resident), "switches": list(h.switches),
                    "pending_weights": h.pending_weights is not None} for j, h in self.jobs.items()}

    def where(self) -> dict:
        """Placement check: this actor's Ray node id, RollMux node id, pool, pid, torch threads."""
        import ray
        import torch

        return {"ray_node_id": ray.get_runtime_context().get_node_id(), "node": self.node, "pool": self.pool,
                "pid": os.getpid(), "torch_threads": torch.get_num_threads()}

    # ---- warm / cold start
    def _materialise(self, h: _Hosted) -> tuple[dict, str, float]:
        import ray
        import torch

        t0 = time.perf_counter()
        if h.ref is not None and h.switch == "warm":
            state, kind = dict(ray.get(h.ref)), "warm"
        else:
            state = h.builder()
            if not isinstance(state, dict):
                raise TypeError(f"job {h.job_id}: the {self.pool} state builder must return a dict")
            if h.ckpt.is_file():
                state = restore_state(state, torch.load(h.ckpt, weights_only=False))
            kind = "cold"
        state.update(h.resident)
        state_resume(state)
        return state, kind, time.perf_counter() - t0

    def _offload(self, h: _Hosted, state: dict) -> float:
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
        return time.perf_counter() - t0

    def _release(self, h: _Hosted, phase: str, record: dict) -> None:
        import ray

        ctrl = ray.get_actor(h.controller, namespace=NAMESPACE)
        ray.get(ctrl.release.remote(h.job_id, phase, record))

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
                ctrl.progress.remote(h.job_id, event["done"], event["total"])

    # ---- phases
    def run(self, job_id: str, phase: str, args: tuple, kwargs: dict, grant: dict) -> dict:
        """Run a granted phase: warm/cold start, the user's function, offload, release the permit.

        Returns ``{"result": ..., "record": timeline record}``. Raises the phase's own exception
        (after releasing the permit with ``ok=False``) and KeyError for a job not hosted here.
        """
        import ray

        h = self.jobs.get(job_id)
        if h is None:
            raise KeyError(f"job {job_id!r} is not hosted on {worker_name(self.node)}")
        rec: dict = {"node": self.node, "iteration": grant.get("iteration"), "start": time.time(),
                     "switch": None, "switch_s": None, "ok": False, "error": None}
        result = None
        try:
            state, kind, sw = self._materialise(h)
            rec.update(switch=kind, switch_s=sw)
            h.switches.append({"phase": phase, "kind": kind, "seconds": sw})
            t1 = time.perf_counter()
            if phase == "sync":
                result = self._sync(h, state)
            else:
                if h.pending_weights is not None and h.apply is not None:
                    h.apply(state, ray.get(h.pending_weights[0]))
                    h.pending_weights = None
                ctrl = ray.get_actor(h.controller, namespace=NAMESPACE)
                last = [-1]
                hook = RuntimeHook(job_id, phase, grant.get("iteration", 0), lambda e: self._emit(h, ctrl, e, last))
                result = call_phase(h.phases[phase], phase, state, tuple(args), dict(kwargs), hook)
            rec["run_s"] = time.perf_counter() - t1
            rec["offload_s"] = self._offload(h, state)
            del state
            rec["ok"] = True
        except BaseException as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc(limit=8)
            raise
        finally:
            rec["end"] = time.time()
            self._release(h, phase, rec)
        return {"result": result, "record": rec}

    def _sync(self, h: _Hosted, state: dict) -> dict:
        raise NotImplementedError


class RolloutWorkerImpl(_PoolWorker):
    """Hosts the rollout phases of the jobs pinned to a rollout node."""

    pool = "rollout"

    def receive_weights(self, job_id: str, refs: list) -> dict:
        """Sync receive side: pull the weights object to this node; applied at the next rollout."""
        import ray

        h = self.jobs.get(job_id)
        if h is None:
            raise KeyError(f"job {job_id!r} is not hosted on {worker_name(self.node)}")
        t0 = time.perf_counter()
        ray.wait(list(refs), fetch_local=True, timeout=600)
        h.pending_weights = list(refs)
        return {"node": self.node, "fetch_s": time.perf_counter() - t0}


class TrainWorkerImpl(_PoolWorker):
    """Hosts the training and sync (send side) phases of the jobs pinned to a training node."""

    pool = "train"

    def _sync(self, h: _Hosted, state: dict) -> dict:
        import ray

        fn = h.phases.get("sync")
        if fn is None:
            raise KeyError(f"job {h.job_id!r} has no sync phase")
        weights = fn(state)
        ref = ray.put(weights)
        del weights
        acks = ray.get([ray.get_actor(w, namespace=NAMESPACE).receive_weights.remote(h.job_id, [ref])
                        for w in h.rollout_workers], timeout=600)
        return {"receivers": acks}


def get_or_create_worker(node: str):
    """The named, detached worker of ``node`` (RolloutWorker or TrainWorker by the node's pool),
    pinned with ``rollmux_node:<node>``. Raises ValueError for a malformed node id."""
    import ray

    pool = pool_of(node)
    cls = ray.remote(RolloutWorkerImpl if pool == "rollout" else TrainWorkerImpl)
    return cls.options(name=worker_name(node), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                       num_cpus=0, resources={node_resource(node): 1.0}, max_concurrency=8,
                       max_restarts=-1).remote(node)


# Public names of the two actor classes (RollMux §5.1 terms).
RolloutWorker = RolloutWorkerImpl
TrainWorker = TrainWorkerImpl
