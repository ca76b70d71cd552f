"""Driver-side permits in scheduled mode: a framework job's phases granted by its group's controller.

:class:`DriverPermits` is the scheduled backend of ``with job.permit(phase)``
(:class:`rollmux.integrations.permits.PermitScope`). A framework (TRL, verl) runs its phases in
its own processes, so nothing is registered on RollMux's node workers; the permits take the same
path as phases run on the workers: ``GroupController.acquire`` (round-robin over the group's
per-node FIFO queues, :class:`rollmux.group_ledger.GroupLedger`) and ``GroupController.release``
with the phase's :class:`rollmux.messages.PhaseRecord`, except that the driver that acquired is
the grant's releaser (:attr:`rollmux.messages.Releaser.DRIVER`). The acquire goes through
:meth:`actors.driver.runtime_client.ScheduledRuntime._acquire`, so a job moved by departure re-packing
follows its record to the new group (the framework's state stays where it is; the next permit
names the new nodes). The driver's heartbeat keeps its lease while a permit is held; no worker
marks a driver-side phase started, so a driver that dies holding a permit is evicted after its
lease and the nodes are freed.

Devices: each granted node's RollMux worker reports the GPU ids Ray assigned it
(:attr:`rollmux.messages.WorkerPlace.gpu_ids`); the permit lists them (empty on CPU clusters).
Progress reports go to the controller's long-tail decision, at most once per 1/20 of the
responses (as the workers forward them). Every call goes through :mod:`actors.handles`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from actors.handles import ActorLost, CallTimeout
from actors.worker.workers import PROGRESS_BUCKETS
from rollmux.messages import EventKind, Grant, PhaseRecord, Releaser, RolloutProgress, RuntimeEvent

log = logging.getLogger("rollmux.driver_permits")


class DriverPermits:
    """Scheduled permits of one :class:`rollmux.Job` (its :class:`~actors.driver.runtime_client.ScheduledRuntime`)."""

    def __init__(self, runtime):
        self.rt = runtime
        self.open_phase: Optional[str] = None
        self._devices: dict[str, list[int]] = {}
        self._reported = False
        self._bucket = -1

    def acquire(self, phase: str) -> Grant:
        """The controller's grant (blocks for the job's round-robin turn), the driver its releaser.
        Raises PhaseFailed."""
        rt = self.rt
        if not self._reported:  # as the worker path does at registration: sync declared, the job runs
            rt.controller.configure_job_nowait(rt.job.job_id, has_sync=rt.program.has_sync).result(120)
            rt.sched.report_nowait(rt.job.job_id, RuntimeEvent(EventKind.RUNNING))
            self._reported = True
        self._bucket = -1
        return dataclasses.replace(rt._acquire(phase), releaser=Releaser.DRIVER)

    def release(self, phase: str, grant: Grant, record: dict) -> dict:
        """Release ``grant`` with the phase's record (``node``: the pool's first node). A
        controller that restarted forgot the grant: the release is recorded there and changes
        nothing (as for a worker's late release). Returns the driver's copy of the record."""
        rt = self.rt
        rec = PhaseRecord(node=grant.nodes[0] if grant.nodes else None, nodes=tuple(grant.nodes),
                          start=record["start"], end=record["end"], switch=record["switch"],
                          switch_s=record["switch_s"], run_s=record["run_s"], offload_s=record["offload_s"],
                          ok=bool(record["ok"]), error=record.get("error"), driver_side=True,
                          empty=bool(record.get("empty")))
        try:
            rt.controller.release(grant, rec)
        except (ActorLost, CallTimeout, RuntimeError) as e:  # logged; the lease frees a permit never released
            rec = rec.replace(release_error=f"{type(e).__name__}: {e}")
            log.warning("job %s: release of %s failed: %s", rt.job.job_id, phase, e)
        out = {**rec.to_dict(), "job_id": grant.job_id, "phase": phase, "pool": grant.pool,
               "iteration": grant.iteration, "granted_at": grant.granted_at, "waited_s": grant.waited_s,
               "group_id": grant.group_id}
        rt.timeline.append(out)
        return out

    def devices(self, nodes: list[str]) -> list[int]:
        """GPU ids of ``nodes``' workers (cached per node; ``[]`` on CPU clusters)."""
        rt = self.rt
        workers = dict(zip(rt.rollout_nodes + rt.train_nodes, rt.rollout_workers + rt.train_workers))
        out: list[int] = []
        for n in nodes:
            if n not in self._devices:
                w = workers.get(n)
                ids = w.where().gpu_ids if w is not None else ()
                self._devices[n] = [int(g) for g in ids if str(g).isdigit()]
            out.extend(self._devices[n])
        return out

    def progress(self, grant: Grant, done: int, total: int) -> Optional[dict]:
        """Forward rollout progress to the controller (bucketed); its long-tail decision (as a
        dict) or None."""
        bucket = int(PROGRESS_BUCKETS * done / total)
        if bucket == self._bucket:
            return None
        self._bucket = bucket
        try:
            d = self.rt.controller.progress(RolloutProgress(self.rt.job.job_id, int(done), int(total)), timeout_s=30)
        except Exception as e:  # progress is advisory: a restarting controller loses one report
            log.warning("job %s: progress report failed: %s", self.rt.job.job_id, e)
            return None
        return None if d is None else d.to_dict()
