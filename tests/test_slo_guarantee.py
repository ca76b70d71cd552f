"""Worst-case admission bounds every stochastic realisation (RollMux §4.2 "conservative planning").

Groups are admitted by Alg. 1 on worst-case phase times (with the long-tail migration overhead
planned on every rollout); their phase times are then drawn below the worst case, per iteration,
with long-tail migration on. Property: no iteration of any member ends later than in the worst-case
schedule the prediction simulated, so the realised co-execution iteration time never exceeds the
predicted one, hence ``T_coexec_realised <= slo x T_solo_worst``.

What this does not bound, with numbers (rollmux/admission/README.md "SLO guarantee"): the slowdown taken
against the job's *realised* solo time, ``T_coexec_realised / T_solo_realised``. Shorter phases of
the job itself shrink its solo time faster than its waits for the others, so that ratio can pass
the SLO by the factor ``T_solo_worst / T_solo_realised`` at most; the test checks that bound too.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rollmux.admission import InterGroupScheduler, SchedulerConfig
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.intra_group import IterationTimes, LongTailPolicy, coexec_times, simulate_group, steady_meta_iterations
from rollmux.models import JobSpec, PhaseProfile

CLUSTER = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
OVERHEAD_S = 2.0
TAIL = LongTailPolicy(0.8, 1, OVERHEAD_S)


def _completions(sched, job_id: str) -> list[float]:
    """End of each of ``job_id``'s iterations (its sync on its first training node), in order."""
    node = min(r.node for r in sched.timeline if r.job_id == job_id and r.phase == "sync")
    return sorted(r.end_s for r in sched.timeline if r.job_id == job_id and r.phase == "sync" and r.node == node)


job_st = st.tuples(
    st.floats(20, 1500), st.floats(20, 1500), st.one_of(st.just(0.0), st.floats(0.001, 60)),  # worst-case roll, train, sync (s; sync 0 or >= 1 ms)
    st.floats(1.0, 3.0),  # SLO
    st.sampled_from([8, 16]),  # GPUs per pool
)
_frac = st.one_of(st.just(1.0), st.floats(0.2, 1.0))  # at the worst case (every response at the cap) or below
frac_st = st.tuples(_frac, _frac, st.floats(0.05, 1.0))  # roll, train, trigger (fraction of the rollout)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(job_st, min_size=2, max_size=5), data=st.data())
def test_realisations_of_admitted_groups_never_exceed_the_worst_case_prediction(jobs, data):
    cfg = SchedulerConfig(migration_overhead_s=OVERHEAD_S, plan_migration_overhead=True)
    s = InterGroupScheduler(CLUSTER, config=cfg)
    for i, (tr, tt, ts, slo, g) in enumerate(jobs):
        spec = JobSpec(job_id=f"j{i}", model_params_b=7, num_rollout_gpus=g, num_train_gpus=g, slo=slo,
                       measured=PhaseProfile(t_roll_s=tr, t_train_s=tt, t_sync_s=ts))
        assert s.admit(spec).admitted
    for grp in s.groups:
        members = list(grp.members)
        if len(members) < 2:
            continue
        event(f"group of {len(members)}")
        k_iters = 3
        m_it = steady_meta_iterations(members, rollout_overhead_s=OVERHEAD_S)  # the horizon admission simulates
        pred = coexec_times(members, rollout_overhead_s=OVERHEAD_S)
        for mb in members:  # the admitted prediction keeps every SLO
            assert pred[mb.spec.job_id] <= mb.spec.slo * mb.profile.t_solo_s * (1 + 1e-6)
        worst = {mb.spec.job_id: [IterationTimes(mb.profile.t_roll_s + OVERHEAD_S, mb.profile.t_train_s, mb.profile.t_sync_s)]
                 for mb in members}
        real = {}
        for mb in members:
            p, its = mb.profile, []
            for _ in range(k_iters):
                fr, ft, fg = data.draw(frac_st)
                its.append(IterationTimes(p.t_roll_s * fr, p.t_train_s * ft, p.t_sync_s, t_trigger_s=p.t_roll_s * fr * fg))
            real[mb.spec.job_id] = its
        w = simulate_group(members, meta_iterations=m_it, phase_times=worst)
        r = simulate_group(members, meta_iterations=m_it, phase_times=real, long_tail=TAIL)
        for mb in members:
            j = mb.spec.job_id
            assert w.t_coexec_s[j] == pytest.approx(pred[j], rel=1e-9)  # the schedule admission simulated
            cw, cr = _completions(w, j)[:m_it], _completions(r, j)[:m_it]
            # every realised iteration ends no later than in that worst-case schedule (migration on)
            assert all(a <= b + 1e-6 for a, b in zip(cr, cw)), (j, cr, cw)
            # so the realised iterations take no longer than the worst case's on average, and the
            # slowdown against the realised solo time passes the SLO by at most T_solo_worst / T_solo_real
            solo_real = sum(i.t_roll_s + i.t_train_s + i.t_sync_s for i in real[j]) / k_iters
            assert cr[-1] <= cw[-1] + 1e-6
            assert (cr[-1] / m_it) / solo_real <= (cw[-1] / m_it) / mb.profile.t_solo_s * (mb.profile.t_solo_s / solo_real) + 1e-9
