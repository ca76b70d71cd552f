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

The records and the figures of a schedule are :mod:`rollmux.group_schedule`; the steady state
without events (the recurrence admission and the replay read) is :mod:`rollmux.steady_state`,
re-exported here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Union

from rollmux.group_schedule import GroupSchedule, IterationTimes, PhaseRecord, members_of, staleness_counts
from rollmux.models import CoExecutionGroup, GroupMember, PhaseProfile
from rollmux.occupancy import BusyCurve
from rollmux.round_robin import RoundRobinQueues
from rollmux.staleness import solo_iteration_s
from rollmux.steady_state import (STEADY_MAX_CYCLES, coexec_key, coexec_times, coexec_values, cycled_coexec_times,
                                  sampled_meta_iterations, steady_horizon, steady_meta_iterations, steady_schedule)

__all__ = ["GroupSchedule", "IterationTimes", "LongTailPolicy", "PhaseRecord", "STEADY_MAX_CYCLES", "TimesFn",
           "coexec_key", "coexec_times", "coexec_values", "cycled_coexec_times", "realised_solo_s",
           "sampled_meta_iterations", "simulate_group", "solo_staleness", "steady_horizon", "steady_meta_iterations",
           "steady_schedule"]


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
    members = list(members_of(members))
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
        q.add_job(mb.spec.job_id, mb.placement.rollout_nodes, mb.placement.train_nodes, has_sync=True,
                  max_staleness=mb.profile.max_staleness)
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
    roll_starts: dict[str, list[float]] = {j: [] for j in gpus}
    cur: dict[tuple[str, int], IterationTimes] = {}  # (job, iteration) -> its times (rollout ran, training due)
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
                if rp.iteration >= m_it and min(len(v) - 1 for v in done_at.values()) >= m_it:
                    continue
                it = times(j, rp.iteration)
                if isinstance(it, PhaseProfile):
                    it = IterationTimes(it.t_roll_s, it.t_train_s, it.t_sync_s)
                cur[(j, rp.iteration)] = it
                roll_starts[j].append(now)
                ts = [x for nd in rp.nodes for x in tails.get(nd, ()) if x[0] > now]
                end = _finish(now, it.t_roll_s, ts) if ts else now + it.t_roll_s
                rollout_end[j] = (end, seq)
                if (long_tail is not None and gpus[j] > long_tail.tail_gpus
                        and long_tail.worthwhile(it.t_roll_s, it.t_trigger_s)):
                    heapq.heappush(heap, (now + it.t_trigger_s, seq, j, "trigger"))
            else:
                it = cur[(j, rp.iteration)] if ph == "train" else cur.pop((j, rp.iteration))
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
            if tok == key and q.is_running(j, "rollout") and q.waiting_for(j):
                it = cur[(j, q.rollouts(j))]
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
            if q.is_running(j, "rollout"):
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
    stale = staleness_counts(members, roll_starts, {j: c[1:] for j, c in done_at.items()}, h, m_it)
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
        staleness=stale,
    )


def realised_solo_s(member: GroupMember, its: Sequence[Union[IterationTimes, PhaseProfile]]) -> float:
    """A job's realised solo iteration time over its iterations ``its`` (cycled), seconds: the
    mean of their :attr:`IterationTimes.t_solo_s` for a synchronous job; for an asynchronous one
    (``member.profile.max_staleness >= 1``, whose rollouts overlap its trainings) the mean
    iteration of the job alone on its own nodes, through the same schedule as its group
    (:func:`simulate_group` of the one member). With one iteration it is
    :func:`rollmux.staleness.solo_iteration_s` of it. Raises ValueError on no iterations."""
    its = list(its)
    if not its:
        raise ValueError("realised_solo_s needs at least one iteration")
    k = member.profile.max_staleness
    if k == 0:
        return sum(i.t_solo_s for i in its) / len(its)
    if len(its) == 1:
        return solo_iteration_s(its[0].t_roll_s, its[0].t_train_s, its[0].t_sync_s, k)
    j = member.spec.job_id
    s = simulate_group([member], meta_iterations=sampled_meta_iterations([member], len(its)), phase_times={j: its},
                       record_timeline=False)
    return s.t_coexec_s[j]


def solo_staleness(member: GroupMember) -> dict[int, float]:
    """The share of an asynchronous job's rollouts per staleness when it runs alone on its own
    nodes (its Solo-D), in the steady state of its planning profile: ``{s: fraction}``; ``{}``
    for a synchronous job. From the same schedule as a group's (:func:`steady_schedule`)."""
    if member.profile.max_staleness == 0:
        return {}
    cnt = steady_schedule([member]).staleness[member.spec.job_id]
    n = sum(cnt.values())
    return {s: c / n for s, c in cnt.items()}


