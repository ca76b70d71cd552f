"""Weights into the rollout service over the topology-aware sync plan (RollMux §5.2), from a job's
training side inside RollMux.

The service's engine replicas are the plan's rollout workers (M = ``num_replicas``); the job's
training worker(s) are its training workers. One model copy crosses the pool link (training
worker i sends shard i to replica ``i mod M``), then each receiving replica broadcasts its shard
to the others (:mod:`collectives`, gloo on CPU). The replicas keep what they received staged and
install it at a window boundary after the update's pause mode; the update answers when every
replica serves it (:meth:`actors.rollout.service.RolloutService.update_from_sync`).

:func:`push_over_sync_plan` is the training side for one training process (N = 1: e.g. the rank
that holds the full weights after a gather, as a job's ``sync`` phase does). With N > 1 each
training rank opens its own endpoint of the same plan (``open_endpoint(plan, "train", i, addr=...)``)
and calls ``send`` with its state dict while rank 0 runs this function's update call.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Mapping, Optional

from actors.handles import RolloutServiceHandle
from rollmux.rollout_sched.weights import PauseMode, SyncOffer, WeightUpdateView


async def push_over_sync_plan(handle: RolloutServiceHandle, state: Mapping[str, Any], version: int, *,
                              pause_mode: PauseMode = PauseMode.KEEP, host: str = "127.0.0.1",
                              timeout_s: float = 60.0, update_timeout_s: float = 120.0,
                              bucket_bytes: Optional[int] = None) -> dict:
    """Send ``state`` as weights ``version`` to every replica of the service over a sync plan
    (this process is training worker 0 of 1; ``timeout_s`` bounds each transfer wait,
    ``update_timeout_s`` the replicas' install) -> ``{"update": WeightUpdateView | Refusal,
    "cross_bytes", "intra_bytes", "send_s"}``. Raises the transfer's error (``SyncError``) when the
    send fails; the replicas then keep their weights."""
    from collectives import host_store, open_endpoint
    from rollmux.sync_plan import DEFAULT_BUCKET_BYTES, build_plan, metas_of

    lim = await handle.limits()
    plan = build_plan(metas_of(state), 1, lim.num_replicas, scheme="topo", bucket_bytes=bucket_bytes or DEFAULT_BUCKET_BYTES)
    store, addr = host_store(host, timeout_s=timeout_s)
    job_id = f"rollout-weights-{uuid.uuid4().hex[:12]}"
    offer = SyncOffer(version=version, plan=plan, addr=addr, job_id=job_id, bind_host=host, pause_mode=pause_mode,
                      timeout_s=timeout_s)
    update = asyncio.ensure_future(handle.update_from_sync(offer, timeout_s + update_timeout_s))
    t0 = time.perf_counter()

    def send() -> None:
        ep = open_endpoint(plan, "train", 0, store=store, job_id=job_id, timeout_s=timeout_s, bind_host=host)
        try:
            ep.send(state)
        finally:
            ep.close()

    try:
        await asyncio.to_thread(send)
    except BaseException:
        update.cancel()
        raise
    send_s = time.perf_counter() - t0
    out: WeightUpdateView | Any = await update
    return {"update": out, "cross_bytes": plan.cross_bytes, "intra_bytes": plan.intra_bytes, "send_s": send_s}


__all__ = ["push_over_sync_plan"]
