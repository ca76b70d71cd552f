"""The steady state of the deterministic round-robin schedule without the event simulation
(RollMux §4.3): the recurrence every node's FIFO obeys cycle by cycle, its steady horizon
(max-plus cyclicity), the memoised co-execution times admission's SLO check reads
(:func:`coexec_times`, Alg. 1 line 10) and the replay's group units (:func:`steady_schedule`).
Asynchronous members (``max_staleness`` k >= 1) enter the recurrence through the sync their
rollout waits for (:mod:`rollmux.staleness`). Equal to :func:`rollmux.intra_group.simulate_group`
on planning profiles, bit for bit (property-tested).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Mapping, Optional, Sequence, Union

from rollmux.group_schedule import GroupSchedule, members_of, staleness_counts
from rollmux.models import CoExecutionGroup, GroupMember
from rollmux.occupancy import BusyCurve
from rollmux.union_find import find_root


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
    members = list(members_of(members))
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
    lag = [[0.0] * mb.profile.max_staleness for mb in members]  # sync ends c-k-1 .. c-2 of an async member
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
    roll_starts: list[list[float]] = [[] for _ in range(n)]
    recs: list[tuple[float, int, float, float, Optional[float]]] = []  # (start, node, start, end, gpus)
    w1 = math.inf
    cycle = 0
    while True:
        starts_before = False
        for k, tr, rn, gr in rolls:
            s0 = lag[k][0] if lag[k] else last[k]  # rollout c waits for sync c - k - 1 (rollmux.staleness)
            for x in rn:
                if free[x] > s0:
                    s0 = free[x]
            e = s0 + tr
            for x in rn:
                free[x] = e
                recs.append((s0, x, s0, e, gr))
            rend[k] = e
            roll_starts[k].append(s0)
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
            if lag[k]:
                lag[k].pop(0)
                lag[k].append(last[k])
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
    stale = staleness_counts(members, {ids[k]: v for k, v in enumerate(roll_starts)},
                              {ids[k]: c[1:] for k, c in enumerate(done)}, h, m_it)
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
        staleness=stale,
    )


# --- cached steady state for admission ---------------------------------------------------------

def _canonical(members: Sequence[GroupMember], rollout_overhead_s: float = 0.0) -> tuple:
    return coexec_key([(mb.profile.t_roll_s + rollout_overhead_s, mb.profile.t_train_s, mb.profile.t_sync_s,
                        mb.placement.rollout_nodes, mb.placement.train_nodes, mb.profile.max_staleness) for mb in members])


def coexec_key(rows: Sequence[tuple]) -> tuple:
    """The memo key of :func:`coexec_times` for members given in round-robin order as rows
    ``(t_roll_s + rollout overhead, t_train_s, t_sync_s, rollout node ids, training node ids,
    max_staleness)`` (the last may be left out: 0, synchronous): node ids renamed 0, 1, ... in
    order of first use, so groups of the same structure share it."""
    names: dict[str, int] = {}
    key = []
    for tr, tt, ts, rn, tn, *k in rows:
        r = tuple(names.setdefault(x, len(names)) for x in rn)
        t = tuple(names.setdefault(x, len(names)) for x in tn)
        key.append((tr, tt, ts, r, t, k[0] if k else 0))
    return tuple(key)


def _lags(key: tuple) -> Optional[list[list[float]]]:
    """The start state of the sync ends an asynchronous member's rollouts wait for beyond its last
    one (:func:`_rr_cycle`): per job ``k`` zeros (its first ``k + 1`` rollouts wait for nothing);
    None when every member is synchronous."""
    return [[0.0] * row[5] for row in key] if any(row[5] for row in key) else None


def _rr_cycle(key: tuple, free: list[float], last: list[float], rend: list[float],
              lag: Optional[list[list[float]]] = None) -> None:
    """One meta-iteration of the round-robin recurrence, in place: every rollout in admission
    order starts at ``max(the sync end it waits for, its rollout nodes' free time)``, then every
    training (+ sync) at ``max(its rollout's end, its training nodes' free time)``. ``free``:
    per node id, ``last``: per job (its last sync end), ``rend``: per job (rollout end), seconds;
    ``lag`` (:func:`_lags`): per asynchronous job of bound ``k`` the ends of its syncs ``c - k - 1
    .. c - 2`` (rollout ``c`` waits for the first, :mod:`rollmux.staleness`; a synchronous job's
    rollout ``c`` waits for its last sync, ``c - 1``)."""
    for k, (tr, _tt, _ts, rn, _tn, _s) in enumerate(key):
        e = lag[k][0] if lag is not None and _s else last[k]
        for x in rn:
            if free[x] > e:
                e = free[x]
        e = e + tr
        for x in rn:
            free[x] = e
        rend[k] = e
    for k, (_tr, tt, ts, _rn, tn, _s) in enumerate(key):
        e = rend[k]
        for x in tn:
            if free[x] > e:
                e = free[x]
        e = e + tt + ts
        for x in tn:
            free[x] = e
        if lag is not None and _s:
            lag[k].pop(0)
            lag[k].append(last[k])
        last[k] = e


def _rr_recurrence(key: tuple, m_it: int) -> tuple[float, ...]:
    """Deterministic round-robin schedule as a recurrence (no events): with every node's FIFO
    order fixed to admission order, rollout ``(c, k)`` starts at ``max(end of k's sync of cycle
    c-1, free time of its rollout nodes)`` and training ``(c, k)`` at ``max(end of its rollout,
    free time of its training nodes)``; processing cycle by cycle, rollouts then trainings, in
    admission order respects every FIFO and dependency edge. Identical to :func:`simulate_group`
    without long tails (property-tested), ~20x cheaper. Returns steady-state t_coexec per job."""
    n = len(key)
    free = [0.0] * (1 + max((x for *_, rn, tn, _k in key for x in rn + tn), default=0))  # node ids are 0..N-1
    last = [0.0] * n
    rend = [0.0] * n
    lag = _lags(key)
    done: list[list[float]] = [[0.0] for _ in range(n)]
    for _ in range(m_it):
        _rr_cycle(key, free, last, rend, lag)
        for k in range(n):
            done[k].append(last[k])
    h = m_it // 2
    return tuple((c[m_it] - c[h]) / (m_it - h) for c in done)



def cycled_coexec_times(members: Union[CoExecutionGroup, Sequence[GroupMember]], times: Mapping[str, Sequence],
                        meta_iterations: int) -> dict[str, float]:
    """``t_coexec_s`` per member of a group of *synchronous* members whose phase times change from
    iteration to iteration: ``times[job_id]`` its iterations (``t_roll_s`` / ``t_train_s`` /
    ``t_sync_s``, cycled: iteration ``i`` runs ``times[job_id][i % len]``), averaged over the second
    half of ``meta_iterations`` cycles as :func:`rollmux.intra_group.simulate_group` does. The
    recurrence of :func:`_rr_cycle` with each cycle's own times: every node serves its jobs' turns
    in admission order whatever the phase times (:mod:`rollmux.round_robin`), so without long-tail
    migration the event simulation is this recurrence, bit for bit (the same maxima and sums, in
    the same order; property-tested). Raises ValueError on an asynchronous member
    (``max_staleness`` >= 1), an empty ``times`` entry or ``meta_iterations < 2``."""
    members = list(members_of(members))
    m_it = int(meta_iterations)
    if m_it < 2:
        raise ValueError(f"meta_iterations must be >= 2, got {m_it}")
    its = []
    for mb in members:
        if mb.profile.max_staleness:
            raise ValueError(f"cycled_coexec_times: {mb.spec.job_id} is asynchronous")
        if not times[mb.spec.job_id]:
            raise ValueError(f"cycled_coexec_times: no iterations for {mb.spec.job_id}")
        its.append(times[mb.spec.job_id])
    # the members' node ids once (coexec_key's renaming, each node named with its pool); each cycle
    # then runs _rr_cycle on the same rows with that cycle's phase times
    nodes = [(r, t) for _tr, _tt, _ts, r, t, _s in coexec_key(
        [(0.0, 0.0, 0.0, tuple(("rollout", x) for x in mb.placement.rollout_nodes),
          tuple(("train", x) for x in mb.placement.train_nodes)) for mb in members])]
    n = len(members)
    free = [0.0] * (1 + max((x for r, t in nodes for x in r + t), default=0))
    last = [0.0] * n
    rend = [0.0] * n
    h = m_it // 2
    at_h = [0.0] * n
    for c in range(m_it):
        cyc = [it[c % len(it)] for it in its]
        _rr_cycle(tuple((x.t_roll_s, x.t_train_s, x.t_sync_s, r, t, 0) for x, (r, t) in zip(cyc, nodes)),
                  free, last, rend)
        if c + 1 == h:
            at_h = list(last)
    return {mb.spec.job_id: (last[k] - at_h[k]) / (m_it - h) for k, mb in enumerate(members)}

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
    nn = 1 + max((x for *_, rn, tn, _k in key for x in rn + tn), default=0)
    parent: dict[int, int] = {}

    def root(a: int) -> int:
        return find_root(parent, a)

    for *_, rn, tn, _k in key:
        xs = rn + tn
        for x in xs[1:]:
            parent[root(x)] = root(xs[0])
    # state index -> component: nodes 0..nn-1, then job k's last sync end at nn + k, then the
    # earlier sync ends an asynchronous job's rollouts wait for (job by job)
    comp = [root(x) for x in range(nn)] + [root((rn + tn)[0]) for *_, rn, tn, _k in key]
    comp += [root((rn + tn)[0]) for *_, rn, tn, k in key for _ in range(k)]
    free = [0.0] * nn
    last = [0.0] * n
    rend = [0.0] * n
    lag = _lags(key)

    def state() -> tuple:
        return tuple(free + last) if lag is None else tuple(free + last + [x for v in lag for x in v])

    states = [state()]
    p_max = 2 * n + 2 + sum(row[5] for row in key)

    def cycle() -> None:
        _rr_cycle(key, free, last, rend, lag)
        states.append(state())

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
    return steady_horizon(_canonical(list(members_of(members)), rollout_overhead_s))


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

