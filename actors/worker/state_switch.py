"""Warm / cold start, offload and recovery of a hosted job's phase state on a pool worker.

:class:`StateSwitch` is composed by each pool worker (:class:`actors.worker.workers._PoolWorker`):
before a granted phase the job's live state is materialised (warm: the object store; cold:
builder + the cold-start file; moved: builder + the carried state; recovered: builder + the durable
commit before the phase, :mod:`actors.worker.commits`), after it the state is suspended and stored
again. The worker gives it its pool and its ``_parallel(h)``.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from actors.worker.commits import load_bytes, load_file, save_file
from actors.worker.hosted import _Hosted
from rollmux.messages import PendingWeights
from rollmux.phase_state import parallel_scope, restore_state, split_state, state_resume, state_suspend


def _close_all(values) -> None:
    """Close control-plane values (engines, communicators) that have ``close()``; errors ignored."""
    for v in list(values):
        close = getattr(v, "close", None)
        if v is not None and callable(close):
            try:
                close()
            except Exception:
                pass


class StateSwitch:
    """The state switch of one pool worker: warm / cold start, offload and recovery of the jobs it
    hosts (composed by the worker, which owns the hosted jobs).

    Args:
        pool: ``"rollout"`` or ``"train"``.
        parallel: ``parallel(hosted)``: the job's SPMD place on this worker (the worker's method).
    """

    def __init__(self, pool: str, parallel) -> None:
        self.pool = pool
        self._parallel = parallel

    # ---- warm / cold start
    def materialise(self, h: _Hosted, seq: Optional[int] = None) -> tuple[dict, str, float]:
        """The job's live state at the start of its pool's phase number ``seq`` (1-based; None:
        an old driver without numbering). Warm: the stored state; cold: builder + cold-start file;
        moved: builder + the carried state; recovered (the state in memory is not the one this
        phase starts from, e.g. the worker restarted): builder + the commit of phase ``seq - 1``.
        Raises WorkerLost when that commit is missing (the state cannot be recovered)."""
        import ray

        t0 = time.perf_counter()
        recovering = (seq is not None and h.moved is None and h.durable and h.seq != seq - 1
                      and (seq > 1 or h.seq is not None))
        if recovering:
            state = self.recover(h, seq)
            kind = "recovered"
        elif h.moved is None and h.ref is not None and h.switch == "warm":
            state, kind = dict(ray.get(h.ref)), "warm"
        elif h.moved is None and h.resident and not h.rebuild_resident and h.ckpt.is_file():
            # cold start with the job's engines alive in this process: the stored state comes from
            # disk, the resident values (engines, communicators) are kept, the builder is not run
            # again (a rollout engine is a process of its own; rebuilding it per cold phase
            # started a new one each time). ``Job(rebuild_resident=True)`` rebuilds them instead.
            state, kind = dict(load_file(h.ckpt)), "cold"
            state.update(h.resident)
        else:  # cold start, or the first phase after a move: builder + the saved / carried state
            with parallel_scope(self._parallel(h)):
                state = h.builder()
            if not isinstance(state, dict):
                raise TypeError(f"job {h.job_id}: the {self.pool} state builder must return a dict")
            mv, saved = h.moved, None
            if mv is not None:
                if mv.ref is not None:
                    saved = ray.get(mv.ref)
                else:
                    saved = load_bytes(mv.ckpt)
            elif h.ckpt.is_file():
                saved = load_file(h.ckpt)
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
                    if gone is not None and gone is not state.get(k):
                        _close_all([gone])
                del old
                h.sync.refeed()
        if kind == "warm":
            state.update(h.resident)
        state_resume(state)
        return state, kind, time.perf_counter() - t0

    def offload(self, h: _Hosted, state: dict) -> tuple[float, dict]:
        """Suspend and store the state (warm: object store; cold: the cold-start file).
        Returns (seconds, the storable part)."""
        import ray

        t0 = time.perf_counter()
        state_suspend(state)
        storable, h.resident = split_state(state)
        if h.switch == "warm":
            h.ref = ray.put(storable)
        else:
            h.ckpt.parent.mkdir(parents=True, exist_ok=True)
            tmp = h.ckpt.with_suffix(".tmp")
            save_file(storable, tmp)
            os.replace(tmp, h.ckpt)
            h.ref = None
        return time.perf_counter() - t0, storable

    # ---- durable commits (a lost worker's jobs resume from them: :mod:`actors.worker.commits`)
    def recover(self, h: _Hosted, seq: int) -> dict:
        """builder() + the commit of phase ``seq - 1`` (nothing committed before phase 1: the
        fresh builder state) and, on the rollout side, the synced weights received after that
        commit (re-applied at this rollout). Returns the live state."""
        with parallel_scope(self._parallel(h)):
            state = h.builder()
        if not isinstance(state, dict):
            raise TypeError(f"job {h.job_id}: the {self.pool} state builder must return a dict")
        state = h.commits.restore(state, seq)
        _close_all(h.resident.values())  # nothing of the lost run's control plane is reused
        h.resident = {}
        if self.pool == "rollout":
            w = h.commits.weights_after(seq - 1)
            if w is not None:  # received after that commit: not in it yet
                h.sync.pending, h.weights_after = PendingWeights(tensors=w), seq - 1
        return state

    def keep_weights(self, h: _Hosted, weights: dict) -> None:
        """Rollout side: write received weights durably (see :meth:`_Hosted._keep_weights`)."""
        if h.durable:
            h._keep_weights(weights)
