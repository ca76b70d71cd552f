"""One job hosted on a pool worker (:class:`_Hosted`) and the error for a job a worker does not host.

The worker (:mod:`actors.worker.workers`) keeps one :class:`_Hosted` per job pinned to its node,
registered from a :class:`rollmux.messages.JobHosting`; its phase state between phases, SPMD place,
durable commits (:class:`actors.worker.commits.Commits`) and weight-sync session
(:class:`actors.worker.weight_sync.SyncSession`) hang off it. Both names are re-exported by
:mod:`actors.worker.workers`.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from actors.worker.commits import Commits
from actors.worker.weight_sync import SyncSession
from rollmux.messages import JobHosting, MovedState, PendingWeights



class JobNotHosted(KeyError):
    """The job is not hosted on this worker (never registered here, ended, or the worker
    restarted and lost it: the driver then re-registers the job and redoes the phase)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "job not hosted"


class _Hosted:
    """One job hosted on this worker: its program for this pool (:class:`JobHosting`), its phase
    state between phases, its SPMD place and control plane, its commits and its sync session."""

    def __init__(self, job_id: str, cfg: JobHosting | dict, pool: str, node: str):
        cfg = JobHosting.of(cfg)
        self.job_id = job_id  # the hosting key (:func:`actors.naming.hosted_key`: job id @ scheduler)
        self.real_id: str = cfg.job_id or job_id  # the job id the controller knows
        self.hosting = cfg
        self.builder: Callable[[], dict] = cfg.builder
        self.phases: dict[str, Callable] = dict(cfg.phases)
        self.apply: Optional[Callable] = cfg.apply
        self.hooks: list[Callable] = list(cfg.hooks)
        self.switch: str = cfg.switch
        self.rebuild_resident: bool = cfg.rebuild_resident  # cold starts rebuild resident values (engines)
        self.rollout_workers: list[str] = list(cfg.rollout_workers)
        self.ckpt: Path = Path(cfg.checkpoint_dir or os.path.join(tempfile.gettempdir(), "rollmux-ckpt")) / \
            (f"{job_id}-{cfg.admission[:16]}-{pool}.pt" if cfg.admission else f"{job_id}-{pool}.pt")
        self.admission: Optional[str] = cfg.admission  # the scheduler's token of this admission
        self.ref: Any = None  # ObjectRef of the stored (storable) state
        self.resident: dict = {}
        self.switches: list[dict] = []
        self.moved: Optional[MovedState] = None  # state carried over by a move (its ``ref`` or ``ckpt``)
        # SPMD place of this worker among the job's workers of its pool (multi-node phases)
        par = cfg.parallel
        self.rank: int = par.rank
        self.world_size: int = par.world_size
        self.peers: list[str] = list(par.peers)  # worker names of the pool, rank order
        self.nodes: list[str] = list(par.nodes)
        self.addr: Optional[str] = par.addr  # the job's rendezvous store (hosted by rank 0)
        self.host: Optional[str] = par.host  # address the job's gloo groups bind to
        self.store: Any = None  # job's rendezvous store (PrefixStore), control plane
        self.group: Any = None  # job's gloo process group over its workers of this pool, control plane
        self.ctx_lock = threading.Lock()
        # durable commits (a worker may die): after every phase, the state the phase left (and its
        # result) is written next to the cold-start file; a phase redone after a lost worker starts
        # from the commit before it. ``seq``: how many of the job's phases of this pool the state
        # in memory holds (None: nothing in memory, e.g. just re-registered on a restarted worker)
        self.durable: bool = cfg.durable
        self.seq: Optional[int] = None
        self.commit_prefix: str = str(self.ckpt)[: -len(".pt")] + (f"-rank{self.rank}" if self.world_size > 1 else "")
        self.commits = Commits(self.commit_prefix, node=node, job=self.real_id, pool=pool)
        self.weights_after: Optional[int] = None  # the rollout commit the pending weights follow
        self.sync = SyncSession(job_id, pool, node, backend=cfg.sync_backend, rank=self.rank,
                                world_size=self.world_size, peers=tuple(self.peers),
                                rollout_workers=tuple(self.rollout_workers), host=self.host,
                                keep=self._keep_weights if self.durable else None,
                                max_staleness=cfg.max_staleness, mode=cfg.staleness_mode)

    @property
    def sync_backend(self) -> str:
        """The weight transport asked for (auto | nccl | gloo | object_store)."""
        return self.sync.backend

    @property
    def pending_weights(self) -> Optional[PendingWeights]:
        """Synced weights waiting for the job's next rollout (the sync session's)."""
        return self.sync.pending

    def _keep_weights(self, weights: dict) -> None:
        """Rollout side: write received weights durably (applied at the job's next rollout; a
        recovery re-applies them when the rollout they precede is redone), tagged with the
        rollout commit they follow."""
        self.weights_after = self.commits.keep_weights(self.seq, weights)
