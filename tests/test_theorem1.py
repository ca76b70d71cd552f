"""Theorem 1 (RollMux §4.3, Appendix 9) as property tests.

For a non-saturated group (T_load < T_cycle) with one rollout and one training node, the
round-robin meta-iteration (every job's phases exactly once, in a fixed cyclic order) runs with
cycle T_cycle, and no bounded alternative cyclic schedule that repeats some job's phases reaches a
higher utilisation of the two pools.

The alternative schedules are evaluated by a small independent oracle: with one node per pool
and FIFO order ``order`` repeated cyclically on both nodes, the k-th entry's rollout starts at
max(end of the previous rollout, end of that job's previous training + sync) and its training at
max(end of the previous training, end of its rollout). It is cross-checked against
:func:`rollmux.intra_group.simulate_group` on round-robin orders.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rollmux.intra_group import simulate_group
from rollmux.models import GroupMember, JobSpec, PhaseProfile, Placement
from tests.test_intra_group import group_figures, saturated


def members(profs):
    return [GroupMember(spec=JobSpec(job_id=f"j{i}", model_params_b=7),
                        profile=PhaseProfile(t_roll_s=r, t_train_s=t, t_sync_s=s),
                        placement=Placement(job_id=f"j{i}", rollout_nodes=("rollout-0",), train_nodes=("train-0",)))
            for i, (r, t, s) in enumerate(profs)]


def cyclic_period(order, profs, cycles=40):
    """Oracle: steady-state period of the cyclic FIFO schedule ``order`` (job indices, repeats allowed)."""
    r_end = t_end = 0.0
    last_t: dict[int, float] = {}
    ends = []
    for _ in range(cycles):
        for j in order:
            r, t, s = profs[j]
            r_end = max(r_end, last_t.get(j, 0.0)) + r
            t_end = max(t_end, r_end) + t + s
            last_t[j] = t_end
        ends.append(t_end)
    h = cycles // 2
    return (ends[-1] - ends[h]) / (cycles - 1 - h)


def utilisation(order, profs, period):
    """Mean busy fraction of the rollout node and the training node over one period."""
    work = sum(profs[j][0] + profs[j][1] + profs[j][2] for j in order)
    return work / (2 * period)


times = st.integers(min_value=1, max_value=200).map(float)
prof_st = st.tuples(times, times, st.sampled_from([0.0, 0.0, 5.0, 17.0]))


@settings(max_examples=60, deadline=None)
@given(st.lists(prof_st, min_size=1, max_size=5))
def test_round_robin_cycle_equals_t_cycle_when_not_saturated(profs):
    g = members(profs)
    assume(not saturated(g))
    s = simulate_group(g, record_timeline=False)
    assert s.t_meta_s == pytest.approx(group_figures(g).t_cycle, rel=1e-9)
    for j in s.t_coexec_s:  # every member iterates once per meta-iteration
        assert s.t_coexec_s[j] == pytest.approx(group_figures(g).t_cycle, rel=1e-9)
    assert cyclic_period(list(range(len(profs))), profs) == pytest.approx(group_figures(g).t_cycle, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(prof_st, min_size=1, max_size=4), st.data())
def test_no_repeating_schedule_beats_round_robin_utilisation(profs, data):
    g = members(profs)
    assume(not saturated(g))
    n = len(profs)
    rr = list(range(n))
    u_rr = utilisation(rr, profs, group_figures(g).t_cycle)
    # a bounded alternative: 1-3 extra occurrences of jobs, inserted anywhere in the cycle
    alt = list(rr)
    for _ in range(data.draw(st.integers(1, 3))):
        alt.insert(data.draw(st.integers(0, len(alt))), data.draw(st.integers(0, n - 1)))
    u_alt = utilisation(alt, profs, cyclic_period(alt, profs))
    assert u_alt <= u_rr + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.lists(prof_st, min_size=1, max_size=5))
def test_oracle_matches_simulator_on_round_robin(profs):
    g = members(profs)
    s = simulate_group(g, meta_iterations=30, record_timeline=False)
    assert s.t_meta_s == pytest.approx(cyclic_period(list(range(len(profs))), profs, cycles=30), rel=1e-6)
    assert s.t_meta_s >= max(group_figures(g).t_load, group_figures(g).t_cycle) - 1e-9


def test_repetition_example_lowers_utilisation():
    # A(100, 100), B(10, 10): RR cycle 200 with 220 s of work on 2 nodes -> 0.55;
    # running B twice per cycle stretches the cycle more than it adds work.
    profs = [(100.0, 100.0, 0.0), (10.0, 10.0, 0.0)]
    u_rr = utilisation([0, 1], profs, cyclic_period([0, 1], profs))
    u_rep = utilisation([0, 1, 1], profs, cyclic_period([0, 1, 1], profs))
    assert u_rr == pytest.approx(0.55)
    assert u_rep < u_rr
