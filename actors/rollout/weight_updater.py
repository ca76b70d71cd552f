"""The weights concern of the rollout service: what each replica loads at its next window, the
update routes' work (upload, checkpoint, sync plan) and waiting until every replica serves a
version. Owned by the service actor (:mod:`actors.rollout.service`), which delegates its weight
methods here; its collaborators are explicit (the replicas, the policy version, the clock, the
counters, how running requests are re-queued). The checks every update passes live in
:class:`actors.rollout.updates.WeightUpdates`. No Ray here (replicas are reached by their handles).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from actors.handles import ActorLost
from actors.rollout.records import ReplicaState
from actors.rollout.updates import WeightUpdates
from rollmux.rollout_sched.api import FieldError, Refusal
from rollmux.rollout_sched.service_config import ServiceConfig
from rollmux.rollout_sched.weights import (
    DiskUpdateBody, PauseMode, ReplicaWeights, SyncOffer, TensorSpec, UploadStartBody, UploadView, WeightsLoad,
    WeightsView, WeightUpdateView,
)


class WeightUpdater:
    """Weight updates of one service.

    Args:
        svc: the service settings.
        replicas: the service's replicas now (a replacement takes its predecessor's index).
        advance: moves the service's policy version to at least this one (prefix expiry, minimum).
        requeue: re-queues a replica's running requests (pause mode ``abort``).
        now: the service's clock, s. counters: the service's counters (written here:
            ``weight_updates``, ``weight_updates_refused``).
    """

    def __init__(self, svc: ServiceConfig, *, replicas: Callable[[], list[ReplicaState]],
                 advance: Callable[[int], Awaitable[Any]], requeue: Callable[[ReplicaState], None],
                 now: Callable[[], float], counters: dict[str, int]):
        self.svc = svc
        self.checks = WeightUpdates(svc)
        self._replicas, self._advance, self._requeue, self._now = replicas, advance, requeue, now
        self.counters = counters
        self.stopping = False
        self._lock = asyncio.Lock()
        self.loaded = asyncio.Event()  # set whenever a replica reports a weights version (or died)
        self._staged: dict[int, int] = {}  # replica -> the version it received over a sync plan (staged)
        self._manifest_asked = False

    @property
    def latest(self) -> Optional[WeightsLoad]:
        return self.checks.latest

    def configure(self, svc: ServiceConfig) -> None:
        self.svc = self.checks.svc = svc

    def signal(self) -> None:
        """A replica's weights changed, or it died: an update waiting on the replicas looks again."""
        self.loaded.set()
        self.loaded = asyncio.Event()

    def on_loaded(self, rep: ReplicaState, version: Optional[int], sha256: Optional[str]) -> None:
        rep.weights_version, rep.weights_sha256 = version, sha256
        self.signal()

    def on_lost(self, rep: ReplicaState) -> None:
        self._staged.pop(rep.index, None)
        self.signal()

    async def manifest(self) -> None:
        """Learn the engine's tensors from a live replica (once: every replica serves the same
        model; a vLLM engine serving a model named on a hub knows none, and updates are then
        checked by the engine's own load only)."""
        if self.checks.manifest is None and not self._manifest_asked:
            for r in self._replicas():
                if r.alive:
                    try:
                        self.checks.manifest = await r.handle.manifest()
                        self._manifest_asked = True
                        return
                    except ActorLost:
                        continue

    def for_window(self, rep: ReplicaState) -> tuple[Optional[WeightsLoad], bool]:
        """(weights to load in this window, hold new admissions): the latest complete version when
        the replica serves another one, after the update's pause mode."""
        w = self.checks.latest
        if w is None or rep.weights_version == w.version:
            return None, False
        if self._staged.get(rep.index) == w.version and rep.weights_version is not None:
            w = w.model_copy(update={"data": b""})  # the replica holds it staged (sync plan): no second copy
        mode = self.checks.mode if rep.weights_version is not None else PauseMode.KEEP  # a new replica: nothing runs
        if mode is PauseMode.WAIT and rep.sched.running:
            return None, True  # the running requests end first; nothing new starts meanwhile
        if mode is PauseMode.ABORT:
            self._requeue(rep)
        return w, False

    async def start_upload(self, body: UploadStartBody) -> UploadView | Refusal:
        """Announce an upload (``size_bytes``, ``sha256``, ``weight_version``, ``pause_mode``)."""
        return self._refused(self.checks.start_upload(body))

    async def put_chunk(self, upload_id: str, index: int, data: bytes) -> UploadView | Refusal:
        """Store chunk ``index`` of an upload (bytes ``[index * chunk_bytes, ...)``)."""
        return self._refused(self.checks.put_chunk(upload_id, index, data))

    async def cancel_upload(self, upload_id: str) -> bool:
        return self.checks.cancel(upload_id)

    async def commit_upload(self, upload_id: str) -> WeightUpdateView | Refusal:
        """Check the upload and apply it (every replica serves it when this answers)."""
        await self.manifest()
        out = self.checks.commit(upload_id)
        if isinstance(out, Refusal):
            return self._refused(out)
        return await self.apply(*out)

    async def update_from_disk(self, body: DiskUpdateBody) -> WeightUpdateView | Refusal:
        """Load a checkpoint's safetensors file under ``weights_root`` and apply it."""
        from actors.rollout.weights import CheckpointError, read_checkpoint

        await self.manifest()
        try:
            data = await asyncio.to_thread(read_checkpoint, body.model_path, self.svc.weights_root,
                                           self.svc.max_weights_bytes)
        except CheckpointError as e:
            return self._refused(Refusal(status=e.status, error="invalid_model_path", detail=str(e),
                                         errors=[FieldError(field="model_path", msg=str(e), type="path")]))
        except OSError as e:
            return self._refused(Refusal(status=422, error="invalid_model_path",
                                         detail=f"model_path: cannot read it ({e.strerror or e})"))
        out = self.checks.validate(data, body.weight_version, "disk", body.sha256)
        if isinstance(out, Refusal):
            return self._refused(out)
        return await self.apply(out, body.pause_mode)

    async def update_from_sync(self, offer: SyncOffer) -> WeightUpdateView | Refusal:
        """Receive ``offer.version`` over its sync plan on every replica (replica ``j`` is the plan's
        rollout worker ``j``; the trainers send concurrently), then apply it. The replicas install
        what they hold staged; the service keeps one copy (from replica 0) for replacement replicas.
        A plan for another number of replicas, or tensors that differ from the engine's: 422
        naming the field; a transfer that fails: 502, every replica keeps its weights."""
        from rollmux.rollout_sched.weights import check_specs

        if (r := self.checks.check_version(offer.version)) is not None:
            return self._refused(r)
        await self.manifest()
        plan = offer.plan
        if plan.num_rollout != len(self._replicas()) or not all(r.alive for r in self._replicas()):
            return self._refused(Refusal(
                status=422 if plan.num_rollout != len(self._replicas()) else 503, error="invalid_sync_plan",
                detail=f"plan: {plan.num_rollout} rollout workers, the service has {len(self._replicas())} replicas "
                       f"({sum(r.alive for r in self._replicas())} alive)", retry_after_s=self.svc.retry_after_s))
        specs = {t.name: TensorSpec(name=t.name, dtype=t.dtype, shape=t.shape) for t in plan.tensors}
        if self.checks.manifest is not None and (errs := check_specs(specs, self.checks.manifest)):
            return self._refused(Refusal(status=422, error="invalid_weights", detail="; ".join(
                f"{f}: {m}" for f, m, _ in errs[:8]), errors=[FieldError(field=f, msg=m, type=t) for f, m, t in errs]))
        try:
            receipts = await asyncio.gather(*(r.handle.receive_sync(offer.model_copy(update={"rollout_index": j}))
                                              for j, r in enumerate(self._replicas())))
        except Exception as e:  # a peer died or timed out: nothing was installed anywhere
            return self._refused(Refusal(status=502, error="sync_failed", retry_after_s=self.svc.retry_after_s,
                                         detail=f"plan: the transfer failed ({type(e).__name__}: "
                                                f"{str(e).splitlines()[0][:300] if str(e) else ''})"))
        digests = {rc.sha256 for rc in receipts}
        want = offer.sha256 or receipts[0].sha256
        if digests != {want}:
            return self._refused(Refusal(status=422, error="digest_mismatch", detail=f"sha256: the replicas "
                                         f"received {sorted(digests)}, expected {want}",
                                         errors=[FieldError(field="sha256", msg="digest mismatch", type="digest_mismatch")]))
        full = await self._replicas()[0].handle.export_weights(offer.version)
        staged = {r.index for r in self._replicas()}
        return await self.apply(full, offer.pause_mode, staged=staged)

    def _refused(self, out: Any) -> Any:
        if isinstance(out, Refusal):
            self.counters["weight_updates_refused"] += 1
        return out

    async def apply(self, load: WeightsLoad, mode: PauseMode,
                    staged: frozenset[int] | set[int] = frozenset()) -> WeightUpdateView | Refusal:
        """Make ``load`` the latest complete version (it already passed every check) and wait until
        every live replica serves it (``update_timeout_s``; then 504, the replicas go on loading it).
        The service's policy version moves to ``load.version`` when that is newer."""
        async with self._lock:
            if (r := self.checks.check_version(load.version)) is not None:
                return self._refused(r)
            t0 = self._now()
            self.checks.applied(load, mode)
            self._staged = {i: load.version for i in staged}
            requeued0 = self.counters["requeued"]
            await self._advance(load.version)
            for r in self._replicas():
                r.wake.set()
            deadline = t0 + self.svc.update_timeout_s
            while True:
                live = [r for r in self._replicas() if r.alive]
                if all(r.weights_version == load.version for r in live) or self.stopping:
                    break
                if self._now() >= deadline:
                    return Refusal(status=504, error="update_timeout",
                                   detail=f"weight_version {load.version}: not every replica serves it after "
                                          f"update_timeout_s {self.svc.update_timeout_s:g} s (pause_mode {mode.value}: "
                                          "they load it once their running requests end)", retry_after_s=1)
                try:
                    await asyncio.wait_for(self.loaded.wait(), max(0.01, min(1.0, deadline - self._now())))
                except asyncio.TimeoutError:
                    pass
            load_s = self._now() - t0
            view = WeightUpdateView(weight_version=load.version, weights_sha256=load.sha256, bytes=load.nbytes,
                                    source=load.source, pause_mode=mode, load_s=round(load_s, 6),
                                    requeued=self.counters["requeued"] - requeued0, replicas=self._replica_weights())
            bad = [r for r in view.replicas if r.alive and r.weights_sha256 != load.sha256]
            if bad:  # an engine that serves other bytes than it was sent: a defect, said loudly
                view.success, view.message = False, f"replicas {[r.replica for r in bad]} report another digest"
            self.counters["weight_updates"] += 1
            self.checks.record({"weight_version": load.version, "weights_sha256": load.sha256, "bytes": load.nbytes,
                                "source": load.source, "pause_mode": mode.value, "load_s": round(load_s, 6),
                                "at_s": round(t0, 6), "success": view.success})
            return view

    def _replica_weights(self) -> list[ReplicaWeights]:
        return [ReplicaWeights(replica=r.index, alive=r.alive, weights_version=r.weights_version,
                               weights_sha256=r.weights_sha256) for r in self._replicas()]

    async def view(self) -> WeightsView:
        """The latest complete version, every replica's version and digest, the recent updates."""
        w = self.checks.latest
        return WeightsView(weight_version=w.version if w else None, weights_sha256=w.sha256 if w else None,
                           bytes=w.nbytes if w else 0, replicas=self._replica_weights(), history=list(self.checks.history))

    async def replica_digests(self) -> list[Optional[str]]:
        """The digest each live replica computes now on the weights it serves (None: dead)."""
        async def one(r: ReplicaState) -> Optional[str]:
            try:
                return await r.handle.weights_sha256() if r.alive else None
            except ActorLost:
                return None
        return list(await asyncio.gather(*(one(r) for r in self._replicas())))


__all__ = ["WeightUpdater"]
