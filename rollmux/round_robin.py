"""Intra-group round-robin meta-iterations over per-node FIFO queues (RollMux §4.3).

:class:`RoundRobinQueues` is a pure, incremental state machine with no clock of its own: the
intra-group simulator (:mod:`rollmux.intra_group`) drives it with simulated time and the
``GroupController`` actor drives it with real phase-completion events.

Semantics:

* Every node of the group serves its jobs' *turns* in one global order. Job ``k``'s turn of
  meta-iteration ``c`` is ``(c, rank_k)``; a node serves the pending turns of the jobs pinned to it
  in increasing order, so in one *meta-iteration* each member runs its rollout once on each of its
  rollout nodes and its training once on each of its training nodes, in round-robin order.
* The round-robin order (``rank``) is the order jobs were added, or the *planned* order
  (:meth:`RoundRobinQueues.set_order`): admission checks a group's SLOs for one round-robin order
  of its members (the best one, :func:`rollmux.admission.best_round_robin_order`), which need not
  be the order in which their drivers attach. Jobs missing from the plan follow the planned ones,
  in the order they were added. A new plan takes effect at once, but never pre-empts a phase: a
  node held by a running phase (or by a training whose sync is due) stays held until it ends.
* A job has two streams of phases: its rollouts on its rollout nodes and its training (+ sync)
  on its training nodes. Rollout ``i`` may start when rollout ``i - 1`` is done and sync
  ``i - k - 1`` has ended (``k`` the job's staleness bound, :mod:`rollmux.staleness`); training
  ``i`` when rollout ``i`` is done and sync ``i - 1`` has ended. For a synchronous job (``k = 0``)
  that is the cycle rollout -> train -> sync -> rollout; an asynchronous job's rollout ``i + 1``
  may run on its rollout nodes while its training ``i`` runs on its training nodes (every node
  still runs one phase at a time). A phase may start when those dependencies hold and the job is
  at the head of the queue of *every* node the phase is pinned to (its pending turn is the
  smallest there and no other job holds the node). Rollout turns count the job's rollouts,
  training turns its iterations, so an asynchronous job's rollout turn may run up to ``k`` ahead.
* Sync modelling choice (documented): the sync phase is the tail of the job's training slot. It
  holds the job's training nodes (the senders) right after training; the rollout nodes receive
  into the job's pinned host/engine buffers and are not blocked. The training-node turn ends
  when sync is done (or when training is done for a job without sync).
* Long-tail migration (:meth:`RoundRobinQueues.release`): once a rollout is tail-bound its
  stragglers are consolidated onto a few workers and the rollout stops blocking its nodes'
  queues, so the next queued rollout may start; the job still needs ``on_phase_done(rollout)``
  before its training becomes ready.
* Joins: a job added later takes its planned place in the cycle: its first turn is the first one
  after the last turn already served on each of its nodes (the next round where its place was
  passed). Its turns are aligned with every group-mate it shares a node with (a set of jobs
  connected by shared nodes is shifted as a whole when a join bridges two such sets, which keeps
  their own order). Removing a job drops it from every queue.

No deadlock, whatever the joins, departures, plans and staleness bounds: order the pending
phases by (turn, rollout before training); the smallest one's own dependency is a phase of a
smaller turn (sync ``i - k - 1`` of a rollout ``i``), or its rollout of the same turn (training
``i``), so it is done or running, and the smallest phase is at the head of every node it needs
once the phases holding those nodes end (every other pending turn there is larger), so some
phase can always start or is running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from rollmux.models import PhaseName, PoolName, pool_of_phase

_NEXT: dict[str, str] = {"rollout": "train", "train": "sync", "sync": "rollout"}


@dataclass
class _Job:
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    has_sync: bool
    seq: int  # add order (ties after the plan)
    base: int = 0  # meta-iteration of the job's first turn (joins align it with its node-mates)
    max_staleness: int = 0  # k: rollout i waits for sync i - k - 1 (rollmux.staleness)
    rollouts: int = 0  # completed rollouts (the rollout stream)
    roll_running: bool = False
    released: bool = False  # rollout released its queue slots (long-tail migration)
    train_next: str = "train"  # the training stream's next phase: "train" | "sync"
    train_running: bool = False
    iteration: int = 0  # completed iterations (the training stream: syncs, or trainings without sync)

    @property
    def next_phase(self) -> str:
        """The next phase of the job's current iteration ``iteration``: its rollout until that is
        done, then its training / sync."""
        return "rollout" if self.rollouts == self.iteration else self.train_next

    @property
    def running(self) -> bool:
        return self.roll_running or self.train_running

    def rollout_due(self) -> bool:
        """Its next rollout's own dependencies hold: the previous rollout is done and the sync
        it needs has ended (``iteration >= rollouts - k``)."""
        return not self.roll_running and self.rollouts - self.iteration <= self.max_staleness

    def running_of(self, phase: str) -> bool:
        """Whether the stream of ``phase`` runs ``phase`` now."""
        if phase == "rollout":
            return self.roll_running
        return self.train_running and self.train_next == phase


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
        self._on: dict[str, list[str]] = {}  # node -> jobs pinned to it (add order)
        self._pool: dict[str, str] = {}  # node -> pool
        self._served: dict[str, tuple] = {}  # node -> the last turn granted on it
        self._rank: dict[str, int] = {}  # planned round-robin order (set_order); empty: add order
        self._n_added = 0

    # --- turns ------------------------------------------------------------------------------
    def _key(self, job_id: str, job: _Job) -> tuple[int, int]:
        return self._rank.get(job_id, len(self._rank)), job.seq

    def _turn(self, job_id: str, job: _Job, pool: str) -> tuple:
        """The job's pending turn on a node of ``pool``: (meta-iteration, rank, add order); on a
        rollout node the meta-iteration counts its rollouts (a released rollout's is passed), on
        a training node its iterations."""
        if pool == "rollout":
            c = job.base + job.rollouts + (1 if job.roll_running and job.released else 0)
        else:
            c = job.base + job.iteration
        return (c, *self._key(job_id, job))

    def _holder(self, node: str) -> Optional[str]:
        """The job whose phase holds ``node`` now: a running phase on it (a released rollout no
        longer holds), or a training whose sync is due (sync is the tail of the training slot)."""
        train = self._pool[node] == "train"
        for j in self._on[node]:
            job = self._jobs[j]
            if train:
                if job.train_running or job.train_next == "sync":
                    return j
            elif job.roll_running and not job.released:
                return j
        return None

    def _order(self, node: str) -> list[str]:
        pool = self._pool[node]
        return sorted(self._on[node], key=lambda j: self._turn(j, self._jobs[j], pool))

    # --- membership -------------------------------------------------------------------------
    def add_job(self, job_id: str, rollout_nodes: Iterable[str], train_nodes: Iterable[str], *, has_sync: bool = True,
                max_staleness: int = 0) -> None:
        """Add ``job_id`` to the queues of its nodes at its place in the round-robin order (the
        end of the add order, or its planned place, :meth:`set_order`); its first turn is the
        first after the last one served on each of its nodes. ``max_staleness``: the job's bound
        ``k`` (its rollout ``i`` waits for its sync ``i - k - 1``; 0: synchronous).

        Raises ValueError if the job is already present, a node list is empty or the bound is negative.
        """
        if job_id in self._jobs:
            raise ValueError(f"job {job_id!r} already in the group queues")
        r, t = tuple(rollout_nodes), tuple(train_nodes)
        if not r or not t:
            raise ValueError(f"job {job_id!r} needs at least one rollout and one training node")
        if max_staleness < 0:
            raise ValueError(f"job {job_id!r}: max_staleness must be >= 0, got {max_staleness}")
        job = _Job(r, t, has_sync, seq=self._n_added, max_staleness=int(max_staleness))
        self._n_added += 1
        key = self._key(job_id, job)
        mine = r + t
        # the sets of jobs connected (through shared nodes) to each of the new job's nodes
        comp: dict[str, int] = {}  # node -> component id
        for k, n in enumerate(mine):
            if n in comp or not self._on.get(n):
                continue
            stack = [n]
            comp[n] = k
            while stack:
                x = stack.pop()
                for j in self._on[x]:
                    o = self._jobs[j]
                    for y in o.rollout_nodes + o.train_nodes:
                        if y not in comp:
                            comp[y] = k
                            stack.append(y)
        need: dict[int, int] = {}  # component -> first meta-iteration of the new job's turn there
        for n in mine:
            s = self._served.get(n)
            if s is None or n not in comp:
                continue
            c = s[0] if key > tuple(s[1:]) else s[0] + 1
            need[comp[n]] = max(need.get(comp[n], c), c)
        job.base = max(need.values(), default=0)
        for k, c in need.items():  # align each connected set with the new job (keeps its own order)
            if c == job.base:
                continue
            d = job.base - c
            nodes = [n for n, kk in comp.items() if kk == k]
            for j in {j for n in nodes for j in self._on[n]}:
                self._jobs[j].base += d
            for n in nodes:
                if n in self._served:
                    s = self._served[n]
                    self._served[n] = (s[0] + d, *s[1:])
        self._jobs[job_id] = job
        for pool, nodes in (("rollout", r), ("train", t)):
            for n in nodes:
                self._on.setdefault(n, []).append(job_id)
                self._pool[n] = pool

    def set_order(self, order: Sequence[str]) -> None:
        """Plan the round-robin order: ``order`` lists job ids (queued or not yet added; unknown
        ids are allowed, a duplicate keeps its first place). Takes effect at once for every
        pending turn; a node held by a running phase stays held until it ends. Source: RollMux
        §4.3, in the order the admission SLO check simulated (§4.2 Alg. 1 line 10)."""
        rank: dict[str, int] = {}
        for j in order:
            rank.setdefault(j, len(rank))
        self._rank = rank

    @property
    def planned_order(self) -> tuple[str, ...]:
        """The planned round-robin order (:meth:`set_order`), empty if none was set."""
        return tuple(self._rank)

    def remove_job(self, job_id: str) -> None:
        """Drop ``job_id`` from every queue (departure or failure). Raises KeyError if unknown."""
        job = self._jobs.pop(job_id)
        for n in job.rollout_nodes + job.train_nodes:
            q = self._on[n]
            q.remove(job_id)
            if not q:
                del self._on[n], self._pool[n]
                self._served.pop(n, None)

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(self._jobs)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._on)

    def queue(self, node: str) -> tuple[str, ...]:
        """The node's queue from its head, one full round (KeyError for an unknown node)."""
        order = self._order(node)
        h = self._holder(node)
        if h is not None:
            order.remove(h)
            order.insert(0, h)
        return tuple(order)

    def head(self, node: str) -> Optional[str]:
        """The job at the head of ``node``'s queue (the holder of the node, else the smallest
        pending turn); None for an unknown node."""
        if node not in self._on:
            return None
        h = self._holder(node)
        if h is not None:
            return h
        pool = self._pool[node]
        return min(self._on[node], key=lambda j: self._turn(j, self._jobs[j], pool))

    def nodes_of(self, job_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(rollout_nodes, train_nodes)`` of ``job_id`` (KeyError if unknown)."""
        j = self._jobs[job_id]
        return j.rollout_nodes, j.train_nodes

    def next_phase(self, job_id: str) -> str:
        """The next phase of the job's current iteration (its rollout until that is done, then
        its training, then its sync). An asynchronous job may also start its next rollouts
        meanwhile (:meth:`next_phases`)."""
        return self._jobs[job_id].next_phase

    def next_phases(self, job_id: str) -> tuple[str, ...]:
        """The phases ``job_id`` may ask for next, one per stream that is not running: its next
        rollout (for a synchronous job only at the start of an iteration) and its training or
        sync. Raises KeyError if unknown."""
        job = self._jobs[job_id]
        if job.max_staleness == 0:
            return () if job.running else (job.next_phase,)
        out = () if job.roll_running else ("rollout",)
        return out + (() if job.train_running else (job.train_next,))

    def iteration(self, job_id: str) -> int:
        """Completed iterations of ``job_id``."""
        return self._jobs[job_id].iteration

    def rollouts(self, job_id: str) -> int:
        """Completed rollouts of ``job_id`` (at most ``k + 1`` ahead of :meth:`iteration`)."""
        return self._jobs[job_id].rollouts

    def max_staleness(self, job_id: str) -> int:
        """The staleness bound ``k`` the job was added with. Raises KeyError if unknown."""
        return self._jobs[job_id].max_staleness

    def is_running(self, job_id: str, phase: Optional[str] = None) -> bool:
        """Whether a phase of ``job_id`` runs (``phase`` given: that phase)."""
        job = self._jobs[job_id]
        return job.running if phase is None else job.running_of(phase)

    # --- scheduling -------------------------------------------------------------------------
    def _nodes_of(self, job: _Job, phase: str) -> tuple[str, ...]:
        return job.rollout_nodes if pool_of_phase(phase) == "rollout" else job.train_nodes

    def _is_ready(self, job_id: str, job: _Job, phase: str) -> bool:
        if phase == "rollout":
            if not job.rollout_due():
                return False
        elif job.train_running or job.train_next != phase:
            return False
        elif phase == "sync":
            return True  # holds the training slot it already heads
        elif job.rollouts <= job.iteration:
            return False  # training i waits for rollout i
        return all(self.head(n) == job_id for n in self._nodes_of(job, phase))

    def _index(self, job: _Job, phase: str) -> int:
        """The iteration index of ``phase``'s next run: the rollout's own index, else the iteration's."""
        return job.rollouts if phase == "rollout" else job.iteration

    def ready(self) -> list[ReadyPhase]:
        """Phases that may start now, in add order (a job's rollout before its training; granting
        one never blocks another)."""
        out = []
        for jid, job in self._jobs.items():
            for ph in ("rollout", job.train_next):
                if self._is_ready(jid, job, ph):
                    out.append(ReadyPhase(jid, ph, pool_of_phase(ph), self._nodes_of(job, ph), self._index(job, ph)))  # type: ignore[arg-type]
        return out

    def grant(self, job_id: str, phase: str) -> ReadyPhase:
        """Start ``phase`` of ``job_id``. Raises ValueError if it is not ready."""
        job = self._jobs[job_id]
        if phase not in _NEXT or not self._is_ready(job_id, job, phase):
            raise ValueError(f"phase {phase!r} of job {job_id!r} is not ready (next: {job.next_phase}, running: {job.running})")
        pool = pool_of_phase(phase)
        if phase != "sync":
            turn = self._turn(job_id, job, pool)
            for n in self._nodes_of(job, phase):
                self._served[n] = turn
        if phase == "rollout":
            job.roll_running = True
            job.released = False
        else:
            job.train_running = True
        return ReadyPhase(job_id, phase, pool, self._nodes_of(job, phase), self._index(job, phase))  # type: ignore[arg-type]

    def waiting_for(self, job_id: str) -> tuple[str, ...]:
        """Jobs that wait for ``job_id``'s rollout nodes: next in FIFO order after it on one of
        them, with their previous phase done (next phase rollout, not running). Long-tail
        migration acts only when this is non-empty (nobody waits: nothing to free the nodes for).
        Raises KeyError if unknown. Source: RollMux §4.3 "Long-tail migration"."""
        job = self._jobs[job_id]
        out: list[str] = []
        for n in job.rollout_nodes:
            q = self.queue(n)
            if q[0] != job_id or len(q) < 2:
                continue
            k = q[1]
            if k in out:
                continue
            if self._jobs[k].rollout_due():
                out.append(k)
        return tuple(out)

    def release(self, job_id: str) -> None:
        """Long-tail migration: the running rollout of ``job_id`` stops blocking its nodes' queues.

        Raises ValueError unless the job's rollout is running and not yet released.
        Source: RollMux §4.3 "Long-tail migration".
        """
        job = self._jobs[job_id]
        if not job.roll_running or job.released:
            raise ValueError(f"job {job_id!r} has no running, unreleased rollout")
        job.released = True

    def abort(self, job_id: str, phase: str) -> None:
        """The running ``phase`` of ``job_id`` was interrupted (the worker running it was lost):
        the job is no longer running and its next phase stays ``phase``, at the same turn, so the
        phase is granted again (redone from its start) as soon as it is ready. Its nodes' turns
        already served stay served: the redo does not wait a round.

        Raises ValueError if that phase is not running, KeyError for an unknown job."""
        job = self._jobs[job_id]
        if not job.running_of(phase):
            raise ValueError(f"phase {phase!r} of job {job_id!r} is not running (next: {job.next_phase}, running: {job.running})")
        if phase == "rollout":
            job.roll_running = False
            job.released = False
        else:
            job.train_running = False

    def on_phase_done(self, job_id: str, phase: str, now: Optional[float] = None) -> list[ReadyPhase]:
        """Record that ``phase`` of ``job_id`` finished (``now`` unused by the policy, kept for
        the runtime's logs); returns the phases ready afterwards.

        Raises ValueError if that phase is not running.
        """
        job = self._jobs[job_id]
        if not job.running_of(phase):
            raise ValueError(f"phase {phase!r} of job {job_id!r} is not running (next: {job.next_phase}, running: {job.running})")
        if phase == "rollout":
            job.roll_running = False
            job.released = False
            job.rollouts += 1
        else:
            job.train_running = False
            if phase == "train" and job.has_sync:
                job.train_next = "sync"
            else:  # sync done, or training done for a job without a sync phase: its turn ends
                self._end_turn(job_id)
        return self.ready()

    def resume(self, job_id: str, phase: str, iteration: Optional[int] = None) -> bool:
        """A restarted controller learns where ``job_id`` is in its meta-iteration from its
        driver: ``phase`` is the job's next phase; ``iteration``: its completed iterations (the
        job's turns are kept, only its count is the driver's). A job resuming at ``train`` /
        ``sync`` already ran this meta-iteration's rollout: its training turn becomes the one
        before its next rollout turn (so it heads its training nodes once they are free), and at
        ``sync`` it holds them. Returns False (nothing changed; ask again once a phase ends) while
        another job's phase holds one of its training nodes. Raises ValueError while a phase of
        the job runs or for a phase it cannot resume at, KeyError for an unknown job."""
        job = self._jobs[job_id]
        if phase not in _NEXT or (phase == "sync" and not job.has_sync):
            raise ValueError(f"job {job_id!r} cannot resume at phase {phase!r}")
        if job.max_staleness > 0:
            return self._resume_async(job_id, job, phase, iteration)
        if job.running:
            raise ValueError(f"job {job_id!r} has a phase running; it cannot be resumed elsewhere")
        if phase != "rollout" and any(self._holder(n) not in (None, job_id) for n in job.train_nodes):
            return False
        old_next = job.next_phase
        if iteration is not None:
            it = max(0, int(iteration))
            job.base += job.iteration - it  # same turns, the driver's count
            job.iteration = it
        if phase != "rollout" and old_next == "rollout":
            job.base -= 1  # this meta-iteration's rollout is done: its training turn precedes the next rollout's
        elif phase == "rollout" and old_next != "rollout":
            job.base += 1
        job.rollouts = job.iteration if phase == "rollout" else job.iteration + 1
        job.train_next = "train" if phase == "rollout" else phase
        job.released = False
        return True

    def _resume_async(self, job_id: str, job: _Job, phase: str, iteration: Optional[int]) -> bool:
        """:meth:`resume` of an asynchronous job: each stream is resumed on its own request.
        A rollout ``r`` (the driver asks for it only once sync ``r - k - 1`` has ended there)
        sets the rollout count to ``r`` and the iteration count to at least ``r - k``; a training
        / sync of iteration ``i`` sets the iteration count to ``i`` and the rollout count to at
        least ``i + 1``. The turns keep one base, so the order argument of the module holds."""
        if job.running_of("rollout" if phase == "rollout" else job.train_next) or \
                (phase != "rollout" and job.train_running):
            raise ValueError(f"job {job_id!r} has a {phase} running; it cannot be resumed elsewhere")
        if phase != "rollout" and any(self._holder(n) not in (None, job_id) for n in job.train_nodes):
            return False
        if iteration is None:
            return phase == "rollout" or phase == job.train_next
        it = max(0, int(iteration))
        if phase == "rollout":
            job.rollouts = it
            job.iteration = max(job.iteration, it - job.max_staleness)
            job.released = False
        else:
            job.iteration = it
            job.train_next = phase
            job.rollouts = max(job.rollouts, it + 1)
        return True

    def has_sync(self, job_id: str) -> bool:
        """Whether ``job_id`` has a sync phase. Raises KeyError if unknown."""
        return self._jobs[job_id].has_sync

    def set_has_sync(self, job_id: str, has_sync: bool) -> None:
        """Declare whether ``job_id`` has a sync phase. A job without one ends its turn on the
        training nodes when training finishes (also if it is waiting for its sync slot now).
        Raises KeyError if unknown."""
        job = self._jobs[job_id]
        job.has_sync = bool(has_sync)
        if not job.has_sync and job.train_next == "sync" and not job.train_running:
            self._end_turn(job_id)

    def _end_turn(self, job_id: str) -> None:
        job = self._jobs[job_id]
        job.train_next = "train"
        job.iteration += 1
