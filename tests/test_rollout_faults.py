"""An engine replica of the rollout service dies mid-step: none of its requests is lost silently.

Its queued requests are routed to the live replica; its running critical requests are retried
once there; its running non-critical requests fail with ``finish_reason = "replica_lost"`` and an
error naming the replica; a replacement replica takes its place. A service of its own (two CPU engine replicas), driven through its handle.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from rollmux.rollout_sched.api import RolloutIn, Status, SubmitBatch

pytestmark = pytest.mark.ray

PREFIX = "shared system prompt of this step, long enough to be routed by its prefix: " * 2


def test_replica_killed_mid_step(ray_cluster):
    from actors.handles import RolloutReplicaHandle
    from actors.rollout.service import ensure_rollout_service

    h = ensure_rollout_service(f"rollmux-rollouts-faults-{uuid.uuid4().hex[:6]}")
    try:
        assert h.ready_sync(timeout_s=300).num_replicas == 2
        names = h.replica_names_sync()

        victims: list[int] = []

        async def run() -> tuple[list, list]:
            reqs = [RolloutIn(prompt=PREFIX + f"q{i}", max_tokens=128, critical=i % 3 != 2, task_family="f")
                    for i in range(12)]
            acc = (await h.submit(SubmitBatch(requests=reqs))).requests
            on = {a.replica for a in acc}
            assert len(on) == 1, "one shared prefix: routed to one replica"
            victim = on.pop()
            victims.append(victim)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # mid-step: some of them running on the victim
                views = [await h.get(a.id) for a in acc]
                if sum(v.status is Status.RUNNING for v in views) >= 2:
                    break
                await asyncio.sleep(0.05)
            RolloutReplicaHandle(name=names[victim]).kill()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                views = [await h.get(a.id) for a in acc]
                if all(v.status in (Status.FINISHED, Status.FAILED, Status.CANCELLED) for v in views):
                    return reqs, views
                await asyncio.sleep(0.2)
            raise AssertionError(f"requests left unsettled: {[v.status for v in views]}")

        reqs, views = asyncio.run(run())
        for r, v in zip(reqs, views):
            assert v.status in (Status.FINISHED, Status.FAILED), v
            if r.critical:  # retried once elsewhere (or finished before the kill): never failed
                assert v.status is Status.FINISHED and v.retries <= 1 and v.output_token_ids
            if v.status is Status.FAILED:
                assert not r.critical and v.finish_reason == "replica_lost" and "replica" in (v.error or "")
        assert any(v.retries == 1 for v in views), "a running critical request was retried"
        s = h.stats_sync()
        assert s.counters["replica_restarts"] == 1 and all(r.alive for r in s.replicas)  # replaced
        assert h.replica_names_sync()[victims[0]] != names[victims[0]]
        assert s.counters["retried"] >= 1 and s.counters["rerouted"] + s.counters["retried"] >= 2
        assert s.queued == 0 and s.running == 0

        async def after() -> list:  # the replacement serves
            acc = (await h.submit(SubmitBatch(requests=[RolloutIn(prompt=f"after {i}", max_tokens=4) for i in range(4)]))).requests
            return [await h.wait_result(a.id, 120) for a in acc]

        assert all(v.status is Status.FINISHED for v in asyncio.run(after()))
    finally:
        h.shutdown_sync()
