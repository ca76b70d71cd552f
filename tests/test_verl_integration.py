"""verl integration (rollmux/integrations/verl.py).

verl 0.9.1 cannot be installed into the project's environment (it pins transformers < 5.11) and
cannot train without GPUs, so:

- the adapter's behaviour runs against stand-in trainers that call the hooks in the order verl's
  ``PPOTrainer.fit`` / ``RayPPOTrainer.fit`` do (plain mode: permits granted at once);
- every verl name the adapter relies on (classes, hook methods and their parameters, the calls
  inside ``fit`` / ``_step_once`` / ``_setup``, ``marked_timer``'s phase names, the resource pool
  attributes, the config keys of the spec) is checked in the pinned wheel's own sources with
  ``ast`` (the wheel, 1.7 MB, is downloaded once into ``.cache/wheels``; without a package index
  that check is skipped and says it did not run);
- where a separate verl environment exists (``.venv-verl``, made by ``scripts/verl_env.sh``; or
  env ``ROLLMUX_VERL_PYTHON``), the adapter is imported there and subclasses verl's real ``PPOTrainerSync``.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rollmux
from factories import small_spec
from rollmux.integrations import SpecFieldMissing
from rollmux.integrations import verl as adapter

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = ROOT / ".cache" / "wheels"


# ---- stand-ins calling the hooks in verl's order ----------------------------------------------

class FakeV1Trainer:
    """Calls the v1 hooks as verl 0.9.1's ``PPOTrainer.fit`` does (validation before training and
    every ``test_freq`` steps; per step: on_step_begin, prepare_step, on_sample_begin, sample,
    on_sample_end, reward .. update_actor, save_checkpoint, on_step_end); logs each action with
    the RollMux permit open at that moment."""

    def __init__(self, config):
        self.config = config
        self.log: list = []
        self.pools = None

    def _now(self, what):
        seq = getattr(self, "rollmux", None)
        self.log.append((what, seq.current if seq is not None else None))

    def _init_resource_pool_mgr(self):
        self.resource_pool_manager = "verl's manager"

    def on_step_begin(self):
        self._now("on_step_begin")

    def on_sample_begin(self):
        self._now("on_sample_begin")

    def on_sample_end(self):
        self._now("sleep_replicas")

    def on_step_end(self):
        self._now("update_weights")

    def on_validate_begin(self):
        self._now("validate_begin")

    def on_validate_end(self):
        self._now("validate_end")

    def fit(self, agent_loop_manager):
        steps, test_freq = self.config["steps"], self.config["test_freq"]
        self.on_validate_begin()
        self._now("validate")
        self.on_validate_end()
        for step in range(1, steps + 1):
            self.on_step_begin()
            self._now("generate")
            self.on_sample_begin()
            self.on_sample_end()
            for name in ("reward", "old_log_prob", "ref", "adv", "update_actor", "save_checkpoint"):
                self._now(name)
            self.on_step_end()
            if step % test_freq == 0:
                self.on_validate_begin()
                self._now("validate")
                self.on_validate_end()
        return "done"


class FakeAsyncTrainer(FakeV1Trainer):
    pass


FakeAsyncTrainer.__name__ = "PPOTrainerColocateAsync"


def test_v1_hooks_put_verl_phases_under_the_right_permits():
    from actors.driver.verl_placement import trainer_cls

    job = rollmux.Job(small_spec("verl-v1"), attach=False)
    cls = trainer_cls(FakeV1Trainer)
    assert [c.__name__ for c in cls.__mro__[:4]] == ["RollMuxFakeV1Trainer", "PinnedPlacement", "RollMuxV1Hooks",
                                                     "FakeV1Trainer"]
    tr = cls({"steps": 4, "test_freq": 2}, rollmux_job=job)
    tr._init_resource_pool_mgr()
    assert tr.resource_pool_manager == "verl's manager"  # plain mode: nothing to pin
    assert tr.fit(None) == "done"
    where = {}
    for what, permit in tr.log:
        where.setdefault(what, set()).add(permit)
    assert where["generate"] == {"rollout"} and where["validate"] == {"rollout"}
    assert where["sleep_replicas"] == {"rollout"}  # verl's own offload runs before the permit moves on
    assert all(where[n] == {"train"} for n in ("reward", "old_log_prob", "ref", "adv", "update_actor",
                                              "save_checkpoint"))
    assert where["update_weights"] == {"sync"}
    phases = [r["phase"] for r in job.timeline]
    # validation before training shares the first step's rollout permit; the validation after
    # step 2 takes step 3's; the one after the last step opens a rollout the departure ends
    assert phases == ["rollout", "train", "sync"] * 4 + ["rollout"]
    assert job.iteration == 4 and job.lifecycle == "finished"
    assert not any(r["empty"] for r in job.timeline)


def test_a_failing_verl_step_fails_the_job():
    class Failing(FakeV1Trainer):
        def on_step_end(self):
            raise RuntimeError("update_weights failed")

    job = rollmux.Job(small_spec("verl-fail"), attach=False)
    tr = adapter.rollmux_trainer_cls(Failing)({"steps": 2, "test_freq": 5}, rollmux_job=job)
    with pytest.raises(RuntimeError, match="update_weights failed"):
        tr.fit(None)
    assert job.lifecycle == "failed" and job.timeline[-1]["phase"] == "sync" and not job.timeline[-1]["ok"]


def test_async_and_non_v1_trainers_are_refused():
    with pytest.raises(ValueError, match="no rollout per iteration"):
        adapter.rollmux_trainer_cls(FakeAsyncTrainer)
    with pytest.raises(TypeError, match="lacks"):
        adapter.rollmux_trainer_cls(object)


def test_ray_ppo_trainer_timer_names_enter_their_permits():
    log = []

    class Module:  # stands in for verl.trainer.ppo.ray_trainer
        @staticmethod
        @contextlib.contextmanager
        def marked_timer(name, timing_raw, color=None):
            log.append((name, seq_ref[0].current if seq_ref else None))
            yield

    seq_ref: list = []
    original = Module.marked_timer

    class Trainer:
        config: dict = {}

        def fit(self):
            for _ in range(2):
                with Module.marked_timer("step", {}):
                    for n in ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic",
                              "update_actor", "save_checkpoint", "update_weights"):
                        with Module.marked_timer(n, {}, color="red"):
                            pass
                with Module.marked_timer("testing", {}):
                    pass

    job = rollmux.Job(small_spec("verl-ray"), attach=False)
    with adapter.phases_by_timer(Trainer(), job, module=Module) as seq:
        seq_ref.append(seq)
        Trainer().fit()
    assert Module.marked_timer is original and job.lifecycle == "finished"
    got = dict(log)
    assert {n: got[n] for n in adapter.PHASE_OF_TIMER} == adapter.PHASE_OF_TIMER
    assert [r["phase"] for r in job.timeline] == ["rollout", "train", "sync", "rollout", "train", "sync", "rollout"]


def test_spec_from_verl_config_counts_the_model_and_names_missing_fields(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=2).save_pretrained(tmp_path)
    cfg = {"trainer": {"experiment_name": "gsm8k qwen", "nnodes": 1, "n_gpus_per_node": 8},
           "data": {"train_batch_size": 256, "max_prompt_length": 512, "max_response_length": 1024},
           "actor_rollout_ref": {"model": {"path": str(tmp_path)}, "rollout": {"n": 5, "nnodes": 0},
                                 "actor": {"strategy": "fsdp2"}}}
    spec = adapter.spec_from_verl_config(cfg, {"slo": 1.8})
    from transformers import LlamaForCausalLM

    n = sum(p.numel() for p in LlamaForCausalLM(LlamaConfig.from_pretrained(tmp_path)).parameters())
    assert spec.job_id == "gsm8k-qwen" and spec.model_params_b == n / 1e9
    assert (spec.num_prompts, spec.responses_per_prompt, spec.prompt_tokens, spec.max_response_tokens) == (256, 5, 512, 1024)
    assert (spec.num_train_gpus, spec.num_rollout_gpus, spec.zero_stage, spec.slo) == (8, 8, 3, 1.8)
    cfg["actor_rollout_ref"]["model"]["path"] = "Qwen/Qwen2.5-7B"  # a hub name: not counted here
    del cfg["data"]["max_response_length"]
    with pytest.raises(SpecFieldMissing) as e:
        adapter.spec_from_verl_config(cfg)
    assert set(e.value.missing) == {"model_params_b", "max_response_tokens"}
    assert "not a local model folder" in str(e.value) and "data.max_response_length" in str(e.value)


def test_node_bundles_pin_each_placement_group_to_its_rollmux_node():
    b = adapter.node_bundles([2, 1], ["train-0", "train-3"], cpus=3, device="GPU")
    assert b == [[{"CPU": 3, "rollmux_node:train-0": 0.001, "GPU": 1}] * 2,
                 [{"CPU": 3, "rollmux_node:train-3": 0.001, "GPU": 1}]]
    with pytest.raises(ValueError, match="trainer.nnodes"):
        adapter.node_bundles([8], ["train-0", "train-1"], cpus=1, device=None)


# ---- the pinned verl's own sources -------------------------------------------------------------

@pytest.fixture(scope="module")
def verl_sources() -> dict[str, str]:
    want = WHEEL_DIR / f"verl-{adapter.VERL_VERSION}-py3-none-any.whl"
    if not want.is_file():
        WHEEL_DIR.mkdir(parents=True, exist_ok=True)
        try:
            p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                f"verl=={adapter.VERL_VERSION}", "-d", str(WHEEL_DIR)],
                               capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            p = None
        if p is None or p.returncode != 0 or not want.is_file():
            pytest.skip(f"could not download verl=={adapter.VERL_VERSION} (no package index?): the check of the "
                        "adapter against verl's sources did NOT run")
    with zipfile.ZipFile(want) as z:
        return {n: z.read(n).decode() for n in z.namelist() if n.startswith("verl/") and n.endswith((".py", ".yaml"))}


def _class(src: str, name: str) -> ast.ClassDef:
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _params(fn: ast.FunctionDef) -> tuple[str, ...]:
    return tuple(a.arg for a in fn.args.args)


def _self_calls(fn: ast.FunctionDef) -> list[str]:
    """``self.x(...)`` / ``self.a.b(...)`` calls in source order, as dotted names."""
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            parts, f = [], node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name) and f.id == "self":
                out.append((node.lineno, node.col_offset, ".".join(reversed(parts))))
    return [n for _, _, n in sorted(out)]


def _timer_names(fn: ast.FunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "marked_timer" and node.args:
            a = node.args[0]
            if isinstance(a, ast.Constant):
                names.add(a.value)
            elif ast.unparse(a) == "str(Role.RefPolicy)":
                names.add("<Role.RefPolicy>")
    return names


def test_the_v1_hooks_the_adapter_overrides_exist_in_the_pinned_verl(verl_sources):
    base = verl_sources["verl/trainer/ppo/v1/trainer_base.py"]
    ppo = _methods(_class(base, "PPOTrainer"))
    for h in adapter.V1_HOOKS + ("on_train_end", "_init_resource_pool_mgr"):
        assert h in ppo and _params(ppo[h]) == ("self",), h
    assert _params(ppo["fit"]) == adapter.V1_FIT_PARAMS and _params(ppo["__init__"]) == ("self", "config")
    fit = _self_calls(ppo["fit"])
    order = [c for c in fit if c in ("on_validate_begin", "on_train_begin", "on_step_begin", "step", "on_step_end")]
    assert order[:2] == ["on_validate_begin", "on_train_begin"]
    assert order[2:5] == ["on_step_begin", "step", "on_step_end"]
    once = _self_calls(ppo["_step_once"])
    s, e = once.index("on_sample_begin"), once.index("on_sample_end")
    assert s < once.index("replay_buffer.sample") < e < once.index("_compute_old_log_prob") < once.index("_update_actor")
    setup = _self_calls(ppo["_setup"])
    assert setup.index("_init_resource_pool_mgr") < setup.index("resource_pool_manager.create_resource_pool")
    assert "def register_trainer(name: str)" in base
    sync = verl_sources["verl/trainer/ppo/v1/trainer_sync.py"]
    cls = _class(sync, "PPOTrainerSync")
    assert [ast.unparse(b) for b in cls.bases] == ["PPOTrainer"]
    assert [ast.unparse(d) for d in cls.decorator_list] == ["register_trainer('sync')"]
    m = _methods(cls)
    assert "checkpoint_manager.update_weights" in _self_calls(m["on_step_end"])
    assert "checkpoint_manager.sleep_replicas" in _self_calls(m["on_sample_end"])
    for async_mod, name in (("trainer_colocate_async", "PPOTrainerColocateAsync"),
                            ("trainer_separate_async", "PPOTrainerSeparateAsync")):
        _class(verl_sources[f"verl/trainer/ppo/v1/{async_mod}.py"], name)  # the names the refusal expects


def test_ray_ppo_trainer_phase_names_exist_in_the_pinned_verl(verl_sources):
    src = verl_sources["verl/trainer/ppo/ray_trainer.py"]
    assert "from verl.utils.debug import marked_timer" in src  # a module-level name phases_by_timer replaces
    fit = _methods(_class(src, "RayPPOTrainer"))["fit"]
    assert _params(fit) == ("self",)
    names = _timer_names(fit)
    want = set(adapter.PHASE_OF_TIMER) - {"ref"}
    assert want <= names, want - names
    assert "<Role.RefPolicy>" in names  # "ref": str(Role.RefPolicy)
    utils = verl_sources["verl/trainer/ppo/utils.py"]
    assert 'Role.RefPolicy: "ref"' in utils


def test_resource_pool_attributes_the_pinned_pool_uses_exist(verl_sources):
    src = verl_sources["verl/single_controller/ray/base.py"]
    pool = _methods(_class(src, "RayResourcePool"))
    assert {"process_on_nodes", "use_gpu", "name_prefix", "max_colocate_count", "detached"} <= set(_params(pool["__init__"]))
    assert _params(pool["get_placement_groups"]) == ("self", "strategy", "name", "device_name")
    assigned = {ast.unparse(t) for n in ast.walk(pool["__init__"]) if isinstance(n, ast.Assign) for t in n.targets}
    assert {"self.use_gpu", "self.name_prefix", "self.pgs", "self.detached"} <= assigned
    base = _methods(_class(verl_sources["verl/single_controller/base/worker_group.py"], "ResourcePool"))["__init__"]
    assigned = {ast.unparse(t) for n in ast.walk(base) if isinstance(n, ast.Assign) for t in n.targets}
    assert {"self._store", "self.max_colocate_count"} <= assigned
    mgr = _class(src, "ResourcePoolManager")
    assert "create_resource_pool" in _methods(mgr)
    assert "resource_pool_dict" in ast.unparse(mgr)


def test_config_keys_of_the_spec_exist_in_verls_ppo_config(verl_sources):
    import yaml

    cfg = yaml.safe_load(verl_sources["verl/trainer/config/_generated_ppo_trainer.yaml"])
    for path in ("trainer.experiment_name", "trainer.nnodes", "trainer.n_gpus_per_node", "data.train_batch_size",
                 "data.max_prompt_length", "data.max_response_length", "actor_rollout_ref.rollout.n",
                 "actor_rollout_ref.model.path", "actor_rollout_ref.actor.strategy",
                 "actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node",
                 "trainer.use_v1", "trainer.v1.trainer_mode"):
        cur = cfg
        for k in path.split("."):
            assert isinstance(cur, dict) and k in cur, path
            cur = cur[k]
    assert cfg["trainer"]["v1"]["trainer_mode"] == "sync" and cfg["trainer"]["use_v1"] is True


# ---- the adapter against verl's real classes (a separate verl environment) ---------------------

def _verl_python():
    for c in (os.environ.get("ROLLMUX_VERL_PYTHON"), ROOT / ".venv-verl" / "bin" / "python"):
        if c and Path(c).is_file():
            return Path(c)
    return None


PROBE = r"""
import inspect, json
import verl
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, get_trainer_cls
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.single_controller.ray.base import RayResourcePool, ResourcePoolManager
import rollmux.integrations.verl as a
import actors.driver.verl_placement as p
cls = p.register()
out = {"verl": verl.__version__, "registered": get_trainer_cls("rollmux_sync") is cls,
       "mro": [c.__name__ for c in cls.__mro__[:4]],
       "hooks": {h: list(inspect.signature(getattr(PPOTrainer, h)).parameters) for h in a.V1_HOOKS},
       "fit": list(inspect.signature(PPOTrainer.fit).parameters)}
