"""Rollout request scheduler: ordering, starvation bound, quotas, budget, cold start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollmux.rollout_sched import (
    POLICIES,
    BudgetConfig,
    ColdStartConfig,
    ColdStartController,
    EngineState,
    Request,
    ResourceBudget,
    RolloutRequestScheduler,
    RolloutSchedConfig,
    SchedProfile,
    export_prometheus,
    load_rollout_sched_config,
    short_wait_bound_windows,
)


def profile(**kw) -> SchedProfile:
    base = dict(prefix_weight=1.0, critical_weight=2.0, waiting_weight=0.0, diversity_weight=0.0, cost_weight=0.0,
                max_batch_requests=64, prefix_ttl_versions=2)
    base.update(kw)
    return SchedProfile(**base)


def config(*, cold=None, stable=None, switch_step=0, switch_entropy=1.0, max_cold_steps=0, **budget) -> RolloutSchedConfig:
    b = dict(kv_capacity_tokens=10_000, short_reserved_fraction=0.1, short_slots_per_window=2, short_max_tokens=8,
             replay_quota=0.25)
    b.update(budget)
    return RolloutSchedConfig(
        slice_tokens=8,
        budget=BudgetConfig(**b),
        coldstart=ColdStartConfig(cold=cold or profile(), stable=stable or profile(), switch_step=switch_step,
                                  switch_entropy=switch_entropy, max_cold_steps=max_cold_steps, vocab_size=64,
                                  entropy_window_tokens=256),
    )


def req(rid, prompt, **kw) -> Request:
    return Request(request_id=rid, prompt_token_ids=tuple(prompt), **kw)


def ids(batch):
    return [r.request_id for r in batch]


# ----------------------------------------------------------------------------- request model / config
def test_request_validation_names_the_field():
    with pytest.raises(ValidationError, match="prompt_token_ids"):
        Request(request_id="a", prompt_token_ids=())
    with pytest.raises(ValidationError, match=r"token ids must be in \[0, "):
        Request(request_id="a", prompt_token_ids=(1, -2))
    with pytest.raises(ValidationError, match="max_tokens must be >= 1 for a generation"):
        Request(request_id="a", prompt_token_ids=(1,), max_tokens=0)
    with pytest.raises(ValidationError, match="type"):
        Request(request_id="a", prompt_token_ids=(1,), type="bogus")
    assert Request(request_id="r", prompt_token_ids=(1,), type="replay", max_tokens=0).kv_tokens == 1


def test_submit_rejects_duplicates_oversized_and_bad_dicts():
    s = RolloutRequestScheduler(config(kv_capacity_tokens=100), "mixed")
    s.submit({"request_id": "a", "prompt_token_ids": [1, 2], "max_tokens": 4})
    with pytest.raises(ValueError, match="already queued"):
        s.submit(req("a", [1], max_tokens=1))
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        s.submit(req("big", [1] * 50, max_tokens=60))
    with pytest.raises(ValidationError, match="max_tokens"):
        s.submit({"request_id": "b", "prompt_token_ids": [1], "max_tokens": -1})
    with pytest.raises(ValueError, match="unknown rollout scheduling policy 'lifo'"):
        RolloutRequestScheduler(config(), "lifo")
    assert set(POLICIES) >= {"fifo", "prefix", "mixed"}


def test_yaml_config_loads_and_bad_values_name_the_field(tmp_path):
    from rollmux.config import ConfigError

    cfg = load_rollout_sched_config()
    assert cfg.coldstart.switch_step == 4 and cfg.coldstart.switch_entropy == 0.75
    assert load_rollout_sched_config(section="cpu_engine").budget.kv_capacity_tokens == 2048
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout_sched:\n  slice_tokens: 4\n  budget: {kv_capacity_tokens: 100, short_max_tokens: 16}\n"
                   "  coldstart: {cold: {prefix_weight: 0, diversity_weight: 1, max_batch_requests: 2, prefix_ttl_versions: 0},"
                   " stable: {prefix_weight: 1, diversity_weight: 0, max_batch_requests: 8, prefix_ttl_versions: 2}}\n")
    with pytest.raises(ConfigError, match="short_max_tokens"):
        load_rollout_sched_config(bad)
    bad.write_text("rollout_sched:\n  budget: {kv_capacity_tokens: -5}\n")
    with pytest.raises(ConfigError, match="kv_capacity_tokens"):
        load_rollout_sched_config(bad)
    with pytest.raises(ConfigError, match="missing top-level section 'nope'"):
        load_rollout_sched_config(section="nope")


# ----------------------------------------------------------------------------- ordering
def test_mixed_puts_critical_first_even_against_prefix_reuse():
    s = RolloutRequestScheduler(config(stable=profile(max_batch_requests=2)), "mixed")
    hot = list(range(1, 41))
    s.index.insert(hot)
    for i in range(3):
        s.submit(req(f"reuse{i}", hot + [100 + i], max_tokens=50))
    s.submit(req("crit", [7, 7, 7], max_tokens=50, critical=True))
    assert ids(s.next_batch(0.0))[0] == "crit"
    # fifo and prefix ignore the critical flag
    f = RolloutRequestScheduler(config(stable=profile(max_batch_requests=2)), "prefix")
    f.index.insert(hot)
    for i in range(3):
        f.submit(req(f"reuse{i}", hot + [100 + i], max_tokens=50))
    f.submit(req("crit", [7, 7, 7], max_tokens=50, critical=True))
    assert "crit" not in ids(f.next_batch(0.0))


def test_score_orders_by_prefix_reuse_then_waiting_time():
    s = RolloutRequestScheduler(config(stable=profile(max_batch_requests=1, waiting_weight=0.0)), "mixed")
    shared = list(range(1, 31))
    s.index.insert(shared + [99])
    s.submit(req("cold", [500 + i for i in range(31)], max_tokens=20, arrival_s=0.0))
    s.submit(req("warm", shared + [98], max_tokens=20, arrival_s=5.0))
    assert ids(s.next_batch(5.0)) == ["warm"]
    assert s.hit_of("warm") == 30
    # with waiting weight only, the older request wins
    w = RolloutRequestScheduler(config(stable=profile(max_batch_requests=1, prefix_weight=0.0, waiting_weight=1.0)), "mixed")
    w.index.insert(shared + [99])
    w.submit(req("new", shared + [98], max_tokens=20, arrival_s=5.0))
    w.submit(req("old", [500 + i for i in range(31)], max_tokens=20, arrival_s=0.0))
    assert ids(w.next_batch(5.0)) == ["old"]


def test_fifo_head_of_line_and_prefix_hit_first():
    f = RolloutRequestScheduler(config(kv_capacity_tokens=1000, short_reserved_fraction=0.0), "fifo")
    f.submit(req("a", [1] * 10, max_tokens=500))
    f.submit(req("b", [2] * 10, max_tokens=500))  # does not fit next to "a"
    f.submit(req("c", [3] * 10, max_tokens=10))  # would fit, but FIFO blocks behind "b"
    assert ids(f.next_batch(0.0)) == ["a"]
    assert ids(f.next_batch(0.1)) == []
    p = RolloutRequestScheduler(config(stable=profile(max_batch_requests=2)), "prefix")
    p.index.insert([5] * 20)
    p.submit(req("x", [1] * 20, max_tokens=10))
    p.submit(req("y", [5] * 10 + [1] * 10, max_tokens=10))
    p.submit(req("z", [5] * 20, max_tokens=10))
    assert ids(p.next_batch(0.0)) == ["z", "y"]


def test_diversity_weight_mixes_families_where_prefix_only_clusters():
    hot = list(range(1, 21))
    def fill(s):
        s.index.insert(hot)
        for i in range(6):
            s.submit(req(f"a{i}", hot + [100 + i], max_tokens=10, task_family="A"))
        for i in range(2):
            s.submit(req(f"b{i}", [300 + i] * 21, max_tokens=10, task_family="B"))
            s.submit(req(f"c{i}", [400 + i] * 21, max_tokens=10, task_family="C"))
    m = RolloutRequestScheduler(config(stable=profile(max_batch_requests=3, prefix_weight=0.5, diversity_weight=2.0)), "mixed")
    fill(m)
    fams = {r.task_family for r in m.next_batch(0.0)}
    assert fams == {"A", "B", "C"}
    p = RolloutRequestScheduler(config(stable=profile(max_batch_requests=3)), "prefix")
    fill(p)
    assert {r.task_family for r in p.next_batch(0.0)} == {"A"}


# ----------------------------------------------------------------------------- starvation bound
def run_windows(s: RolloutRequestScheduler, arrivals: dict[int, list[Request]], windows: int):
    """Drive ``windows`` windows; short requests finish within their window, long ones never."""
    dispatched_at: dict[str, int] = {}
    ahead: dict[str, int] = {}
    for w in range(windows):
        for r in arrivals.get(w, []):
            if r.is_short(s.config.budget.short_max_tokens):
                ahead[r.request_id] = len(s.shorts)
            s.submit(r)
        for r in s.next_batch(float(w)):
            dispatched_at[r.request_id] = w
            if r.is_short(s.config.budget.short_max_tokens):
                s.on_complete(r.request_id, (), float(w))
    return dispatched_at, ahead


def starvation_stream():
    arrivals: dict[int, list[Request]] = {0: [req(f"long{i}", [1] * 20, max_tokens=480, critical=True) for i in range(200)]}
    k = 0
    for w in range(1, 30):
        arrivals[w] = []
        for _ in range(1 + w % 4):  # 1-4 shorts per window: more than the lane's 2 slots at times
            arrivals[w].append(req(f"short{k}", [2] * 10, type="reward", max_tokens=1))
            k += 1
    return arrivals, k


def test_short_requests_wait_at_most_their_bound_behind_long_ones():
    cfg = config(kv_capacity_tokens=10_000, short_reserved_fraction=0.1, short_slots_per_window=2)
    s = RolloutRequestScheduler(cfg, "mixed")
    arrivals, n_short = starvation_stream()
    dispatched_at, ahead = run_windows(s, arrivals, 120)
    assert s.engine_state().kv_long_in_use_tokens > 0.8 * 9000  # long requests fill the non-lane KV
    submitted = {r.request_id: w for w, rs in arrivals.items() for r in rs}
    for i in range(n_short):
        rid = f"short{i}"
        assert rid in dispatched_at, rid
        waited = dispatched_at[rid] - submitted[rid] + 1  # windows, counting the submission window
        assert waited <= short_wait_bound_windows(ahead[rid], 2), (rid, waited, ahead[rid])


def test_fifo_violates_the_short_bound():
    s = RolloutRequestScheduler(config(kv_capacity_tokens=10_000), "fifo")
    arrivals, n_short = starvation_stream()
    dispatched_at, _ = run_windows(s, arrivals, 120)
    assert not any(f"short{i}" in dispatched_at for i in range(n_short))  # stuck behind long requests


# ----------------------------------------------------------------------------- classes, quotas, budget
def test_background_only_fills_idle_capacity():
    s = RolloutRequestScheduler(config(stable=profile(max_batch_requests=2)), "mixed")
    s.submit(req("bg", [9] * 10, type="replay", max_tokens=0))
    s.submit(req("eval", [8] * 10, max_tokens=30, background=True))
    for i in range(3):
        s.submit(req(f"r{i}", [i + 1] * 10, max_tokens=30))
    assert set(ids(s.next_batch(0.0))) == {"r0", "r1"}
    second = ids(s.next_batch(1.0))
    assert second[0] == "r2" and len(second) == 2 and second[1] in {"bg", "eval"}
    assert s.metrics()["queue_background"] == 1


def test_replay_quota_per_window():
    s = RolloutRequestScheduler(config(stable=profile(max_batch_requests=8), replay_quota=0.25), "mixed")
    for i in range(10):
        s.submit(req(f"rp{i}", [i + 1] * 10, type="replay", max_tokens=0))
    assert len(s.next_batch(0.0)) == 2  # floor(0.25 * 8)
    assert len(s.next_batch(1.0)) == 2
    z = RolloutRequestScheduler(config(replay_quota=0.0), "mixed")
    z.submit(req("rp", [1] * 10, type="replay", max_tokens=0))
    assert z.next_batch(0.0) == []


def test_budget_depends_on_trainer_state():
    b = ResourceBudget(BudgetConfig(kv_capacity_tokens=1000, busy_trainer_fraction=0.5, short_reserved_fraction=0.1,
                                    critical_reserve_fraction=0.4, waiting_noncritical_fraction=0.2, replay_quota=0.5))
    busy = b.compute(EngineState(1000), trainer_waiting=False, max_batch_requests=10)
    wait = b.compute(EngineState(1000), trainer_waiting=True, max_batch_requests=10)
    assert (busy.short_kv_tokens, busy.long_kv_tokens, busy.noncritical_kv_tokens) == (50, 450, 270)
    assert (wait.short_kv_tokens, wait.long_kv_tokens, wait.noncritical_kv_tokens) == (100, 900, 180)
    assert wait.replay_max_requests == 5
    used = b.compute(EngineState(1000, 800, 50, 3), trainer_waiting=True, max_batch_requests=10,
                     noncritical_long_in_use_tokens=200)
    assert (used.long_kv_tokens, used.short_kv_tokens, used.noncritical_kv_tokens, used.free_kv_tokens) == (100, 50, 0, 150)
    with pytest.raises(ValueError, match="max_batch_requests"):
        b.compute(EngineState(1000), trainer_waiting=True, max_batch_requests=0)


def test_noncritical_long_work_is_held_back_while_the_trainer_waits():
    cfg = config(kv_capacity_tokens=10_000, short_reserved_fraction=0.0, waiting_noncritical_fraction=0.1)
    s = RolloutRequestScheduler(cfg, "mixed")
    for i in range(5):
        s.submit(req(f"bg{i}", [i + 1] * 10, max_tokens=490))
    s.set_trainer_waiting(True)
    assert len(s.next_batch(0.0)) == 2  # 2 x 500 tokens = 10% of the KV
    s.set_trainer_waiting(False)
    assert len(s.next_batch(1.0)) == 3


# ----------------------------------------------------------------------------- cold start
def cold_cfg(**kw) -> ColdStartConfig:
    base = dict(cold=profile(prefix_weight=0.1, max_batch_requests=2, prefix_ttl_versions=0, diversity_weight=1.0),
                stable=profile(prefix_weight=1.0, max_batch_requests=16, prefix_ttl_versions=3),
                switch_step=3, switch_entropy=0.5, max_cold_steps=10, entropy_window_tokens=200, vocab_size=64)
    base.update(kw)
    return ColdStartConfig(**base)


def test_coldstart_switch_needs_both_step_and_entropy_thresholds():
    c = ColdStartController(cold_cfg())
    c.observe_tokens(list(range(64)) * 3)  # uniform: entropy ~1
    assert c.entropy > 0.95
    assert not c.on_step(5) and c.phase == "cold"  # step reached, entropy too high
    c2 = ColdStartController(cold_cfg())
    c2.observe_tokens([1] * 180 + [2] * 20)  # low entropy
    assert c2.entropy < 0.5
    assert not c2.on_step(2) and c2.phase == "cold"  # entropy reached, step too early
    assert c2.on_step(3) and c2.phase == "stable" and c2.switched_at_step == 3
    assert c2.profile.max_batch_requests == 16
    m = c2.metrics()
    assert m["coldstart_phase"] == "stable" and m["coldstart_switch_step"] == 3 and m["coldstart_switch_entropy"] == 0.5
    c3 = ColdStartController(cold_cfg())
    c3.observe_tokens(list(range(64)) * 3)
    assert c3.on_step(10) and c3.switched_at_step == 10  # max_cold_steps bounds the cold phase
    c4 = ColdStartController(cold_cfg())
    c4.report_entropy(0.2)
    assert c4.on_step(3)
    with pytest.raises(ValueError, match="entropy"):
        c4.report_entropy(1.5)
    with pytest.raises(ValidationError, match="max_cold_steps"):
        cold_cfg(switch_step=5, max_cold_steps=2)


def test_scheduler_profile_switch_changes_batch_size_and_ttl():
    cfg = config(cold=cold_cfg().cold, stable=cold_cfg().stable, switch_step=2, switch_entropy=0.5, max_cold_steps=20)
    s = RolloutRequestScheduler(cfg, "mixed")
    for i in range(40):
        s.submit(req(f"g{i}", [i + 1] * 5, max_tokens=10))
    assert len(s.next_batch(0.0)) == 2 and s.index.ttl_versions == 0
    for r in s.next_batch(0.1):
        s.on_complete(r.request_id, [7] * 10, 0.2)  # a collapsed (low-entropy) output distribution
    s.set_policy_version(1)
    assert s.metrics()["coldstart_phase"] == "cold"
    s.set_policy_version(2)
    m = s.metrics()
    assert m["coldstart_phase"] == "stable" and m["coldstart_switched_at_step"] == 2 and m["profile_switches"] == 1
    assert s.index.ttl_versions == 3 and len(s.next_batch(1.0)) == 16
    # baselines never leave the stable profile
    f = RolloutRequestScheduler(cfg, "fifo")
    assert f.profile.max_batch_requests == 16


def test_entropy_triggered_switch_between_versions_is_counted_and_applied():
    # the step threshold is met first (version 2) while entropy is high; the switch then happens
    # inside next_batch once completions collapse the output distribution (no version change)
    cfg = config(cold=cold_cfg().cold, stable=cold_cfg().stable, switch_step=2, switch_entropy=0.5, max_cold_steps=20)
    s = RolloutRequestScheduler(cfg, "mixed")
    s.set_policy_version(2)
    assert s.metrics()["coldstart_phase"] == "cold" and s.index.ttl_versions == 0  # no tokens yet: entropy 1.0
    s.submit(req("a", [1] * 5, max_tokens=10))
    (r,) = s.next_batch(0.0)
    s.on_complete(r.request_id, [7] * 10, 0.1)
    s.next_batch(0.2)
    m = s.metrics()
    assert m["coldstart_phase"] == "stable" and m["coldstart_switched_at_step"] == 2 and m["profile_switches"] == 1
    assert s.index.ttl_versions == 3


def test_cold_ttl_expires_prefixes_on_version_change():
    cfg = config(cold=cold_cfg().cold, stable=cold_cfg().stable, switch_step=5, max_cold_steps=5)
    s = RolloutRequestScheduler(cfg, "mixed")
    s.submit(req("a", [1] * 30, max_tokens=5))
    s.next_batch(0.0)
    s.set_policy_version(1, cache_reset=False)  # an engine keeping its KV; cold TTL 0: version-0 KV is stale
    s.submit(req("b", [1] * 30, max_tokens=5))
    s.next_batch(1.0)
    assert s.hit_of("b") == 0 and s.metrics()["index_expired_nodes"] >= 1


def test_metrics_export_to_prometheus():
    from prometheus_client import CollectorRegistry, generate_latest

    s = RolloutRequestScheduler(config(), "mixed")
    s.submit(req("a", [1, 2, 3], max_tokens=4))
    s.next_batch(0.0)
    reg = CollectorRegistry()
    gauges = export_prometheus(s.metrics(), reg)
    text = generate_latest(reg).decode()
    assert "rollmux_rollout_sched_dispatched 1.0" in text
    assert "rollmux_rollout_sched_coldstart_stable 1.0" in text  # max_cold_steps=0: stable at once
    assert "rollmux_rollout_sched_index_bytes" in gauges


def test_cancel_drops_queued_and_aborts_running_requests():
    s = RolloutRequestScheduler(config(), "mixed")
    s.submit(req("keep", [1, 2], max_tokens=4))
    s.submit(req("drop", [3, 4], type="reward", max_tokens=1))
    assert s.cancel("drop") and not s.cancel("drop") and not s.cancel("nope")
    assert ids(s.next_batch(0.0)) == ["keep"] and s.take_aborts() == []
    assert s.engine_state().kv_in_use_tokens == 6
    assert s.cancel("keep") and s.take_aborts() == ["keep"]  # running: aborted, its KV released now
    assert s.engine_state().kv_in_use_tokens == 0 and s.running == 0
    m = s.metrics()
    assert m["cancelled"] == 1 and m["aborted"] == 1 and m["queue_short"] == 0


def test_cached_prefix_hits_are_refreshed_before_dispatch():
    cfg = config(stable=profile(max_batch_requests=1)).model_copy(update={"hit_refresh_windows": 100})
    s = RolloutRequestScheduler(cfg, "prefix")
    a, b = [1] * 30, [2] * 30
    s.submit(req("a", a + [5], max_tokens=4))
    s.submit(req("b", b + [5], max_tokens=4))
    s.submit(req("warmup", [9], max_tokens=1))
    s.index.insert([9])
    assert ids(s.next_batch(0.0)) == ["warmup"]  # caches hit 0 for "a" and "b"
    s.index.insert(b)  # "b" now shares 30 tokens; its cached hit (0) is stale
    assert ids(s.next_batch(1.0)) == ["a"]  # order by the (stale) cache: "a" first by arrival...
    assert s.hit_of("a") == 0
    out = s.next_batch(2.0)
    assert ids(out) == ["b"] and s.hit_of("b") == 30  # ...but dispatch measures the fresh hit
