"""Validation of the shared models and the scheduler config: bad specs fail with a clear message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollmux.admission import SchedulerConfig, load_scheduler_config
from rollmux.config import CONFIG_DIR, ConfigError, load_cluster, load_job, load_model
from rollmux.models import ClusterSpec, CoExecutionGroup, GPUType, JobSpec, NodeSpec, PhaseProfile, Placement, PoolSpec


def _err(model, **kw) -> str:
    with pytest.raises(ValidationError) as ei:
        model(**kw)
    return str(ei.value)


@pytest.mark.parametrize(
    "field,value",
    [("num_rollout_gpus", 0), ("num_train_gpus", 0), ("num_train_gpus", -8), ("model_params_b", 0),
     ("model_params_b", -7), ("slo", 0.9), ("max_response_tokens", 0), ("num_prompts", 0),
     ("mem_roll_gb", -1.0), ("mem_train_gb", 0.0), ("job_id", "bad id!")],
)
def test_jobspec_rejects_bad_field_and_names_it(field, value):
    msg = _err(JobSpec, **{"job_id": "j", "model_params_b": 7, field: value})
    assert field in msg


def test_jobspec_cross_field_checks():
    assert "exceeds max_response_tokens" in _err(JobSpec, job_id="j", model_params_b=7, max_response_tokens=100, mean_response_tokens=200)
    assert "multi_turn" in _err(JobSpec, job_id="j", model_params_b=7, turns=3)
    assert "extra" in _err(JobSpec, job_id="j", model_params_b=7, gpus=8).lower()


@pytest.mark.parametrize("field", ["t_roll_s", "t_train_s"])
def test_phase_profile_rejects_non_positive_times(field):
    kw = {"t_roll_s": 10.0, "t_train_s": 10.0, field: -1.0}
    assert field in _err(PhaseProfile, **kw)
    kw[field] = 0.0
    assert field in _err(PhaseProfile, **kw)
    assert "t_sync_s" in _err(PhaseProfile, t_roll_s=1, t_train_s=1, t_sync_s=-0.5)


def test_phase_profile_values():
    p = PhaseProfile(t_roll_s=100, t_train_s=50, t_sync_s=5)
    assert p.t_solo_s == 155
    assert [p.time_of(x) for x in ("rollout", "train", "sync")] == [100, 50, 5]


def test_measured_profile_in_jobspec_validated():
    msg = _err(JobSpec, job_id="j", model_params_b=7, measured={"t_roll_s": -3, "t_train_s": 1})
    assert "measured.t_roll_s" in msg.replace("\n", ".").replace(" ", "")


def test_placement_and_node_validation():
    assert "at least one node" in _err(Placement, job_id="j", rollout_nodes=(), train_nodes=("train-0",))
    assert "duplicate" in _err(Placement, job_id="j", rollout_nodes=("rollout-0", "rollout-0"), train_nodes=("train-0",))
    gpu = GPUType(name="X", price_usd_per_h=1, bf16_tflops=1, hbm_gb=1, hbm_tb_per_s=1)
    assert "gpus_per_node" in _err(NodeSpec, gpu=gpu, gpus_per_node=0, host_mem_gb=10)
    assert "price_usd_per_h" in _err(GPUType, name="X", price_usd_per_h=0, bf16_tflops=1, hbm_gb=1, hbm_tb_per_s=1)


def test_paper_cluster_prices_and_group_cost():
    c = load_cluster(CONFIG_DIR / "cluster_paper.yaml")
    assert c.train_pool.node.gpu.price_usd_per_h / c.rollout_pool.node.gpu.price_usd_per_h == pytest.approx(2.85)
    g = CoExecutionGroup(group_id="g", rollout_nodes=("rollout-0", "rollout-1"), train_nodes=("train-0",))
    assert g.cost_usd_per_h(c) == pytest.approx(2 * 8 * 1.85 + 8 * 1.85 * 2.85)
    j = JobSpec(job_id="j", model_params_b=7, num_rollout_gpus=9, num_train_gpus=16)
    assert j.nodes_needed("rollout", c.rollout_pool.node) == 2
    assert j.nodes_needed("train", c.train_pool.node) == 2
    assert JobSpec(job_id="k", model_params_b=7, max_response_tokens=1000).mean_tokens == 500


def test_scheduler_config_yaml_and_errors(tmp_path):
    cfg = load_scheduler_config()
    assert (cfg.policy, cfg.max_group_size, cfg.tail_trigger_fraction) == ("rollmux", 5, 0.8)
    assert cfg.long_tail_policy().trigger_fraction == 0.8
    bad = tmp_path / "s.yaml"
    bad.write_text("max_group_size: 0\n")
    with pytest.raises(ConfigError, match="max_group_size"):
        load_scheduler_config(bad)
    bad.write_text("tail_trigger_fraction: 1.5\n")
    with pytest.raises(ConfigError, match="tail_trigger_fraction"):
        load_model(bad, SchedulerConfig)


def test_job_yaml_error_names_file_and_field(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("job:\n  job_id: a\n  model_params_b: 7\n  slo: 0.5\n")
    with pytest.raises(ConfigError) as ei:
        load_job(p)
    assert "slo" in str(ei.value) and str(p) in str(ei.value)


def test_bounded_pool_must_be_positive():
    gpu = GPUType(name="X", price_usd_per_h=1, bf16_tflops=1, hbm_gb=1, hbm_tb_per_s=1)
    node = NodeSpec(gpu=gpu, host_mem_gb=10)
    assert "num_nodes" in _err(PoolSpec, node=node, num_nodes=0)
    assert "cross_cluster_gbps" in _err(ClusterSpec, rollout_pool=PoolSpec(node=node), train_pool=PoolSpec(node=node), cross_cluster_gbps=0)
