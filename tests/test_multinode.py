"""Multi-node phases and N -> M weight sync in the runtime (RollMux §5.1, §5.2).

A job placed on 2 rollout + 2 training nodes runs each phase on all of them as one SPMD step
(rollout shards gathered in rank order, data-parallel training over the job's gloo group) and syncs
its weights N -> M through collectives/ (gloo). Co-executed with another job it ends bit-identical
(SHA-256 of the trainer weights and of every rollout worker's received weights, every iteration)
to the same job solo on the same nodes, and exactly one model copy crosses the pool boundary per
sync, counted from what the executors sent."""

from __future__ import annotations

import uuid

import pytest

from examples.grpo.config import ModelConfig, load_job_config
from examples.grpo.job import TOK, run_coexecuted, run_job
from examples.grpo.model import build_model
from rollmux.config import CONFIG_DIR
from actors.handles import SchedulerHandle
from factories import FIXED_GROUPS, kill_scheduler_and_controllers

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

N = 2  # iterations
TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, max_position_embeddings=48)


def job_cfg(name: str, job_id: str, rollout_gpus: int, train_gpus: int, **run):
    cfg = load_job_config(CONFIG_DIR / "jobs" / f"{name}.yaml", iterations=N)
    job = cfg.job.model_copy(update={"job_id": job_id, "num_rollout_gpus": rollout_gpus,
                                     "num_train_gpus": train_gpus, "slo": 8.0})
    r = cfg.run.model_copy(update={"max_new_tokens": 12, "min_new_tokens": 6, "num_prompts": 4, "group_size": 4,
                                   "ppo_epochs": 1, "minibatch_size": 8, "kl_coef": 0.0, **run})
    return cfg.model_copy(update={"job": job, "run": r, "model": TINY})


def model_bytes(cfg) -> int:
    return sum(t.numel() * t.element_size() for t in build_model(cfg.model, cfg.run.seed, TOK).state_dict().values())


@pytest.fixture()
def scheduler(ray_cluster, local_cluster_spec):
    """A fresh GlobalScheduler per call (unique name): ``make()`` returns its name."""
    from actors.scheduler.global_scheduler import get_or_create_scheduler

    made = []

    def make(spec=local_cluster_spec) -> str:
        name = f"test-multinode-{uuid.uuid4().hex[:6]}"
        h = get_or_create_scheduler(spec, name=name, config=FIXED_GROUPS)  # the tests check jobs inside one group
        assert SchedulerHandle(h).health(timeout_s=120).ok
        made.append((h, name))
        return name

    yield make
    for h, name in made:
        kill_scheduler_and_controllers(h, name)


def _run(cfgs, sched):
    res = run_coexecuted(cfgs, sched, admit_timeout_s=240, finish_timeout_s=360, sync_backend="gloo")
    errors = {k: v for k, v in res.items() if isinstance(v, BaseException)}
    assert not errors, errors
    return res


def _trace(r) -> dict:
    """Per iteration: trainer weights' SHA-256 and the weights each rollout worker received."""
    return {"trainer": [m["weights_sha256"] for m in r["history"]],
            "received": [m["received_sha256"] for m in r["history"]],
            "reward": [m["reward_mean"] for m in r["history"]]}


def _check_multinode(r, cfg, rollout_nodes: int, train_nodes: int) -> None:
    pl = r["info"]["placement"]
    assert (len(pl["rollout_nodes"]), len(pl["train_nodes"])) == (rollout_nodes, train_nodes)
    tl = r["timeline"]
    for phase, nodes in (("rollout", pl["rollout_nodes"]), ("train", pl["train_nodes"])):
        recs = [x for x in tl if x["phase"] == phase]
        assert len(recs) == N and all(x["nodes"] == nodes for x in recs), (phase, recs)
    syncs = [x for x in tl if x["phase"] == "sync"]
    # exactly one model copy crossed the pool boundary per sync, counted from the executors' sends
    one_copy = model_bytes(cfg)
    assert [x["sync_cross_bytes"] for x in syncs] == [one_copy] * N
    assert all(len(x["sync_cross_bytes_by_rank"]) == train_nodes and min(x["sync_cross_bytes_by_rank"]) > 0
               for x in syncs)
    t = _trace(r)
    # every rollout worker received exactly the weights the trainers published the iteration before
    assert t["received"][0] == [None] * rollout_nodes
    for it in range(1, N):
        assert t["received"][it] == [t["trainer"][it - 1]] * rollout_nodes


