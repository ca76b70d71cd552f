"""Asynchronous jobs at run time (rollmux.staleness): the example GRPO job with k = 1 on CPU, solo
(plain mode) and co-executed with a synchronous job under the real GlobalScheduler /
GroupController / pool workers. ``exact``: bit-identical to its solo run; ``bounded``: every
rollout's policy version within the bound (checked on every record); the runtime refuses a
rollout whose version is not published."""

from __future__ import annotations

import uuid

import pytest

from examples.grpo.config import ModelConfig, load_job_config
from examples.grpo.job import run_coexecuted, run_job
from rollmux.config import CONFIG_DIR
from rollmux.staleness import StalenessError, check_version

N = 4  # iterations
TINY = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=176)


def tiny(name: str, uid: str, k: int = 0, mode: str = "exact", slo: float = 10.0):
    cfg = load_job_config(CONFIG_DIR / "jobs" / f"{name}.yaml", iterations=N)
    job = cfg.job.model_copy(update={"job_id": f"{cfg.job.job_id}-{mode if k else 'sync'}-{uid}", "slo": slo,
                                     "max_staleness": k, "staleness_mode": mode})
    run = cfg.run.model_copy(update={"max_new_tokens": min(cfg.run.max_new_tokens, 48),
                                     "min_new_tokens": min(cfg.run.min_new_tokens, 16),
                                     "num_prompts": min(cfg.run.num_prompts, 4)})
    return cfg.model_copy(update={"job": job, "run": run, "model": TINY})


def _versions(result: dict, k: int, mode: str) -> list[tuple[int, int]]:
    """(rollout index, policy version) of every rollout record, each checked against the bound."""
    out = []
    for rec in result["timeline"]:
        if rec["phase"] == "rollout":
            check_version(rec["iteration"], rec["policy_version"], k, mode)  # raises StalenessError
            out.append((rec["iteration"], rec["policy_version"]))
    assert [i for i, _ in out] == list(range(N))
    return out


def test_plain_async_job_pipelines_and_keeps_its_versions():
    """Solo, k = 1: ``exact`` uses versions 0, 0, 1, 2 and is deterministic; its rollout i + 1
    overlaps its training i; ``bounded`` stays within the bound; a rollout run ahead of the
    version it needs is refused."""
    uid = uuid.uuid4().hex[:6]
    a = run_job(tiny("grpo_balanced", uid, k=1), attach=False)
    b = run_job(tiny("grpo_balanced", uid, k=1), attach=False)
    assert _versions(a, 1, "exact") == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert [m["weights_sha256"] for m in a["history"]] == [m["weights_sha256"] for m in b["history"]]
    rolls = {r["iteration"]: r for r in a["timeline"] if r["phase"] == "rollout"}
    trains = {r["iteration"]: r for r in a["timeline"] if r["phase"] == "train"}
    assert any(rolls[i + 1]["start"] < trains[i]["end"] for i in range(N - 1))  # rollout i + 1 beside training i
    bounded = run_job(tiny("grpo_balanced", uid, k=1, mode="bounded"), attach=False)
    assert all(i - v in (0, 1) for i, v in _versions(bounded, 1, "bounded"))
    # the runtime refuses a rollout that would break the bound (rollout 2 needs version 1: no sync ran)
    from examples.grpo.job import make_job

    g = make_job(tiny("grpo_balanced", uid, k=1), attach=False)
    g.rollout(0), g.rollout(1)
    with pytest.raises(StalenessError, match="needs policy version >= 1"):
        g.rollout(2)
    assert g.job.lifecycle.is_ended()


@pytest.fixture(scope="module")
def sched(ray_cluster, local_cluster_spec):
    import ray

    from actors.handles import SchedulerHandle
    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from factories import FIXED_GROUPS

    name = f"test-async-{uuid.uuid4().hex[:6]}"
    h = get_or_create_scheduler(local_cluster_spec, name=name, config={**FIXED_GROUPS, "tail_migration": False})
    assert SchedulerHandle(h).health(timeout_s=None).ok
    yield name
    ray.kill(h, no_restart=True)


@pytest.mark.ray
@pytest.mark.timeout(420)
def test_coexecuted_async_jobs_exact_bit_identical_bounded_within_k(sched):
    """A synchronous job and two asynchronous ones (k = 1, ``exact`` and ``bounded``) in one
    co-execution group: the exact one ends every iteration with the weights of its solo run; every
    rollout record of both states a policy version within k; no node ran two phases at once (long-tail
    migration, whose released rollout runs its tail beside the next one, is off for this scheduler).
    (Whether an async member's rollout runs beside its own training depends on its place in the
    round robin: here the synchronous job's rollout turn comes first on the shared rollout node.)"""
    uid = uuid.uuid4().hex[:6]
    cfgs = [tiny("grpo_balanced", uid), tiny("grpo_train_heavy", uid, k=1, mode="exact"),
            tiny("grpo_rollout_heavy", uid, k=1, mode="bounded")]
    results = run_coexecuted(cfgs, sched, admit_timeout_s=240, finish_timeout_s=380)
    errors = {k: v for k, v in results.items() if isinstance(v, BaseException)}
    assert not errors, errors
    co = [results[c.job.job_id] for c in cfgs]
    assert all(r["mode"] == "scheduled" and r["iterations"] == N for r in co)
    assert len({r["info"]["group_id"] for r in co}) == 1, "one co-execution group"
    exact, bounded = co[1], co[2]
    assert _versions(exact, 1, "exact") == [(0, 0), (1, 0), (2, 1), (3, 2)]
    _versions(bounded, 1, "bounded")
    assert all(r["policy_version"] == r["iteration"] for r in co[0]["timeline"] if r["phase"] == "rollout")
    solo = run_job(cfgs[1], attach=False)
    assert [m["weights_sha256"] for m in solo["history"]] == [m["weights_sha256"] for m in exact["history"]]
    assert [m["reward_mean"] for m in solo["history"]] == [m["reward_mean"] for m in exact["history"]]
    busy: dict[str, list] = {}
    for r in co:
        for x in r["timeline"]:
            for node in x.get("nodes") or [x["node"]]:
                busy.setdefault(node, []).append((x["start"], x["end"], x["job_id"], x["phase"], x["iteration"]))
    for node, spans in busy.items():
        spans.sort()
        for a, b in zip(spans, spans[1:]):
            same_slot = a[2] == b[2] and (a[3], b[3]) == ("train", "sync")
            assert b[0] >= a[1] - 1e-3 or same_slot, (node, a, b)
