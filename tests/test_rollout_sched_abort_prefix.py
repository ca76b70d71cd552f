"""Prefix credit across weight updates, aborting running requests, and stopping a step at a sample target.

A prefix hit is credited only where the engine can reuse the KV: engines reset their prefix cache
when new weights are loaded, so after a version change the scheduler credits nothing from before
it (CPU engine: credited hits == prefill tokens the engine really reused). Over-sampling: once a
step has enough samples, the in-flight leftovers are aborted and free their slots within one
scheduling window.
"""

from __future__ import annotations

import pytest

from actors.rollout.engine import CPUEngine, ListSource, serve
from actors.rollout.sim_engine import SimulatedEngine
from rollmux.rollout_sched import Request, RolloutRequestScheduler, load_rollout_sched_config

SYSTEM = list(range(10, 40))  # a 30-token shared system prompt


def reqs(tag: str, n: int, *, t0: float = 0.0, version: int = 0, max_tokens: int = 4) -> list[Request]:
    return [Request(request_id=f"{tag}-{i}", prompt_token_ids=tuple(SYSTEM + [100 + i, 101 + i]), max_tokens=max_tokens,
                    arrival_s=t0, critical=True, policy_version=version, task_family="f") for i in range(n)]


@pytest.mark.parametrize("policy", ["prefix", "mixed", "fifo"])
def test_cpu_engine_credited_hits_equal_reused_prefill_across_a_weight_update(policy):
    s = RolloutRequestScheduler(load_rollout_sched_config(section="cpu_engine"), policy=policy)
    eng = CPUEngine(slice_tokens=4, eos_token_id=None, prefix_cache_entries=16)
    serve(s, eng, ListSource(reqs("v0", 4), version=0))
    h0, r0 = s.counters["hit_tokens"], eng.prefill_tokens_reused
    assert h0 == r0 == 3 * 16  # the first prompt computes, the next three reuse the system prompt's whole block
    serve(s, eng, ListSource(reqs("v1", 4), version=1))  # new weights: the engine drops its prefix KV
    h1, r1 = s.counters["hit_tokens"] - h0, eng.prefill_tokens_reused - r0
    assert h1 == r1 == 3 * 16  # not 4 x 16 from the version-0 entries
    assert [d.hit_tokens for d in s.dispatch_log if d.request_id == "v1-0"] == [0]
    m = s.metrics()
    assert m["prefix_hit_ratio"] == pytest.approx(96 / 256) and m["cache_resets"] == 1
    # same version again (a second batch on the same weights): prefixes stay creditable and reused;
    # a repeated full prompt reuses the whole blocks of all but its last token (which must run)
    serve(s, eng, ListSource(reqs("w1", 2), version=1))
    assert s.counters["hit_tokens"] - h0 - h1 == eng.prefill_tokens_reused - r0 - r1 == 2 * 16


def test_simulated_engine_saves_no_prefill_across_versions():
    s = RolloutRequestScheduler(load_rollout_sched_config(section="rollout_sched"), policy="prefix")
    eng = SimulatedEngine(slice_tokens=32)
    saved = []
    for tag, ver in (("a", 0), ("b", 1), ("c", 3)):
        before = eng.prefill_saved_tokens
        serve(s, eng, ListSource(reqs(tag, 8, t0=eng.now(), version=ver), version=ver))
        saved.append(eng.prefill_saved_tokens - before)
    assert saved == [7 * 30, 7 * 30, 7 * 30]


def test_an_engine_that_keeps_its_cache_uses_the_ttl():
    s = RolloutRequestScheduler(load_rollout_sched_config(section="rollout_sched"), policy="prefix")
    assert s.profile.prefix_ttl_versions == 2  # the non-adaptive policy uses the stable profile
    s.submit(reqs("a", 1)[0])
    s.next_batch(0.0)
    s.set_policy_version(1, cache_reset=False)  # within the TTL: still creditable
    s.submit(reqs("b", 1)[0])
    s.next_batch(0.1)
    assert s.hit_of("b-0") == 31  # the same prompt: all but the last token (it must run)
    s.set_policy_version(2)  # an engine that resets its cache: nothing from before is creditable
    s.submit(reqs("c", 1)[0])
    s.next_batch(0.2)
    assert s.hit_of("c-0") == 0 and s.index.stats["cleared_nodes"] >= 1