def test_two_plus_two_job_coexecuted_is_bit_identical_to_solo(scheduler):
    uid = uuid.uuid4().hex[:6]
    big = job_cfg("grpo_balanced", f"mn-solo-{uid}", 2, 2)
    solo = _run([big], scheduler())[big.job.job_id]
    _check_multinode(solo, big, 2, 2)
    co_big = big.model_copy(update={"job": big.job.model_copy(update={"job_id": f"mn-co-{uid}"})})
    mate = job_cfg("grpo_train_heavy", f"mn-mate-{uid}", 1, 1)
    res = _run([co_big, mate], scheduler())
    co = res[co_big.job.job_id]
    assert res[mate.job.job_id]["info"]["group_id"] == co["info"]["group_id"], "the two jobs share one group"
    _check_multinode(co, big, 2, 2)
    assert _trace(co) == _trace(solo)
    # and the comparison can fail: another seed gives other weights
    other = job_cfg("grpo_balanced", f"mn-other-{uid}", 2, 2, seed=99, iterations=1)
    assert _run([other], scheduler())[other.job.job_id]["history"][0]["weights_sha256"] != _trace(solo)["trainer"][0]


def test_scale_out_placement_runs_on_all_its_nodes_and_matches_solo(scheduler, scaleout_cluster_spec):
    """A 1-rollout + 2-training job holds rollout-0 and both training nodes; the 2 + 2 job then fits
    only by rollout scale-out (two new rollout nodes, the group's training nodes shared)."""
    uid = uuid.uuid4().hex[:6]
    big = job_cfg("grpo_balanced", f"so-solo-{uid}", 2, 2)
    solo = _run([big], scheduler(scaleout_cluster_spec))[big.job.job_id]
    co_big = big.model_copy(update={"job": big.job.model_copy(update={"job_id": f"so-co-{uid}"})})
    mate = job_cfg("grpo_train_heavy", f"so-mate-{uid}", 1, 2)
    res = _run([mate, co_big], scheduler(scaleout_cluster_spec))
    co, m = res[co_big.job.job_id], res[mate.job.job_id]
    assert m["info"]["group_id"] == co["info"]["group_id"]
    pm, pc = m["info"]["placement"], co["info"]["placement"]
    assert pc["train_nodes"] == pm["train_nodes"] and not set(pc["rollout_nodes"]) & set(pm["rollout_nodes"])
    _check_multinode(co, big, 2, 2)
    _check_multinode(m, mate, 1, 2)
    assert _trace(co) == _trace(solo)


def test_deepspeed_job_on_two_training_nodes_coexecuted_matches_solo(scheduler):
    """DeepSpeed ZeRO-2 as rank i of 2 (world from the placement, met through the job's store)."""
    uid = uuid.uuid4().hex[:6]
    ds = job_cfg("grpo_deepspeed", f"ds-solo-{uid}", 2, 2)
    assert ds.run.train_backend == "deepspeed"
    solo = _run([ds], scheduler())[ds.job.job_id]
    co_ds = ds.model_copy(update={"job": ds.job.model_copy(update={"job_id": f"ds-co-{uid}"})})
    mate = job_cfg("grpo_train_heavy", f"ds-mate-{uid}", 1, 1)
    res = _run([co_ds, mate], scheduler())
    co = res[co_ds.job.job_id]
    _check_multinode(co, ds, 2, 2)
    assert all(h["dp_ranks"] == 2 for h in co["history"])
    assert _trace(co) == _trace(solo)
