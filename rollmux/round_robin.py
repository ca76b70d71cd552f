"""Intra-group round-robin meta-iterations over per-node FIFO queues (RollMux §4.3).

:class:`RoundRobinQueues` is a pure, incremental state machine with no clock of its own: the
intra-group simulator (:mod:`rollmux.intra_group`) drives it with simulated time and the
``GroupController`` actor drives it with real phase-completion events.

Semantics:

* Every node of the group has a FIFO queue. In one *meta-iteration* each member enqueues its
  rollout exactly once on each of its rollout nodes and its training exactly once on each of its
  training nodes, in round-robin (admission) order; the queue of a node is therefore the cyclic
  sequence of the jobs pinned to it, in admission order.
* A job cycles rollout -> train -> sync -> rollout. A phase may start when its job's previous
  phase is done and the job is at the head of the queue of *every* node the phase is pinned to.
* Sync modelling choice (documented): the sync phase is the tail of the job's training slot. It
  holds the job's training nodes (the senders) right after training; the rollout nodes receive
  into the job's pinned host/engine buffers and are not blocked. The training-node queue
  advances when sync is done (or when training is done for a job without sync).
* Long-tail migration (:meth:`RoundRobinQueues.release`): once a rollout is tail-bound its
  stragglers are consolidated onto a few workers and the rollout stops blocking its nodes'
  queues, so the next queued rollout may start; the job still needs ``on_phase_done(rollout)``
  before its training becomes ready.

Jobs added later are appended at the end of each of their nodes' queues (they join the next
turn of every node); removing a job drops it from every queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from rollmux.models import PhaseName, PoolName, pool_of_phase

_NEXT: dict[str, str] = {"rollout": "train", "train": "sync", "sync": "rollout"}


@dataclass
class _Job:
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    has_sync: bool
    next_phase: str = "rollout"
    running: bool = False
    released: bool = False  # rollout released its queue slots (long-tail migration)
    iteration: int = 0  # completed iterations


@dataclass(frozen=True)
class ReadyPhase:
    """A phase allowed to start now: job, phase, the nodes it occupies and its iteration index."""

    job_id: str
    phase: PhaseName
    pool: PoolName
    nodes: tuple[str, ...]
    iteration: int


class RoundRobinQueues:
    """Per-node FIFO queues of one co-execution group in round-robin meta-iteration order.

    Methods raise ``KeyError`` for unknown jobs and ``ValueError`` for events out of order
    (e.g. granting a phase that is not ready, completing a phase that is not running).
    Source: RollMux §4.3 "Round-robin policy", §5.1 runtime hooks (FIFO queue per worker).
    """

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}
        self._queues: dict[str, list[str]] = {}
        self._ptr: dict[str, int] = {}

    # --- membership -------------------------------------------------------------------------
    def add_job(self, job_id: str, rollout_nodes: Iterable[str], train_nodes: Iterable[str], *, has_sync: bool = True) -> None:
        """Append ``job_id`` to the end of the queue of each of its nodes (admission order).

        Raises ValueError if the job is already present or a node list is empty.
        """
        if job_id in self._jobs:
            raise ValueError(f"job {job_id!r} already in the group queues")
        r, t = tuple(rollout_nodes), tuple(train_nodes)
        if not r or not t:
            raise ValueError(f"job {job_id!r} needs at least one rollout and one training node")
        self._jobs[job_id] = _Job(r, t, has_sync)
        for n in r + t:
            self._queues.setdefault(n, []).append(job_id)
            self._ptr.setdefault(n, 0)

    def remove_job(self, job_id: str) -> None:
        """Drop ``job_id`` from every queue (departure or failure). Raises KeyError if unknown."""
        job = self._jobs.pop(job_id)
        for n in job.rollout_nodes + job.train_nodes:
            q = self._queues[n]
            i = q.index(job_id)
            q.pop(i)
            if not q:
                del self._queues[n], self._ptr[n]
                continue
            if i < self._ptr[n]:
                self._ptr[n] -= 1
            if self._ptr[n] >= len(q):
                self._ptr[n] = 0

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(self._jobs)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._queues)

    def queue(self, node: str) -> tuple[str, ...]:
        """The node's queue from its head, one full round (KeyError for an unknown node)."""
        q, p = self._queues[node], self._ptr[node]
        return tuple(q[p:] + q[:p])

    def head(self, node: str) -> Optional[str]:
        q = self._queues.get(node)
        return q[self._ptr[node]] if q else None

    def nodes_of(self, job_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(rollout_nodes, train_nodes)`` of ``job_id`` (KeyError if unknown)."""
        j = self._jobs[job_id]
        return j.rollout_nodes, j.train_nodes

    def next_phase(self, job_id: str) -> str:
        return self._jobs[job_id].next_phase

    def iteration(self, job_id: str) -> int:
        """Completed iterations of ``job_id``."""
        return self._jobs[job_id].iteration

    def is_running(self, job_id: str) -> bool:
        return self._jobs[job_id].running

    # --- scheduling -------------------------------------------------------------------------
    def _nodes_of(self, job: _Job, phase: str) -> tuple[str, ...]:
        return job.rollout_nodes if pool_of_phase(phase) == "rollout" else job.train_nodes

    def _is_ready(self, job_id: str, job: _Job) -> bool:
        if job.running:
            return False
        if job.next_phase == "sync":  # holds the training slot it already heads (a resumed job waits for it)
            return all(self._queues[n][self._ptr[n]] == job_id for n in job.train_nodes)
        return all(self._queues[n][self._ptr[n]] == job_id for n in self._nodes_of(job, job.next_phase))

    def ready(self) -> list[ReadyPhase]:
        """Phases that may start now, in admission order (granting one never blocks another)."""
        out = []
        for jid, job in self._jobs.items():
            if self._is_ready(jid, job):
                ph = job.next_phase
                out.append(ReadyPhase(jid, ph, pool_of_phase(ph), self._nodes_of(job, ph), job.iteration))  # type: ignore[arg-type]
        return out

    def grant(self, job_id: str, phase: str) -> ReadyPhase:
        """Start ``phase`` of ``job_id``. Raises ValueError if it is not ready."""
        job = self._jobs[job_id]
        if job.next_phase != phase or not self._is_ready(job_id, job):
            raise ValueError(f"phase {phase!r} of job {job_id!r} is not ready (next: {job.next_phase}, running: {job.running})")
        job.running = True
        job.released = False
        return ReadyPhase(job_id, phase, pool_of_phase(phase), self._nodes_of(job, phase), job.iteration)  # type: ignore[arg-type]

    def _advance(self, nodes: tuple[str, ...], job_id: str) -> None:
        for n in nodes:
            q = self._queues[n]
            if q[self._ptr[n]] != job_id:  # pragma: no cover - guarded by the state machine
                raise ValueError(f"node {n}: head is {q[self._ptr[n]]!r}, not {job_id!r}")
            self._ptr[n] = (self._ptr[n] + 1) % len(q)

    def waiting_for(self, job_id: str) -> tuple[str, ...]:
        """Jobs that wait for ``job_id``'s rollout nodes: next in FIFO order after it on one of
        them, with their previous phase done (next phase rollout, not running). Long-tail
        migration acts only when this is non-empty (nobody waits: nothing to free the nodes for).
        Raises KeyError if unknown. Source: RollMux §4.3 "Long-tail migration"."""
        job = self._jobs[job_id]
        out: list[str] = []
        for n in job.rollout_nodes:
            q = self._queues[n]
            k = q[(self._ptr[n] + 1) % len(q)] if q[self._ptr[n]] == job_id else None
            if k is None or k == job_id or k in out:
                continue
            o = self._jobs[k]
            if o.next_phase == "rollout" and not o.running:
                out.append(k)
        return tuple(out)

    def release(self, job_id: str) -> None:
        """Long-tail migration: the running rollout of ``job_id`` stops blocking its nodes' queues.

        Raises ValueError unless the job's rollout is running and not yet released.
        Source: RollMux §4.3 "Long-tail migration".
        """
        job = self._jobs[job_id]
        if not (job.running and job.next_phase == "rollout") or job.released:
            raise ValueError(f"job {job_id!r} has no running, unreleased rollout")
        job.released = True
        self._advance(job.rollout_nodes, job_id)

    def on_phase_done(self, job_id: str, phase: str, now: Optional[float] = None) -> list[ReadyPhase]:
        """Record that ``phase`` of ``job_id`` finished (``now`` unused by the policy, kept for
        the runtime's logs); returns the phases ready afterwards.

        Raises ValueError if that phase is not running.
        """
        job = self._jobs[job_id]
        if not job.running or job.next_phase != phase:
            raise ValueError(f"phase {phase!r} of job {job_id!r} is not running (next: {job.next_phase}, running: {job.running})")
        job.running = False
        if phase == "rollout":
            if not job.released:
                self._advance(job.rollout_nodes, job_id)
            job.released = False
            job.next_phase = "train"
        elif phase == "train" and job.has_sync:
            job.next_phase = "sync"
        else:  # sync done, or training done for a job without a sync phase: its turn ends
            self._end_turn(job_id)
        return self.ready()

    def resume(self, job_id: str, phase: str, iteration: Optional[int] = None) -> None:
        """A restarted controller learns where ``job_id`` is in its meta-iteration from its
        driver: ``phase`` is its next phase (``iteration``: its completed iterations, kept when
        given). A job resuming at ``train`` / ``sync`` is put at the head of its training nodes'
        queues when their current head holds nothing (its next phase is rollout, not running);
        otherwise it waits for its turn there. Raises ValueError while a phase of the job runs or
        for an unknown phase, KeyError for an unknown job."""
        job = self._jobs[job_id]
        if job.running:
            raise ValueError(f"job {job_id!r} has a phase running; it cannot be resumed elsewhere")
        if phase not in _NEXT or (phase == "sync" and not job.has_sync):
            raise ValueError(f"job {job_id!r} cannot resume at phase {phase!r}")
        if iteration is not None:
            job.iteration = max(0, int(iteration))
        if phase != "rollout" and job.next_phase == "rollout":
            for n in job.train_nodes:
                q = self._queues[n]
                head = self._jobs[q[self._ptr[n]]]
                if head is job or (head.next_phase == "rollout" and not head.running):
                    self._ptr[n] = q.index(job_id)
        job.next_phase = phase

    def has_sync(self, job_id: str) -> bool:
        """Whether ``job_id`` has a sync phase. Raises KeyError if unknown."""
        return self._jobs[job_id].has_sync

    def set_has_sync(self, job_id: str, has_sync: bool) -> None:
        """Declare whether ``job_id`` has a sync phase. A job without one ends its turn on the
        training nodes when training finishes (also if it is waiting for its sync slot now).
        Raises KeyError if unknown."""
        job = self._jobs[job_id]
        job.has_sync = bool(has_sync)
        if not job.has_sync and job.next_phase == "sync" and not job.running:
            self._end_turn(job_id)

    def _end_turn(self, job_id: str) -> None:
        job = self._jobs[job_id]
        self._advance(job.train_nodes, job_id)
        job.next_phase = "rollout"
        job.iteration += 1