def test_cancel_aborts_a_running_request_and_frees_its_slot_within_one_window():
    cfg = load_rollout_sched_config(section="rollout_sched")
    s = RolloutRequestScheduler(cfg, policy="fifo")
    cap = cfg.budget.kv_capacity_tokens
    big = [Request(request_id=f"big{i}", prompt_token_ids=(1, 2, 3, i), max_tokens=cap // 2 - 8, critical=True)
           for i in range(3)]
    for r in big:
        s.submit(r)
    first = s.next_batch(0.0)
    assert [r.request_id for r in first] == ["big0", "big1"] and s.pending == 1  # the KV holds two
    assert s.cancel("big0") and s.take_aborts() == ["big0"] and s.take_aborts() == []
    assert s.running == 1 and s.counters["aborted"] == 1
    assert [r.request_id for r in s.next_batch(0.1)] == ["big2"]  # the freed slot, in the next window
    assert not s.cancel("big0") and not s.cancel("unknown")
    with pytest.raises(KeyError):
        s.on_complete("big0")


class _OverSample(ListSource):
    """Cancels every unfinished request once ``need`` completed (as a trainer with enough samples)."""

    def __init__(self, requests, need):
        super().__init__(requests)
        self.need, self.t_enough, self._cancel = need, None, []

    def on_complete(self, c, now_s):
        super().on_complete(c, now_s)
        if len(self.completions) == self.need and self.t_enough is None:
            self.t_enough = now_s
            self._cancel = [r.request_id for r in self._reqs if r.request_id not in self.completions]

    def cancelled(self):
        out, self._cancel = self._cancel, []
        return out


LENS = {f"g{i}": (200 if i < 8 else 4000) for i in range(16)}  # 8 short, 8 long stragglers


def _oversample_reqs():
    return [Request(request_id=k, prompt_token_ids=(1, 2, 3, i), max_tokens=4096, critical=True, task_family="f")
            for i, k in enumerate(LENS)]


@pytest.mark.parametrize("policy", ["fifo", "prefix", "mixed"])
def test_cancelled_stragglers_stop_within_one_window(policy):
    cfg = load_rollout_sched_config(section="rollout_sched")
    s = RolloutRequestScheduler(cfg, policy=policy)
    eng = SimulatedEngine(cfg.slice_tokens, output_len=lambda r: LENS[r.request_id])
    src = _OverSample(_oversample_reqs(), need=8)
    st = serve(s, eng, src)
    assert src.t_enough == pytest.approx(0.71, abs=0.05)
    window_s = 0.1  # one slice of 32 decode steps with 16 sequences running is ~0.03 s
    assert st.end_s - src.t_enough < window_s  # was 14.9 s: the stragglers ran to 4000 tokens
    assert st.completed == 8 and st.aborted == 8 and s.counters["aborted"] == 8 and s.running == 0
    assert eng.running == 0 and s.engine_state().kv_in_use_tokens == 0


@pytest.mark.parametrize("policy", ["fifo", "mixed"])
def test_serve_stops_at_a_sample_target(policy):
    cfg = load_rollout_sched_config(section="rollout_sched")
    s = RolloutRequestScheduler(cfg, policy=policy)
    eng = SimulatedEngine(cfg.slice_tokens, output_len=lambda r: LENS[r.request_id])
    src = ListSource(_oversample_reqs())
    st = serve(s, eng, src, sample_target=8)
    assert st.stopped_by == "sample_target" and st.completed == 8 and st.aborted == 8
    assert st.end_s < 1.0 and s.running == 0 and s.pending == 0
    assert sorted(src.completions) == sorted(k for k, n in LENS.items() if n == 200)
    with pytest.raises(ValueError, match="sample_target"):
        serve(s, eng, ListSource([]), sample_target=0)


def test_cpu_engine_abort_drops_running_requests():
    s = RolloutRequestScheduler(load_rollout_sched_config(section="cpu_engine"), policy="fifo")
    eng = CPUEngine(slice_tokens=4, eos_token_id=None)
    rs = reqs("x", 2, max_tokens=64)
    src = _OverSample(rs, need=1)
    st = serve(s, eng, src, max_windows=200, max_wall_s=60)
    # both prompts run in lock-step: the first completion comes with or before the second; the rest is aborted
    assert st.stopped_by == "drained" and eng.running == 0 and s.running == 0
    assert st.completed + st.aborted == 2 and st.completed >= 1


def test_a_replay_item_is_credited_no_prefix_hit():
    """Replay items need the logits of every prompt position: the engine reuses no prefix KV for them."""
    s = RolloutRequestScheduler(load_rollout_sched_config(section="cpu_engine"), policy="fifo")
    eng = CPUEngine(slice_tokens=4, eos_token_id=None)
    gen = reqs("g", 1)[0]
    replay = Request(request_id="r", prompt_token_ids=gen.prompt_token_ids + (7,), type="replay", max_tokens=0)
    serve(s, eng, ListSource([gen, replay.model_copy(update={"arrival_s": 0.01})]), max_windows=100, max_wall_s=60)
    assert [d.hit_tokens for d in s.dispatch_log if d.request_id == "r"] == [0]
    assert s.counters["hit_tokens"] == eng.prefill_tokens_reused == 0
