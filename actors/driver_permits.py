"""Driver-side permits in scheduled mode: a framework job's phases granted by its group's controller.

:class:`DriverPermits` is the scheduled backend of ``with job.permit(phase)``
(:class:`rollmux.integrations.permits.PermitScope`). A framework (TRL, verl) runs its phases in
its own processes, so nothing is registered on RollMux's node workers; the permits take the same
path as phases run on the workers: ``GroupController.acquire`` (round-robin over the group's
per-node FIFO queues, :class:`rollmux.group_ledger.GroupLedger`) and ``GroupController.release``
with the phase's record, except that the driver that acquired releases. The acquire goes through
:meth:`actors.runtime_client.ScheduledRuntime._acquire`, so a job moved by departure re-packing
follows its record to the new group (the framework's state stays where it is; the next permit
names the new nodes). The driver's heartbeat thread keeps its lease while a permit is held: a
driver that dies mid-phase is evicted after its lease and its permit freed.

Devices: each granted node's RollMux worker reports the GPU ids Ray assigned it
(``_PoolWorker.devices``); the permit lists them (empty on CPU clusters). Progress reports go to
the controller's long-tail decision (``GroupController.progress``), at most once per 1/20 of
the responses, as the workers forward them.
"""

from __future__ import annotations

import logging
from typing import Optional

from actors.workers import PROGRESS_BUCKETS

log = logging.getLogger("rollmux.driver_permits")


class DriverPermits:
    """Scheduled permits of one :class:`rollmux.Job` (its :class:`~actors.runtime_client.ScheduledRuntime`)."""

    def __init__(self, runtime):
        self.rt = runtime
        self.open_phase: Optional[str] = None
        self._devices: dict[str, list[int]] = {}
        self._reported = False
        self._bucket = -1

    def acquire(self, phase: str) -> dict:
        """The controller's grant (blocks for the job's round-robin turn). Raises PhaseFailed."""
        import ray

        rt = self.rt
        if not self._reported:  # as the worker path does at registration: sync declared, the job runs
            ray.get(rt.controller.configure_job.remote(rt.job.job_id, has_sync="sync" in rt.job._phases), timeout=120)
            rt.sched.report.remote(rt.job.job_id, {"event": "running"})
            self._reported = True
        self._bucket = -1
        return rt._acquire(phase)

    def release(self, phase: str, grant: dict, record: dict) -> dict:
        """Release with the phase's record (``node``: the pool's first node). A controller that
        restarted forgot the grant: the release is recorded there and changes nothing (as for
        a worker's late release). Returns the driver's copy of the record."""
        import ray
        from ray.exceptions import RayActorError

        rt = self.rt
        nodes = list(grant.get("nodes") or [])
        rec = dict(record, node=nodes[0] if nodes else None)
        for attempt in range(2):
            try:
                ray.get(rt.controller.release.remote(rt.job.job_id, phase, rec), timeout=120)
                break
            except (RayActorError, ValueError) as e:  # the controller died: it is restarted; ask it again once
                rec["release_error"] = f"{type(e).__name__}: {e}"
                if attempt:
                    log.warning("job %s: release of %s failed: %s", rt.job.job_id, phase, e)
            except Exception as e:
                rec["release_error"] = f"{type(e).__name__}: {e}"
                log.warning("job %s: release of %s failed: %s", rt.job.job_id, phase, e)
                break
        out = dict(rec, job_id=rt.job.job_id, phase=phase, pool=grant.get("pool"), iteration=grant.get("iteration"),
                   granted_at=grant.get("granted_at"), waited_s=grant.get("waited_s"), group_id=grant.get("group_id"))
        rt.timeline.append(out)
        return out

    def devices(self, nodes: list[str]) -> list[int]:
        """GPU ids of ``nodes``' workers (cached per node; ``[]`` on CPU clusters)."""
        import ray

        rt = self.rt
        workers = dict(zip(rt.rollout_nodes + rt.train_nodes, rt.rollout_workers + rt.train_workers))
        out: list[int] = []
        for n in nodes:
            if n not in self._devices:
                w = workers.get(n)
                info = ray.get(w.devices.remote(), timeout=120) if w is not None else {"gpu_ids": []}
                self._devices[n] = [int(g) for g in info.get("gpu_ids", []) if str(g).isdigit()]
            out.extend(self._devices[n])
        return out

    def progress(self, grant: dict, done: int, total: int) -> Optional[dict]:
        """Forward rollout progress to the controller (bucketed); its long-tail decision or None."""
        import ray

        bucket = int(PROGRESS_BUCKETS * done / total)
        if bucket == self._bucket:
            return None
        self._bucket = bucket
        try:
            return ray.get(self.rt.controller.progress.remote(self.rt.job.job_id, done, total), timeout=30)
        except Exception as e:  # progress is advisory: a restarting controller loses one report
            log.warning("job %s: progress report failed: %s", self.rt.job.job_id, e)
            return None
