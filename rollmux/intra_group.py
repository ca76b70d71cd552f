"""Intra-group schedule: round-robin meta-iterations simulated on phase times (RollMux §4.3).

:func:`simulate_group` drives :class:`rollmux.round_robin.RoundRobinQueues` with simulated time
and returns a :class:`GroupSchedule`: the timeline (one :class:`PhaseRecord` per phase and node),
each job's steady-state co-execution iteration time ``t_coexec_s``, the meta-iteration time and
per-pool busy / bubble fractions. The admission SLO check (Alg. 1 line 10) calls it on worst-case
profiles; the simulator's ``--stochastic`` mode passes per-iteration :class:`IterationTimes`
(with ``t_trigger_s``) and a :class:`LongTailPolicy` to model long-tail migration.

The group-level quantities of saturation pruning (RollMux §4.2: ``T_cycle(G) = max_j T_solo_j``,
``T_load(G)`` = the busiest node's pinned phase times, rollout nodes: rollouts, training nodes:
training + sync, which holds the training slot) are the policy's, computed once in
:func:`rollmux.admission.groups.summarise_group` and compared by :func:`rollmux.admission.is_saturated`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Mapping, Optional, Sequence, Union

from rollmux.models import CoExecutionGroup, GroupMember, PhaseProfile
from rollmux.occupancy import BusyCurve
from rollmux.round_robin import RoundRobinQueues


@dataclass(frozen=True)
class IterationTimes:
    """One iteration's realised phase times, seconds.

    ``t_trigger_s`` (optional, relative to the rollout's start): when the trigger fraction of
    the rollout's responses is done, i.e. when long-tail migration may fire.
    ``tail_load`` (optional, >= 0): the unfinished responses at the trigger as a fraction of the
    job's concurrent decode slots over all its rollout GPUs (``None``: ``1 - trigger_fraction``,
    i.e. a rollout that started with every slot full). It sets how much the tail stretches
    when its stragglers are packed onto fewer GPUs (:meth:`LongTailPolicy.tail_stretch`).
    """

    t_roll_s: float
    t_train_s: float
    t_sync_s: float = 0.0
    t_trigger_s: Optional[float] = None
    tail_load: Optional[float] = None

    def __post_init__(self) -> None:
        for name in ("t_roll_s", "t_train_s", "t_sync_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if self.t_trigger_s is not None and not (0 <= self.t_trigger_s <= self.t_roll_s):
            raise ValueError(f"t_trigger_s must lie in [0, t_roll_s={self.t_roll_s}], got {self.t_trigger_s}")
        if self.tail_load is not None and not (self.tail_load >= 0 and math.isfinite(self.tail_load)):
            raise ValueError(f"tail_load must be a finite number >= 0, got {self.tail_load}")

    @property
    def t_solo_s(self) -> float:
        """This iteration run alone, s: ``t_roll_s + t_train_s + t_sync_s`` (as :attr:`PhaseProfile.t_solo_s`)."""
        return self.t_roll_s + self.t_train_s + self.t_sync_s


@dataclass(frozen=True)
class PhaseRecord:
    """One phase of one job on one node: ``[start_s, end_s)`` of meta-iteration ``iteration``.

    ``gpus``: GPUs of ``node`` the phase uses (``None``: the whole node); after long-tail
    migration the tail's record holds only the tail GPUs. Busy / bubble ratios are computed from
    these records by :func:`rollmux.occupancy.occupancy`.
    """

    job_id: str
    phase: str
    pool: str
    node: str
    iteration: int
    start_s: float
    end_s: float
    gpus: Optional[float] = None


@dataclass(frozen=True)
class LongTailPolicy:
    """Long-tail migration (RollMux §4.3, Fig. 7).

    When ``trigger_fraction`` of a rollout's responses are done *and another member of the group
    waits for the rollout's nodes* (:meth:`rollmux.round_robin.RoundRobinQueues.waiting_for`),
    its unfinished responses are consolidated onto ``tail_gpus`` GPUs of the job and the other
    GPUs are released to the waiting rollout; nobody waiting, nothing moves (a lone job never
    pays the overhead). The migration costs ``migration_overhead_s`` (re-prefill of the
    stragglers' context), added to the migrated rollout's end, and the tail stretches with the
    stragglers packed per tail GPU (:meth:`tail_stretch`), so an early trigger that packs many
    stragglers onto few GPUs lengthens the job's rollout. While the tail runs, a rollout
    started on the same nodes progresses at the freed fraction of the nodes' speed.
    """

    trigger_fraction: float = 0.8
    tail_gpus: int = 1
    migration_overhead_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 < self.trigger_fraction <= 1.0:
            raise ValueError(f"trigger_fraction must be in (0, 1], got {self.trigger_fraction}")
        if self.tail_gpus < 1:
            raise ValueError(f"tail_gpus must be >= 1, got {self.tail_gpus}")
        if self.migration_overhead_s < 0:
            raise ValueError(f"migration_overhead_s must be >= 0, got {self.migration_overhead_s}")

    def should_migrate(self, done_responses: int, total_responses: int) -> bool:
        """True once the rollout is tail-bound (``done/total >= trigger_fraction``) and unfinished
        responses remain; used by the GroupController on progress reports."""
        if total_responses <= 0:
            return False
        return done_responses < total_responses and done_responses >= self.trigger_fraction * total_responses

    def split_workers(self, workers: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(tail_workers, freed_workers)``: the first ``tail_gpus`` workers keep the stragglers."""
        k = max(1, min(self.tail_gpus, len(workers)))
        return tuple(workers[:k]), tuple(workers[k:])

    def held_fraction(self, job_gpus: int) -> float:
        """Fraction of the job's rollout capacity kept by the tail."""
        return min(1.0, self.tail_gpus / max(1, job_gpus))

    def tail_stretch(self, job_gpus: int, tail_load: Optional[float] = None, tail_gpus: Optional[int] = None) -> float:
        """Factor (>= 1) by which the rest of a migrated rollout lengthens.

        A GPU decodes up to its share of the job's concurrent slots at full per-token speed
        (decode is memory-bound); more stragglers than that share make it throughput-bound. With
        ``tail_load`` = unfinished responses / the job's slots (default ``1 - trigger_fraction``)
        the ``k`` tail GPUs (default ``tail_gpus``) carry ``tail_load * job_gpus / k`` of a GPU's
        share: stretch = ``max(1, tail_load * job_gpus / k)``. Source: RollMux §4.3 Fig. 7
        (stragglers consolidated onto few GPUs); the fluid model of
        :func:`rollmux.profiler.sample_iteration`.
        """
        load = (1.0 - self.trigger_fraction) if tail_load is None else tail_load
        k = max(1, min(self.tail_gpus if tail_gpus is None else tail_gpus, job_gpus))
        return max(1.0, load * max(1, job_gpus) / k)

    def plan_tail(self, job_gpus: int, remaining_s: float, slack_s: float,
                  tail_load: Optional[float] = None) -> Optional[tuple[int, float]]:
        """Tail GPUs and stretch of a migration: ``(k, stretch)`` or None (do not migrate).

        The tail starts on ``tail_gpus`` GPUs; while the stretched rest of the rollout
        (``remaining_s * (stretch - 1)``) would exceed ``slack_s`` (what admission planned for
        this rollout beyond its realised length: worst-case length - realised length), the tail
        keeps one more GPU. None when the tail would need all of the job's GPUs (nothing to free).
        A migration thus never makes the rollout end later than admission planned it
        (worst case + ``migration_overhead_s``), which keeps the SLO check sound."""
        for k in range(max(1, self.tail_gpus), max(1, job_gpus)):
            st = self.tail_stretch(job_gpus, tail_load, k)
            if remaining_s * (st - 1.0) <= max(0.0, slack_s) + 1e-9:
                return k, st
        return None

    def worthwhile(self, t_roll_s: float, t_trigger_s: Optional[float]) -> bool:
        """Migrate only if the tail lasts longer than the migration overhead."""
        return t_trigger_s is not None and t_trigger_s + self.migration_overhead_s < t_roll_s


@dataclass
class GroupSchedule:
    """Result of :func:`simulate_group`.

    Attributes:
        timeline: phase records (empty when ``record_timeline=False``).
        t_coexec_s: per job, mean iteration time over the steady-state window (seconds).
        t_coexec_max_s: per job, the longest single iteration in that window.
        t_solo_s: per job, solo iteration time of its planning profile.
        t_meta_s: meta-iteration time = max_j t_coexec_s (every member iterates once per meta-iteration).
        busy_fraction / bubble_fraction: per pool (``"rollout"``, ``"train"``), GPU-time fraction
            busy / idle over the steady-state window ``window_s`` (:func:`rollmux.occupancy.occupancy`
            on the records: GPU-weighted, union of busy intervals).
        lifetime_busy_fraction: the same over the whole simulated run ``[0, horizon_s]``
            (warm-up and drain included).
        busy_curve: :class:`rollmux.occupancy.BusyCurve` of the run (cumulative busy GPU-seconds).
        iterations: completed iterations per job; horizon_s: end of the simulation.
    """

    timeline: list[PhaseRecord]
    t_coexec_s: dict[str, float]
    t_coexec_max_s: dict[str, float]
    t_solo_s: dict[str, float]
    t_meta_s: float
    busy_fraction: dict[str, float]
    bubble_fraction: dict[str, float]
    iterations: dict[str, int]
    horizon_s: float
    window_s: tuple[float, float] = (0.0, 0.0)
    migrations: int = 0
    lifetime_busy_fraction: dict[str, float] = field(default_factory=dict)
    busy_curve: Optional[BusyCurve] = None

    def slowdown(self, job_id: str) -> float:
        """``t_coexec / t_solo`` of ``job_id`` (KeyError if unknown)."""
        return self.t_coexec_s[job_id] / self.t_solo_s[job_id]

    @property
    def slowdowns(self) -> dict[str, float]:
        return {j: self.slowdown(j) for j in self.t_coexec_s}


def _members_of(g: Union[CoExecutionGroup, Sequence[GroupMember]]) -> Sequence[GroupMember]:
    return g.members if isinstance(g, CoExecutionGroup) else g


# --- simulation ----------------------------------------------------------------------------------

TimesFn = Callable[[str, int], Union[IterationTimes, PhaseProfile]]


def _times_fn(members: Sequence[GroupMember], phase_times) -> TimesFn:
    prof = {m.spec.job_id: m.profile for m in members}
    if phase_times is None:
        return lambda j, i: prof[j]
    if callable(phase_times):
        return phase_times
    table: Mapping[str, Sequence] = phase_times

    def f(j: str, i: int):
        seq = table.get(j)
        return seq[i % len(seq)] if seq else prof[j]

    return f


def _finish(start: float, dur: float, tails: list[tuple[float, float]]) -> float:
    """End of a phase of full-speed length ``dur`` started at ``start`` while long tails hold
    fractions of the node until their ends (``tails``: (end, held_fraction))."""
    t, left = start, dur
    for end, _ in sorted(x for x in tails if x[0] > start):
        rate = max(0.05, 1.0 - sum(f for e, f in tails if e > t))
        if left <= (end - t) * rate:
            return t + left / rate
        left -= (end - t) * rate
        t = end
    return t + left


def simulate_group(
    members: Union[CoExecutionGroup, Sequence[GroupMember]],
    meta_iterations: Optional[int] = None,
    phase_times: Union[None, TimesFn, Mapping[str, Sequence[Union[IterationTimes, PhaseProfile]]]] = None,
    long_tail: Optional[LongTailPolicy] = None,
    *,
    record_timeline: bool = True,
    max_events: int = 1_000_000,
    gpus_per_node: Optional[Mapping[str, float]] = None,
) -> GroupSchedule:
    """Simulate the round-robin meta-iterations of a group (RollMux §4.3, Alg. 1 line 10).

    Args:
        members: group members in admission (= round-robin) order, or a CoExecutionGroup.
        meta_iterations: iterations every job completes (default :func:`steady_horizon` of the
            members' planning profiles: ``2n + 4`` for ``n`` members unless the schedule is still
            in its transient there); ``t_coexec_s`` averages over the second half (the steady state).
        phase_times: per-iteration times: ``None`` (each member's profile, deterministic), a
            callable ``(job_id, iteration) -> IterationTimes | PhaseProfile`` or a mapping
            ``job_id -> sequence`` (cycled).
        long_tail: enable long-tail migration for iterations whose times carry ``t_trigger_s``.
        record_timeline: False leaves ``timeline`` empty (records are still used for the ratios).
        gpus_per_node: ``{"rollout": G_r, "train": G_t}`` GPUs per node of each pool: records then
            carry the GPUs each job uses per node (its GPUs spread evenly over its nodes) and the
            busy fractions are GPU-weighted; ``None`` counts whole nodes.
    Returns:
        GroupSchedule. Raises ValueError on an empty group, duplicate job ids or
        ``meta_iterations < 2``; RuntimeError if the queues deadlock or ``max_events`` is hit.
    """
    members = list(_members_of(members))
    if not members:
        raise ValueError("simulate_group needs at least one member")
    n = len(members)
    m_it = steady_meta_iterations(members) if meta_iterations is None else int(meta_iterations)
    if m_it < 2:
        raise ValueError(f"meta_iterations must be >= 2, got {m_it}")
    times = _times_fn(members, phase_times)
    q = RoundRobinQueues()
    gpus: dict[str, int] = {}
    for mb in members:
        q.add_job(mb.spec.job_id, mb.placement.rollout_nodes, mb.placement.train_nodes, has_sync=True)
        gpus[mb.spec.job_id] = mb.spec.num_rollout_gpus
    if len(gpus) != n:
        raise ValueError("duplicate job ids in group")
    pool_nodes = {"rollout": set(), "train": set()}
    for mb in members:
        pool_nodes["rollout"].update(mb.placement.rollout_nodes)
        pool_nodes["train"].update(mb.placement.train_nodes)

    timeline: list[PhaseRecord] = []
    open_roll: dict[str, list[int]] = {}  # job -> indices in timeline of its running rollout's records

    def gpus_on_node(j: str, pool: str, k: int) -> Optional[float]:
        if gpus_per_node is None:
            return None
        mb = by_id[j]
        g = mb.spec.num_rollout_gpus if pool == "rollout" else mb.spec.num_train_gpus
        return min(float(gpus_per_node[pool]), g / k)

    by_id = {mb.spec.job_id: mb for mb in members}
    done_at: dict[str, list[float]] = {j: [0.0] for j in gpus}
    cur: dict[str, IterationTimes] = {}
    tails: dict[str, list[tuple[float, float]]] = {}
    rollout_end: dict[str, tuple[float, int]] = {}  # job -> (end of its running rollout, heap key)
    held_gpus: dict[str, int] = {}  # job -> GPUs its migrated tail keeps
    heap: list[tuple[float, int, str, str]] = []
    seq = 0
    now = 0.0
    migrations = 0

    def start_ready(ready: Optional[list] = None) -> None:
        """Grant the ready phases (``ready``: a list ``q`` just returned, else ``q.ready()``)."""
        nonlocal seq, migrations
        for rp in q.ready() if ready is None else ready:
            j, ph = rp.job_id, rp.phase
            if ph == "rollout":
                if q.iteration(j) >= m_it and min(len(v) - 1 for v in done_at.values()) >= m_it:
                    continue
                it = times(j, q.iteration(j))
                if isinstance(it, PhaseProfile):
                    it = IterationTimes(it.t_roll_s, it.t_train_s, it.t_sync_s)
                cur[j] = it
                ts = [x for nd in rp.nodes for x in tails.get(nd, ()) if x[0] > now]
                end = _finish(now, it.t_roll_s, ts) if ts else now + it.t_roll_s
                rollout_end[j] = (end, seq)
                if (long_tail is not None and gpus[j] > long_tail.tail_gpus
                        and long_tail.worthwhile(it.t_roll_s, it.t_trigger_s)):
                    heapq.heappush(heap, (now + it.t_trigger_s, seq, j, "trigger"))
            else:
                it = cur[j]
                end = now + (it.t_train_s if ph == "train" else it.t_sync_s)
            q.grant(j, ph)
            heapq.heappush(heap, (end, seq, j, ph))
            seq += 1
            if ph == "rollout":
                open_roll[j] = list(range(len(timeline), len(timeline) + len(rp.nodes)))
            gk = gpus_on_node(j, rp.pool, len(rp.nodes))
            for nd in rp.nodes:
                timeline.append(PhaseRecord(j, ph, rp.pool, nd, rp.iteration, now, end, gk))

    start_ready()
    events = 0
    while heap:
        events += 1
        if events > max_events:
            raise RuntimeError(f"simulate_group: more than {max_events} events")
        now, key, j, ph = heapq.heappop(heap)
        if ph == "trigger":
            # the trigger fraction of j's responses is done: migrate only if another member waits
            # for j's rollout nodes (RollMux §4.3); the tail then stretches with the stragglers
            # packed per tail GPU and pays the migration overhead
            end, tok = rollout_end.get(j, (None, None))
            plan = None
            if tok == key and q.is_running(j) and q.next_phase(j) == "rollout" and q.waiting_for(j):
                it = cur[j]
                plan = long_tail.plan_tail(gpus[j], end - now, by_id[j].profile.t_roll_s - it.t_roll_s,  # type: ignore[union-attr]
                                           it.tail_load)
            if plan is not None:
                lt = long_tail  # type: ignore[assignment]
                held_gpus[j], stretch = plan
                new_end = now + lt.migration_overhead_s + (end - now) * stretch
                rollout_end[j] = (new_end, seq)
                heapq.heappush(heap, (new_end, seq, j, "rollout"))
                seq += 1
                heapq.heappush(heap, (now + lt.migration_overhead_s, seq, j, "release"))
                seq += 1
                migrations += 1
                for i in open_roll.get(j, ()):  # the rollout's records end at the (new) end of its tail
                    r = timeline[i]
                    timeline[i] = PhaseRecord(r.job_id, r.phase, r.pool, r.node, r.iteration, r.start_s, new_end, r.gpus)
            continue
        if ph == "rollout" and rollout_end.get(j, (None, key))[1] != key:
            continue  # superseded by the migrated tail's end
        if ph == "release":
            if q.next_phase(j) == "rollout" and q.is_running(j):
                q.release(j)
                held = min(1.0, held_gpus.get(j, 1) / max(1, gpus[j]))
                end = rollout_end[j][0]
                for nd in q.nodes_of(j)[0]:
                    tails.setdefault(nd, []).append((end, held))
                for i in open_roll.get(j, ()):  # the tail keeps only its GPUs from now on
                    r = timeline[i]
                    g = (gpus_per_node["rollout"] if gpus_per_node is not None else 1.0) if r.gpus is None else r.gpus
                    timeline[i] = PhaseRecord(r.job_id, r.phase, r.pool, r.node, r.iteration, r.start_s, now, r.gpus)
                    timeline.append(PhaseRecord(r.job_id, r.phase, r.pool, r.node, r.iteration, now, r.end_s, g * held))
            start_ready()
        else:
            ready = q.on_phase_done(j, ph, now)
            if ph == "sync":
                done_at[j].append(now)
            start_ready(ready)
        if all(len(v) - 1 >= m_it for v in done_at.values()) and not any(p in ("train", "sync") for _, _, _, p in heap):
            break
    if any(len(v) - 1 < m_it for v in done_at.values()):
        raise RuntimeError("simulate_group: round-robin queues deadlocked")  # pragma: no cover

    h = m_it // 2
    t_co, t_co_max = {}, {}
    for j, c in done_at.items():
        t_co[j] = (c[m_it] - c[h]) / (m_it - h)
        t_co_max[j] = max(c[i + 1] - c[i] for i in range(h, m_it))
    ref = done_at[members[0].spec.job_id]  # (m_it - h) whole periods of the steady state
    w0, w1 = ref[h], ref[m_it]
    cap = {p: {nd: (float(gpus_per_node[p]) if gpus_per_node is not None else 1.0) for nd in pool_nodes[p]}
           for p in ("rollout", "train")}
    curve = BusyCurve(timeline, cap)
    steady, life = curve.occupancy((w0, w1)), curve.occupancy((0.0, now))
    busy_frac = {p: o.busy_ratio for p, o in steady.items()}
    bubble = {p: o.bubble_ratio for p, o in steady.items()}
    return GroupSchedule(
        timeline=timeline if record_timeline else [],
        t_coexec_s=t_co,
        t_coexec_max_s=t_co_max,
        t_solo_s={mb.spec.job_id: mb.profile.t_solo_s for mb in members},
        t_meta_s=max(t_co.values()),
        busy_fraction=busy_frac,
        bubble_fraction=bubble,
        iterations={j: len(c) - 1 for j, c in done_at.items()},
        horizon_s=now,
        window_s=(w0, w1),
        migrations=migrations,
        lifetime_busy_fraction={p: o.busy_ratio for p, o in life.items()},
        busy_curve=curve,
    )


def steady_schedule(members: Union[CoExecutionGroup, Sequence[GroupMember]], *,
                    gpus_per_node: Optional[Mapping[str, float]] = None,
                    max_cycles: int = 100_000) -> GroupSchedule:
    """The steady state of the deterministic round-robin schedule (planning profiles, no long
    tails) without the event simulation: the fields of :func:`simulate_group` (default
    ``meta_iterations``, ``phase_times=None``, ``long_tail=None``) that describe the schedule up
    to the end of its steady-state window, bit for bit (property-tested): ``t_coexec_s``,
    ``t_coexec_max_s``, ``t_solo_s``, ``t_meta_s``, ``window_s``, ``busy_fraction``,
    ``bubble_fraction`` and ``busy_curve`` on ``[0, window_s[1]]``. The schedule is the
    recurrence of :func:`_rr_recurrence` (every node's FIFO in admission order), run until every
    phase that starts within the window is known; the records of those phases feed the busy
    curve. ``timeline`` is empty, ``iterations`` counts the iterations completed within the
    window, ``horizon_s`` is the window's end and ``lifetime_busy_fraction`` covers ``[0,
    horizon_s]`` (the event simulation also runs the drain after the window). The replay's group
    units use it (:meth:`rollmux.sim.realisation.Realisation.group_unit`).

    Raises ValueError on an empty group or duplicate job ids, RuntimeError past ``max_cycles``.
    Source: RollMux §4.3 (round-robin meta-iterations).
    """
    members = list(_members_of(members))
    n = len(members)
    if n == 0:
        raise ValueError("steady_schedule needs at least one member")
    ids = [mb.spec.job_id for mb in members]
    if len(set(ids)) != n:
        raise ValueError("duplicate job ids in group")
    m_it = steady_meta_iterations(members)
    h = m_it // 2
    nodes: dict[tuple[str, str], int] = {}
    rolls, trains = [], []
    for k, mb in enumerate(members):
        p = mb.profile
        rn = tuple(nodes.setdefault(("rollout", x), len(nodes)) for x in mb.placement.rollout_nodes)
        tn = tuple(nodes.setdefault(("train", x), len(nodes)) for x in mb.placement.train_nodes)
        if gpus_per_node is None:
            gr = gt = None
        else:
            gr = min(float(gpus_per_node["rollout"]), mb.spec.num_rollout_gpus / len(rn))
            gt = min(float(gpus_per_node["train"]), mb.spec.num_train_gpus / len(tn))
        rolls.append((k, p.t_roll_s, rn, gr))
        trains.append((k, p.t_train_s, p.t_sync_s, tn, gt))
    cap = {("rollout" if key[0] == "rollout" else "train", key[1]): (float(gpus_per_node[key[0]]) if gpus_per_node is not None else 1.0)
           for key in nodes}
    node_keys = list(nodes)
    free = [0.0] * len(nodes)
    last = [0.0] * n
    rend = [0.0] * n
    done: list[list[float]] = [[0.0] for _ in range(n)]
    recs: list[tuple[float, int, float, float, Optional[float]]] = []  # (start, node, start, end, gpus)
    w1 = math.inf
    cycle = 0
    while True:
        starts_before = False
        for k, tr, rn, gr in rolls:
            s0 = last[k]
            for x in rn:
                if free[x] > s0:
                    s0 = free[x]
            e = s0 + tr
            for x in rn:
                free[x] = e
                recs.append((s0, x, s0, e, gr))
            rend[k] = e
            starts_before |= s0 < w1
        for k, tt, ts, tn, gt in trains:
            s0 = rend[k]
            for x in tn:
                if free[x] > s0:
                    s0 = free[x]
            et = s0 + tt
            e = et + ts
            for x in tn:
                free[x] = e
                recs.append((s0, x, s0, et, gt))
                recs.append((et, x, et, e, gt))
            last[k] = e
            done[k].append(e)
        cycle += 1
        if cycle == m_it:
            w1 = done[0][m_it]
        if cycle >= m_it and not starts_before:
            break
        if cycle > max_cycles:
            raise RuntimeError(f"steady_schedule: more than {max_cycles} cycles before the window ends")
    w0 = done[0][h]
    deltas: dict[tuple[str, str], list[tuple[float, float]]] = {}
    recs.sort(key=lambda r: r[0])
    for st, x, s0, e, g in recs:
        if st > w1:
            break
        key = node_keys[x]
        g = cap[key] if g is None else g
        if e > s0 and g > 0:
            deltas.setdefault(key, []).extend(((s0, g), (e, -g)))
    pool_caps = {"rollout": {}, "train": {}}
    for (pool, nd), c in cap.items():
        pool_caps[pool][nd] = c
    curve = BusyCurve.from_deltas(deltas, pool_caps)
    t_co = {ids[k]: (c[m_it] - c[h]) / (m_it - h) for k, c in enumerate(done)}
    t_co_max = {ids[k]: max(c[i + 1] - c[i] for i in range(h, m_it)) for k, c in enumerate(done)}
    steady, life = curve.occupancy((w0, w1)), curve.occupancy((0.0, w1))
    return GroupSchedule(
        timeline=[],
        t_coexec_s=t_co,
        t_coexec_max_s=t_co_max,
        t_solo_s={mb.spec.job_id: mb.profile.t_solo_s for mb in members},
        t_meta_s=max(t_co.values()),
        busy_fraction={p: o.busy_ratio for p, o in steady.items()},
        bubble_fraction={p: o.bubble_ratio for p, o in steady.items()},
        iterations={ids[k]: sum(1 for t in c[1:] if t <= w1) for k, c in enumerate(done)},
        horizon_s=w1,
        window_s=(w0, w1),
        migrations=0,
        lifetime_busy_fraction={p: o.busy_ratio for p, o in life.items()},
        busy_curve=curve,
    )


# --- cached steady state for admission ---------------------------------------------------------

def _canonical(members: Sequence[GroupMember], rollout_overhead_s: float = 0.0) -> tuple:
    return coexec_key([(mb.profile.t_roll_s + rollout_overhead_s, mb.profile.t_train_s, mb.profile.t_sync_s,
                        mb.placement.rollout_nodes, mb.placement.train_nodes) for mb in members])


def coexec_key(rows: Sequence[tuple]) -> tuple:
    """The memo key of :func:`coexec_times` for members given in round-robin order as rows
    ``(t_roll_s + rollout overhead, t_train_s, t_sync_s, rollout node ids, training node ids)``:
    node ids renamed 0, 1, ... in order of first use, so groups of the same structure share it."""
    names: dict[str, int] = {}
    key = []
    for tr, tt, ts, rn, tn in rows:
        r = tuple(names.setdefault(x, len(names)) for x in rn)
        t = tuple(names.setdefault(x, len(names)) for x in tn)
        key.append((tr, tt, ts, r, t))
    return tuple(key)


def _rr_cycle(key: tuple, free: list[float], last: list[float], rend: list[float]) -> None:
    """One meta-iteration of the round-robin recurrence, in place: every rollout in admission
    order starts at ``max(its job's last sync end, its rollout nodes' free time)``, then every
    training (+ sync) at ``max(its rollout's end, its training nodes' free time)``. ``free``:
    per node id, ``last``: per job (its last sync end), ``rend``: per job (rollout end), seconds."""
    for k, (tr, _tt, _ts, rn, _tn) in enumerate(key):
        e = last[k]
        for x in rn:
            if free[x] > e:
                e = free[x]
        e = e + tr
        for x in rn:
            free[x] = e
        rend[k] = e
    for k, (_tr, tt, ts, _rn, tn) in enumerate(key):
        e = rend[k]
        for x in tn:
            if free[x] > e:
                e = free[x]
        e = e + tt + ts
        for x in tn:
            free[x] = e
        last[k] = e


def _rr_recurrence(key: tuple, m_it: int) -> tuple[float, ...]:
    """Deterministic round-robin schedule as a recurrence (no events): with every node's FIFO
    order fixed to admission order, rollout ``(c, k)`` starts at ``max(end of k's sync of cycle
    c-1, free time of its rollout nodes)`` and training ``(c, k)`` at ``max(end of its rollout,
    free time of its training nodes)``; processing cycle by cycle, rollouts then trainings, in
    admission order respects every FIFO and dependency edge. Identical to :func:`simulate_group`
    without long tails (property-tested), ~20x cheaper. Returns steady-state t_coexec per job."""
    n = len(key)
    free = [0.0] * (1 + max((x for *_, rn, tn in key for x in rn + tn), default=0))  # node ids are 0..N-1
    last = [0.0] * n
    rend = [0.0] * n
    done: list[list[float]] = [[0.0] for _ in range(n)]
    for _ in range(m_it):
        _rr_cycle(key, free, last, rend)
        for k in range(n):
            done[k].append(last[k])
    h = m_it // 2
    return tuple((c[m_it] - c[h]) / (m_it - h) for c in done)


#: The most meta-iterations :func:`steady_horizon` simulates while it looks for the periodic
#: regime (beyond it the horizon's second-half average stands).
STEADY_MAX_CYCLES = 4096


@lru_cache(maxsize=16384)
def _rr_steady(key: tuple) -> tuple[int, tuple[float, ...]]:
    """The horizon and steady-state ``t_coexec`` per job of a :func:`coexec_key`:
    ``(m, values)``, ``values`` the recurrence of :func:`_rr_recurrence` averaged over
    ``[m // 2, m]`` (the same sums), ``m`` the least horizon of the form below whose window lies
    in the periodic regime.

    The recurrence maps the state ``x(c)`` (every node's free time, every job's last sync end)
    max-plus linearly and homogeneously: ``x(c + 1) = F(x(c))``, ``F(x + a) = F(x) + a``, per
    group of jobs linked by shared nodes. Once ``x(c) - x(c - p)`` is one constant per such
    component, ``x(c - p)`` is an eigenvector of ``F^p`` and the schedule is periodic from
    ``c - p`` on: every job of a component then runs one iteration per ``lambda = (x(c) -
    x(c - p)) / p`` seconds (its meta-iteration), whatever its own phases. A window that starts
    before that point averages a transient: a job whose own iteration is shorter than its
    partners' looks faster for as many cycles as its head start lasts (two jobs sharing one
    training node, own iterations 791 s and 847 s: both run at 847 s, but the first cycles show
    791 s for more than ``2n + 4`` cycles). So ``m = 2n + 4`` (the default, and the answer
    whenever the regime is periodic from ``m // 2`` with a period dividing the window) or else
    ``2H``, ``H`` the first multiple of the period at or after the regime's start, and
    ``STEADY_MAX_CYCLES`` when none is found within it. Source: RollMux §4.3; Baccelli, Cohen,
    Olsder & Quadrat, *Synchronization and Linearity* (1992), ch. 3 (cyclicity of max-plus
    linear systems).
    """
    n = len(key)
    m0 = 2 * n + 4
    h0 = m0 // 2
    nn = 1 + max((x for *_, rn, tn in key for x in rn + tn), default=0)
    parent = list(range(nn))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for *_, rn, tn in key:
        xs = rn + tn
        for x in xs[1:]:
            parent[root(x)] = root(xs[0])
    # state index -> component: nodes 0..nn-1, then job k's last sync end at nn + k
    comp = [root(x) for x in range(nn)] + [root((rn + tn)[0]) for *_, rn, tn in key]
    free = [0.0] * nn
    last = [0.0] * n
    rend = [0.0] * n
    states = [tuple(free + last)]
    p_max = 2 * n + 2

    def cycle() -> None:
        _rr_cycle(key, free, last, rend)
        states.append(tuple(free + last))

    def periodic(c: int, p: int) -> bool:
        a, b = states[c], states[c - p]
        seen: dict[int, float] = {}
        for i, g in enumerate(comp):
            d = a[i] - b[i]
            d0 = seen.setdefault(g, d)
            if abs(d - d0) > 1e-9 * max(1.0, abs(d0)):
                return False
        return True

    def values(m: int) -> tuple[float, ...]:
        h = m // 2
        return tuple((states[m][nn + k] - states[h][nn + k]) / (m - h) for k in range(n))

    for _ in range(m0):
        cycle()
    if any((m0 - h0) % p == 0 and periodic(h0 + p, p) for p in range(1, min(p_max, m0 - h0) + 1)):
        return m0, values(m0)
    m = STEADY_MAX_CYCLES
    for c in range(m0 + 1, STEADY_MAX_CYCLES + 1):
        cycle()
        p = next((p for p in range(1, min(p_max, c) + 1) if periodic(c, p)), None)
        if p is not None:
            h = -(-(c - p) // p) * p
            m = max(m0, 2 * h)
            break
    while len(states) <= m:
        cycle()
    return m, values(m)


def steady_horizon(key: tuple) -> int:
    """The meta-iterations whose second half is the steady state of a :func:`coexec_key`'s
    round-robin schedule (:func:`_rr_steady`): ``2n + 4`` unless the schedule is still in its
    transient there. :func:`simulate_group` and :func:`steady_schedule` run this many by default."""
    return _rr_steady(key)[0]


def steady_meta_iterations(members: Union[CoExecutionGroup, Sequence[GroupMember]], *,
                           rollout_overhead_s: float = 0.0) -> int:
    """:func:`steady_horizon` of a group on its members' planning profiles (their order; every
    rollout ``rollout_overhead_s`` longer, as :func:`coexec_times` plans it): the default
    ``meta_iterations`` of :func:`simulate_group`, and the least a stochastic replay of the group
    should run."""
    return steady_horizon(_canonical(list(_members_of(members)), rollout_overhead_s))


def sampled_meta_iterations(members: Union[CoExecutionGroup, Sequence[GroupMember]], cycle: int) -> int:
    """Meta-iterations for a group whose phase times cycle through ``cycle`` sampled iterations
    per job (a stochastic replay, the SLO watch's prediction): the least multiple of
    ``2 * cycle`` that is at least :func:`steady_meta_iterations`, so that the averaged second
    half is steady and spans whole sample cycles (its mean is the samples' mean, not a biased
    part of them). Raises ValueError when ``cycle < 1``."""
    if cycle < 1:
        raise ValueError(f"cycle must be >= 1, got {cycle}")
    step = 2 * int(cycle)
    return -(-steady_meta_iterations(members) // step) * step


def _coexec_cached(key: tuple) -> tuple[float, ...]:
    return _rr_steady(key)[1]


def coexec_values(key: tuple) -> tuple[float, ...]:
    """Steady-state ``t_coexec_s`` per position of a :func:`coexec_key` (memoised; what
    :func:`coexec_times` returns, without the job ids)."""
    return _coexec_cached(key)


def coexec_times(members: Sequence[GroupMember], *, rollout_overhead_s: float = 0.0) -> dict[str, float]:
    """Steady-state ``t_coexec_s`` per job on the members' planning profiles, memoised on the
    group's structure (profiles and node sharing pattern), so unchanged groups are never
    re-simulated. Used by admission's SLO check (Alg. 1 line 10).

    ``rollout_overhead_s``: run-time time added to the end of every rollout of a co-executed
    group, seconds: with long-tail migration on, a migrated rollout ends ``migration_overhead_s``
    later than its responses do (the stragglers' re-prefill, :class:`LongTailPolicy`), so the
    prediction plans every rollout with it (the worst case: every rollout migrates). A job alone
    has nobody to hand its GPUs to, so a one-member group plans without it; the solo time the
    slowdown is taken against stays the plain profile.
    """
    if not (rollout_overhead_s >= 0 and math.isfinite(rollout_overhead_s)):
        raise ValueError(f"rollout_overhead_s must be a finite number >= 0, got {rollout_overhead_s}")
    members = list(members)
    if len(members) < 2:
        rollout_overhead_s = 0.0
    vals = _coexec_cached(_canonical(members, rollout_overhead_s))
    return {mb.spec.job_id: v for mb, v in zip(members, vals)}
