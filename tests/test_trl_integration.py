"""TRL integration: an unchanged TRL GRPO script (examples/trl_grpo/train.py) run through the
one-line wrapper ``python -m rollmux.integrations.trl`` is bit-identical (SHA-256 of the weights
after every optimizer step) to the same script run as plain TRL, alone and co-executed with
another job in one co-execution group on the session's Ray cluster (the TRL job is a driver
process attached to that cluster, as ``ray job submit`` would start it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import rollmux
from actors.handles import SchedulerHandle
from factories import make_toy, small_spec, toy_spec, wait_until

try:
    import trl  # noqa: F401

    HAVE_TRL = True
except Exception:  # pragma: no cover - without the extra
    HAVE_TRL = False

pytestmark = [pytest.mark.skipif(not HAVE_TRL, reason="TRL not installed: pip install -e '.[trl]' "
                                 "(scripts/_venv.sh installs it)"), pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "trl_grpo" / "train.py"
STEPS = 4
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _run(args: list[str], out: Path, env: dict | None = None, timeline: Path | None = None,
         wrapper: bool = False, background: bool = False):
    # a single-process run: the test process may carry another test's torch.distributed variables
    # (DeepSpeed sets RANK / WORLD_SIZE in-process), which would make the Trainer start a world
    e = {k: v for k, v in os.environ.items() if k not in DIST_VARS and k != "ROLLMUX_ATTACH"}
    e.update(PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false", **(env or {}))
    if timeline is not None:
        e["ROLLMUX_TIMELINE_OUT"] = str(timeline)
    cmd = [sys.executable] + (["-m", "rollmux.integrations.trl"] if wrapper else []) + \
        [str(SCRIPT), "--steps", str(STEPS), "--digests-out", str(out)] + args
    if background:
        return subprocess.Popen(cmd, env=e, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    p = subprocess.run(cmd, env=e, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def plain_trl(tmp_path_factory) -> list[str]:
    """The per-step digests of the script run as plain TRL (no RollMux anywhere)."""
    d = tmp_path_factory.mktemp("trl_plain")
    _run(["--output-dir", str(d / "o")], d / "plain.json")
    got = json.loads((d / "plain.json").read_text())
    assert got["trainer"] == "GRPOTrainer" and len(got["digests"]) == STEPS
    assert len(set(got["digests"])) == STEPS  # every step changed the weights
    return got["digests"]


def test_the_wrapper_alone_is_plain_trl_bit_for_bit_with_permits_in_phase_order(plain_trl, tmp_path):
    _run(["--output-dir", str(tmp_path / "o")], tmp_path / "rm.json", timeline=tmp_path / "tl.json", wrapper=True)
    got = json.loads((tmp_path / "rm.json").read_text())
    assert got["trainer"] == "RollMuxGRPOTrainer"
    assert got["digests"] == plain_trl
    tl = json.loads((tmp_path / "tl.json").read_text())
    assert tl["mode"] == "plain"
    assert [r["phase"] for r in tl["timeline"]] == ["rollout", "train", "sync"] * STEPS
    assert [r["iteration"] for r in tl["timeline"]] == [i for i in range(STEPS) for _ in range(3)]
    assert all(r["ok"] and r["driver_side"] and not r["empty"] for r in tl["timeline"])


def test_spec_is_derived_from_the_trainer_and_a_missing_field_is_named(tmp_path, monkeypatch):
    for k in DIST_VARS:  # one process: no torch.distributed world from another test's variables
        monkeypatch.delenv(k, raising=False)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import train as script
    finally:
        sys.path.pop(0)
    from trl import GRPOConfig

    from rollmux.integrations.protocol import SpecFieldMissing
    from rollmux.integrations.trl import RollMuxGRPOTrainer, spec_from_trainer

    tok = script.build_tokenizer()
    cfg = GRPOConfig(output_dir=str(tmp_path), run_name="spec check", max_steps=1, per_device_train_batch_size=8,
                     num_generations=4, max_completion_length=8, use_cpu=True, bf16=False, report_to="none",
                     save_strategy="no", disable_tqdm=True)
    tr = RollMuxGRPOTrainer(model=script.build_model(tok, 0), reward_funcs=script.copy_reward, args=cfg,
                            train_dataset=script.build_dataset(16, 0), processing_class=tok, rollmux_attach=False,
                            rollmux_spec={"slo": 2.0})
    spec = tr.rollmux_job.spec
    n = sum(p.numel() for p in tr.model.parameters())
    assert spec.job_id == "spec-check" and spec.model_params_b == n / 1e9 and spec.slo == 2.0
    assert (spec.num_prompts, spec.responses_per_prompt, spec.max_response_tokens) == (2, 4, 8)
    assert spec.prompt_tokens == 2  # a digit and ">": one token per character, no special tokens added
    assert (spec.num_train_gpus, spec.num_rollout_gpus, spec.zero_stage, spec.train_precision) == (1, 1, 0, "fp32")
    tr.args.max_completion_length = None
    with pytest.raises(SpecFieldMissing, match="max_response_tokens: max_completion_length is None"):
        spec_from_trainer(tr)
    tr.rollmux_job.finish()


@pytest.fixture(scope="module")
def sched(ray_cluster, local_cluster_spec):
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from factories import FIXED_GROUPS, kill_scheduler_and_controllers

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    name = f"test-trl-{uuid.uuid4().hex[:6]}"
    # the two jobs must stay in the group Alg. 1 packs them into, so that the test can check their
    # turns node by node
    h = get_or_create_scheduler(local_cluster_spec, name=name, config=FIXED_GROUPS)
    assert SchedulerHandle(h).health().ok
    yield name, h, ray_cluster.address
    kill_scheduler_and_controllers(h, name)


@pytest.mark.ray
def test_trl_job_co_executed_with_another_job_is_bit_identical_to_plain_trl(plain_trl, sched, tmp_path):
    from actors.driver.runtime_client import group_timeline

    name, h, address = sched
    uid = uuid.uuid4().hex[:6]
    trl_id = f"trl-{uid}"
    # the TRL job's spec is derived from its trainer; the measured profile and SLO (as for the toy
    # jobs) make Alg. 1 pack it with the other job on one rollout + one training node
    extra = {k: v for k, v in toy_spec("x", "small").items() if k in ("measured", "slo", "mem_roll_gb", "mem_train_gb")}
    proc = _run(["--output-dir", str(tmp_path / "o"), "--run-name", trl_id], tmp_path / "rm.json",
                env={"ROLLMUX_ATTACH": "1", "ROLLMUX_SCHEDULER_NAME": name, "RAY_ADDRESS": address,
                     "ROLLMUX_SPEC": json.dumps(extra)},
                timeline=tmp_path / "tl.json", wrapper=True, background=True)
    try:
        rec = wait_until(lambda: SchedulerHandle(h).get_job(trl_id), timeout_s=180, what="the TRL job's admission")
        other = rollmux.Job(small_spec(f"other-{uid}"), attach=True, scheduler_name=name)
        assert other.info["group_id"] == rec.group_id, "both jobs in one co-execution group"
        rollout, train, publish = make_toy(other, "small", seed=3)
        done = {"n": 0}

        def other_loop():
            with other:
                for it in range(60):  # bounded; runs while the TRL job trains
                    train(rollout(it))
                    publish()
                    done["n"] += 1
                    if proc.poll() is not None and done["n"] >= 2:
                        break

        t = threading.Thread(target=other_loop)
        t.start()
        out, _ = proc.communicate(timeout=300)
        t.join(timeout=120)
        assert proc.returncode == 0, out[-4000:]
        assert not t.is_alive()
    finally:
        if proc.poll() is None:
            proc.kill()
    got = json.loads((tmp_path / "rm.json").read_text())
    assert got["trainer"] == "RollMuxGRPOTrainer"
    assert got["digests"] == plain_trl, "co-executed TRL must equal plain TRL after every step"
    tl = json.loads((tmp_path / "tl.json").read_text())
    assert tl["mode"] == "scheduled" and tl["group_id"] == rec.group_id
    assert [r["phase"] for r in tl["timeline"]] == ["rollout", "train", "sync"] * STEPS
    # the controller granted both jobs' phases on the same nodes, turn by turn
    ids = (trl_id, other.job_id)
    gtl = [r for r in group_timeline(other) if r["job_id"] in ids]
    assert {r["job_id"] for r in gtl} == set(ids)
    trl_recs = [r for r in gtl if r["job_id"] == trl_id]
    assert sorted((r["phase"], r["iteration"]) for r in trl_recs) == sorted(
        (p, i) for p in ("rollout", "train", "sync") for i in range(STEPS))
    for pool in ("rollout", "train"):
        order = [r["job_id"] for r in sorted(gtl, key=lambda r: r["start"]) if r["phase"] == pool]
        first, last = order.index(trl_id), len(order) - 1 - order[::-1].index(trl_id)
        window = order[first:last + 1]  # while the TRL job ran, the two jobs alternated on the node
        assert all(window[i] != window[i + 1] for i in range(len(window) - 1)), (pool, order)
    trl_done = SchedulerHandle(h).get_job(trl_id)
    assert trl_done.state == "finished" and trl_done.iterations_done == STEPS
