"""The runtime demo's accounting (scripts/demo_runtime.py), without Ray: the policy's prediction
re-evaluated on other profiles, the per-iteration switch time and the nodes' hand-off times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import demo_runtime as demo  # noqa: E402


@pytest.fixture(scope="module")
def replay():
    from examples.grpo.config import load_job_config
    from rollmux.admission import InterGroupScheduler
    from rollmux.config import CONFIG_DIR, load_cluster

    cfgs = [load_job_config(CONFIG_DIR / "jobs" / f"{n}.yaml", iterations=2).job for n in demo.JOBS]
    r = InterGroupScheduler(load_cluster(CONFIG_DIR / "cluster_local.yaml"), policy="rollmux")
    for spec in cfgs:
        decision = r.admit(spec)
    return r, cfgs, dict(decision.predicted_slowdowns)


def test_prediction_on_the_admission_profiles_is_the_policys_own(replay):
    r, cfgs, admitted = replay
    assert len(r.groups) == 1 and len(admitted) == 3
    same = demo.predicted_on_profiles(r, {s.job_id: s.measured.model_dump() for s in cfgs})
    assert same == pytest.approx(admitted, rel=1e-12)


def test_prediction_follows_the_profile_it_is_given(replay):
    r, cfgs, admitted = replay
    # every phase twice as long: the same slowdowns (the schedule scales)
    doubled = {s.job_id: {k: 2 * v for k, v in s.measured.model_dump().items()} for s in cfgs}
    assert demo.predicted_on_profiles(r, doubled) == pytest.approx(admitted, rel=1e-9)
    # the balanced job's training twice as long: the training node is the bottleneck, so the
    # other two jobs wait longer for it
    heavier = {s.job_id: s.measured.model_dump() for s in cfgs}
    bal = cfgs[0].job_id
    heavier[bal] = dict(heavier[bal], t_train_s=2 * heavier[bal]["t_train_s"])
    got = demo.predicted_on_profiles(r, heavier)
    assert all(got[s.job_id] > admitted[s.job_id] for s in cfgs[1:])
    assert demo.predicted_on_profiles(r, {"someone-else": heavier[bal]}) == {}


def rec(job, phase, pool, it, start, end, granted=None, waited=0.0, **kw):
    return {"job_id": job, "phase": phase, "pool": pool, "iteration": it, "start": start, "end": end,
            "granted_at": granted, "waited_s": waited, **kw}


def test_switch_time_per_iteration_and_handoffs():
    tl = [rec("a", "rollout", "rollout", 0, 0.0, 1.0, 0.0, switch_s=0.5, offload_s=0.5),
          rec("a", "rollout", "rollout", 1, 2.0, 3.0, 1.98, switch_s=0.01, offload_s=0.02),
          rec("b", "rollout", "rollout", 1, 3.05, 4.0, 3.01, waited=0.5, switch_s=0.03, offload_s=0.04),
          rec("a", "train", "train", 1, 3.1, 4.0, 3.1, switch_s=0.02, offload_s=None),
          # b asked for the training node only after a's training ended: a bubble, not a hand-off
          rec("b", "train", "train", 1, 4.3, 4.5, 4.3, waited=0.0, switch_s=0.0, offload_s=0.0)]
    assert demo.switch_s_per_iteration(tl) == pytest.approx(0.01 + 0.02 + 0.03 + 0.04 + 0.02)
    assert demo.switch_s_per_iteration(tl[:1]) == pytest.approx(1.0)  # only iteration 0: counted
    h = demo.handoffs(tl)
    # rollout node: a (ends 3.0) -> b granted at 3.01 (release round trip), started 3.05 (dispatch)
    assert h["rollout"]["release_to_grant_s"] == pytest.approx(0.01) and h["rollout"]["handoffs"] == 1
    assert h["rollout"]["grant_to_start_s"] == pytest.approx(0.03)  # median of 0.02 and 0.04
    assert h["train"] == {"release_to_grant_s": None, "grant_to_start_s": 0.0, "handoffs": 0}


def test_steady_iteration_time_stops_at_the_first_departure():
    tl = [rec("a", "train", "train", k, k * 1.0, k * 1.0 + 0.9) for k in range(4)]  # ends 0.9, 1.9, 2.9, 3.9
    tl.append(rec("a", "sync", "train", 3, 3.9, 5.9))  # the last iteration paid a departure: ends 5.9
    assert demo.steady_iteration_s(tl, until=10.0) == pytest.approx((5.9 - 0.9) / 3)
    assert demo.steady_iteration_s(tl, until=4.0) == pytest.approx((2.9 - 0.9) / 2)
    assert demo.steady_iteration_s(tl, until=1.0) is None
