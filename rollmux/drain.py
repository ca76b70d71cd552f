"""Drains: a job the policy's table took off some nodes still runs there until it has stopped.

The table changes at once (one committed decision), the runtime at the job's iteration boundary:
a job *preempted* for a higher class (:mod:`rollmux.preemption`) or *moved* to another group by
departure re-packing, neighbourhood re-optimisation or the SLO watch
(:mod:`rollmux.admission.repack`) keeps its queue slots in its old group until its iteration's
last phase was released, and its state stays on its old workers until its driver exported it.
Meanwhile another group's member may already hold those nodes in the table. Each such change is
a :class:`Drain` of the job off its old group's nodes, and until the drain is complete every
member of *another* group is fenced off those nodes (:func:`fenced_nodes`: its controller grants
it no phase there). The steps, as the GlobalScheduler records them (it alone writes them, in the
job's record: the preemption entry or the :class:`rollmux.records.MoveRecord`; :func:`step`):

1. **stopped**: the old group's controller removed the job at its iteration boundary (or at once
   when it was between iterations): no phase of it runs there any more
   (``rollmux.group_ledger.GroupLedger.remove`` reports ``stopped`` with its group).
2. **drained**: its nodes are free: its driver exported its state from the old workers
   (``drained``: a moved job's driver before it registers on its new workers, a preempted job's
   before it waits to be re-admitted); or a failure / end report of the job (its controller evicted
   it, its driver ended: nothing of it runs); or :func:`drain_overdue` (its driver never said so);
   or at once when nothing of it ran there (its old group never had a controller, or the job had
   not started: ``admitted``, no driver registered it).

The moved job itself is never fenced by its own drain (a job's phases run one after another from
its one driver, and its new placement may keep some of its old nodes). Inside the old group no
fence is needed either: its round-robin queues serialise the phases on each node, and the job holds
its slots until its boundary (a fence there would deadlock: the member waiting at a node's head,
the leaving job behind it).

The two bounds are settings (``SchedulerConfig.drain_grace_s`` / ``drain_max_s``, defaults
:data:`DRAIN_GRACE_S` / :data:`DRAIN_MAX_S`) in the cluster's own time: on emulated accelerators a
modelled second lasts the time factor (:func:`rollmux.emulation.scheduler_config` scales them), so
an emulated cluster waits for a lost report what a real one would, not 25x longer.

Pure rules, no Ray; times are Unix seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rollmux.records import JobRecord, MoveRecord

__all__ = ["DRAIN_GRACE_S", "DRAIN_MAX_S", "Drain", "drain_overdue", "drains_of", "fenced_nodes", "move_drain",
           "preemption_drain", "step"]

#: default of ``drain_grace_s``: how long after a job stopped (its old group's controller removed it
#: at its iteration boundary) its driver has to report its state exported before its nodes count
#: as drained anyway, s (the
#: driver died or hangs between phases; two driver leases, ``rollmux.group_ledger.DEFAULT_LEASE_S``)
DRAIN_GRACE_S = 60.0

#: default of ``drain_max_s``: how long after the decision a drain whose stop was never reported
#: counts as drained anyway, s
#: (the ``stopped`` report is fire and forget: lost with a scheduler restart at that moment while
#: the driver died too, no other report comes). Longer than one iteration of the jobs we schedule,
#: so it only bounds a wait that would otherwise never end.
DRAIN_MAX_S = 1800.0


@dataclass(frozen=True)
class Drain:
    """One job taken off ``nodes`` of group ``group_id`` by the table (``kind``: ``"preempted"``
    or ``"moved"``) at ``at_s``; ``stopped_at_s`` / ``drained_at_s`` (None until then) and
    ``drained`` (how: ``"exported"``, ``"no driver"``, ``"not started"``, ``"driver lost: ..."``,
    ``"its driver ended"``, ``"overdue: ..."``) as in the module docstring. Unix seconds."""

    job_id: str
    kind: str
    group_id: Optional[str]
    nodes: tuple[str, ...]
    at_s: float
    stopped_at_s: Optional[float] = None
    drained_at_s: Optional[float] = None
    drained: Optional[str] = None

    @property
    def draining(self) -> bool:
        """Its nodes are not drained yet (one without nodes, e.g. written before drains were
        kept, has nothing to drain)."""
        return self.drained_at_s is None and bool(self.nodes)


def drains_of(rec: "JobRecord") -> list[Drain]:
    """Every drain a job record keeps: its preemptions' (in order), then its moves'."""
    return [preemption_drain(rec.job_id, d) for d in rec.preemptions] + [move_drain(rec.job_id, m) for m in rec.moves]


def preemption_drain(job_id: str, entry: dict) -> Drain:
    """The drain of one preemption (a :class:`rollmux.preemption.PreemptionRecord` dict): off
    ``nodes`` of ``group_id``."""
    from rollmux.preemption import PreemptionRecord

    p = PreemptionRecord.from_dict(entry)
    return Drain(job_id, "preempted", p.group_id, p.nodes, p.at_s, p.stopped_at_s, p.drained_at_s, p.drained)


def move_drain(job_id: str, m: "MoveRecord") -> Drain:
    """The drain of one move (:class:`rollmux.records.MoveRecord`): off ``from_nodes`` of ``from_group``."""
    return Drain(job_id, "moved", m.from_group, tuple(m.from_nodes), float(m.at or 0.0), m.stopped_at_s,
                 m.drained_at_s, m.drained)


def step(d: Drain, now: float, *, stopped: bool = False, drained: Optional[str] = None) -> dict:
    """The drain fields that change when ``d`` takes a step at ``now`` (Unix s): ``stopped``
    sets ``stopped_at_s`` once; ``drained`` (how) sets ``drained_at_s`` and ``drained`` (and the
    stop, if none was reported). ``{}`` when nothing changes (a complete drain never does)."""
    if not d.draining:
        return {}
    out: dict = {}
    if (stopped or drained is not None) and d.stopped_at_s is None:
        out["stopped_at_s"] = now
    if drained is not None:
        out["drained_at_s"], out["drained"] = now, drained
    return out


def fenced_nodes(draining: Iterable[Drain], group_id: str, nodes: Iterable[str],
                 job_id: Optional[str] = None) -> tuple[str, ...]:
    """The nodes among ``nodes`` (those of member ``job_id`` of group ``group_id``) on which that
    member may not start a phase yet: the nodes of a drain still in progress that left *another*
    group and is not the member's own (module docstring). Order: as ``nodes``."""
    held = {n for d in draining if d.draining and d.group_id != group_id and d.job_id != job_id for n in d.nodes}
    return tuple(n for n in dict.fromkeys(nodes) if n in held)


def drain_overdue(d: Drain, now_s: float, grace_s: float = DRAIN_GRACE_S,
                  max_s: float = DRAIN_MAX_S) -> Optional[str]:
    """Why ``d``'s nodes count as drained at ``now_s`` (Unix s) although no report said so, or
    None: it stopped (none of its phases runs there) more than ``grace_s`` seconds ago; or no stop
    was reported within ``max_s`` seconds of the decision. Before that it never is: a phase
    running always ends with a release, and a job whose driver died is evicted by its controller's
    lease (reported as a failure, which drains it)."""
    if not d.draining:
        return None
    if d.stopped_at_s is None:
        if now_s - d.at_s <= max_s:
            return None
        return f"overdue: no stop at its iteration boundary was reported within {max_s:g} s of the decision"
    if now_s - d.stopped_at_s <= grace_s:
        return None
    return (f"overdue: its driver did not report its state exported within {grace_s:g} s of its stop "
            "at its iteration boundary")