mgr = ResourcePoolManager(resource_pool_spec={"global_pool": [2]}, mapping={})
pinned = p.pinned_pool_manager(mgr, {"global_pool": ["train-0"]})
out["pinned_manager"] = isinstance(pinned, ResourcePoolManager) and pinned.resource_pool_spec == {"global_pool": [2]}
print(json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_the_adapter_subclasses_verls_real_trainer_in_a_verl_environment():
    py = _verl_python()
    if py is None:
        pytest.skip("no verl 0.9.1 environment (bash scripts/verl_env.sh creates .venv-verl; or set "
                    "ROLLMUX_VERL_PYTHON): the import against verl's real classes did NOT run (its sources are checked)")
    p = subprocess.run([str(py), "-c", PROBE], env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["verl"] == adapter.VERL_VERSION and out["registered"] and out["pinned_manager"]
    assert out["mro"][:4] == ["RollMuxPPOTrainerSync", "PinnedPlacement", "RollMuxV1Hooks", "PPOTrainerSync"]
    assert all(ps == ["self"] for ps in out["hooks"].values()) and tuple(out["fit"]) == adapter.V1_FIT_PARAMS


def test_the_async_trainer_hooks_docs_integrations_names_exist_in_the_pinned_verl(verl_sources):
    """docs/INTEGRATIONS.md ("Asynchronous verl jobs") puts verl's one-step-off-policy trainer
    under RollMux through its phase methods: those methods, their order inside ``fit_step`` /
    ``_fit_generate`` (await rollout i, publish the weights, start rollout i + 1, then train i) and
    the fully-async and separate-async config keys it names exist in the pinned wheel."""
    one = verl_sources["verl/experimental/one_step_off_policy/ray_trainer.py"]
    cls = _class(one, "OneStepOffRayTrainer")
    assert [ast.unparse(b) for b in cls.bases] == ["SeparateRayPPOTrainer"]
    m = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for name in ("fit", "fit_step", "_fit_generate", "_async_gen_next_batch"):
        assert isinstance(m[name], ast.AsyncFunctionDef), name
    gen = _self_calls(m["_fit_generate"])
    assert gen.index("_fit_update_weights") < gen.index("_async_gen_next_batch")  # publish, then rollout i + 1
    step = _self_calls(m["fit_step"])
    phases = ["_fit_generate", "_fit_compute_reward", "_fit_compute_log_prob", "_fit_compute_ref_log_prob",
              "_fit_compute_critic", "_fit_compute_advantage", "_fit_update_critic", "_fit_update_actor"]
    assert [c for c in step if c in phases] == phases
    sep = _methods(_class(verl_sources["verl/experimental/separation/ray_trainer.py"], "SeparateRayPPOTrainer"))
    for name in phases[1:] + ["_fit_update_weights"]:
        assert name in sep, name
    assert "checkpoint_manager.update_weights" in _self_calls(sep["_fit_update_weights"])
    fa = verl_sources["verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml"]
    for key in ("staleness_threshold:", "trigger_parameter_sync_step:", "partial_rollout:"):
        assert key in fa, key
    ppo = verl_sources["verl/trainer/config/ppo_trainer.yaml"]
    assert "max_off_policy_threshold:" in ppo and "parameter_sync_step:" in ppo
