"""verl integration: verl 0.9's PPO trainers with their phases under RollMux permits.

Written against verl 0.9.1 (``verl==0.9.1``; checked by ``tests/test_verl_integration.py``
against the pinned wheel's sources). An end-to-end verl run needs GPUs (verl's resource pools
hard-code GPU bundles) and has **not** run on this project's machines; what runs here is the
adapter's logic against stand-ins that call the hooks in verl's order, and the check that every
verl name it relies on exists in the pinned verl with the signature it uses.

**The v1 trainer** (``verl/trainer/ppo/v1/``, the default ``trainer.use_v1=True``; ``trainer.v1.
trainer_mode=sync``: ``PPOTrainerSync``). ``PPOTrainer.fit`` calls per step ``on_step_begin``,
then ``step`` (``prepare_step`` submits the prompts, ``_step_once`` waits for them between
``on_sample_begin`` / ``on_sample_end``, then reward, old_log_prob, ref, values, adv,
update_critic, update_actor), ``save_checkpoint``, ``on_step_end`` (the sync trainer updates the
rollout replicas' weights there), and validation between ``on_validate_begin`` / ``_end``.
:func:`rollmux_trainer_cls` subclasses a trainer class so that

- ``on_step_begin`` / ``on_validate_begin`` acquire the **rollout** permit (validation generates
  on the rollout replicas; the permit it takes is the next step's rollout);
- ``on_sample_end`` (after verl put its replicas to sleep) switches to the **train** permit, held
  through reward, log-probs, advantages, critic / actor updates and the checkpoint;
- ``on_step_end`` runs verl's weight update (``checkpoint_manager.update_weights``) under the
  **sync** permit;
- ``fit`` ends the job (finished, or failed with the exception); a begun iteration is completed
  with empty permits so the group's turns stay in order.

verl's ``update_weights`` wakes the rollout replicas, so the sync phase also touches the job's
rollout GPUs while it holds the (training-side) sync permit; the weights stay on the replicas
until the next rollout. The v1 asynchronous trainers (``colocate_async``, ``separate_async``)
serve rollouts continuously from a standalone pool, with no rollout per iteration that a RollMux
permit and staleness bound could delimit: :func:`rollmux_trainer_cls` refuses them. How an
asynchronous verl job (one-step-off-policy) is put under RollMux: ``docs/INTEGRATIONS.md``.

**Placement** (mechanism, so in ``actors.driver.verl_placement``: it creates Ray placement groups): the
trainer's ``global_pool`` (actor, reference, critic and, with verl's hybrid engine, the rollout
replicas) is placed on the job's RollMux training nodes: its placement groups carry the nodes'
``rollmux_node:<id>`` resources (bundles from :func:`node_bundles`), one per node in the job's
node order; ``trainer.nnodes`` must equal the number of those nodes. verl's hybrid engine
colocates rollout with training, so in that layout the job's RollMux rollout nodes hold no verl
process (declare ``num_rollout_gpus`` accordingly).

**The older ``RayPPOTrainer.fit()``** (``trainer.use_v1=False``) wraps every phase in
``marked_timer(name, ...)``; :func:`phases_by_timer` replaces the ``marked_timer`` that
``verl.trainer.ppo.ray_trainer`` uses, for the duration of a ``with`` block, by one that enters
the permit of the phase each name belongs to (:data:`PHASE_OF_TIMER`).

Use (v1, in verl's task runner process)::

    from actors.driver.verl_placement import register
    register()                      # adds trainer_mode "rollmux_sync" (PPOTrainerSync under RollMux,
                                    # its pools on the job's nodes; rollmux.integrations.verl.register: hooks only)
    # run verl with trainer.v1.trainer_mode=rollmux_sync (and ROLLMUX_ATTACH=1 to attach)

The job spec is derived from verl's config (:func:`spec_from_verl_config`); ``rollmux_spec`` /
env ``ROLLMUX_SPEC`` (JSON) add or override fields. Importing this module needs no verl; the
functions that touch verl import it when called.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any, Callable, Iterator, Optional

from rollmux.integrations.permits import PhaseSequencer
from rollmux.integrations.protocol import Underivable, build_spec

VERL_VERSION = "0.9.1"

#: The v1 trainer hooks this adapter overrides (all ``(self)``) and ``fit``'s parameters.
V1_HOOKS = ("on_step_begin", "on_step_end", "on_sample_begin", "on_sample_end", "on_validate_begin",
            "on_validate_end")
V1_FIT_PARAMS = ("self", "agent_loop_manager")

#: ``marked_timer`` names of ``RayPPOTrainer.fit`` -> the RollMux phase they run in.
PHASE_OF_TIMER = {
    "gen": "rollout", "testing": "rollout",
    "reward": "train", "old_log_prob": "train", "ref": "train", "values": "train", "adv": "train",
    "update_critic": "train", "update_actor": "train", "save_checkpoint": "train",
    "update_weights": "sync",
}


def _get(cfg: Any, path: str, default: Any = None) -> Any:
    """``cfg.a.b.c`` for OmegaConf configs, dataclasses and plain dicts (``default`` when absent)."""
    cur = cfg
    for k in path.split("."):
        if cur is None:
            return default
        if isinstance(cur, dict) or hasattr(cur, "get") and hasattr(cur, "keys"):
            cur = cur.get(k, None)
        else:
            cur = getattr(cur, k, None)
    return default if cur is None else cur


def model_params_b(model_path: Any) -> Any:
    """Parameters (billions) of the Hugging Face model at a local ``model_path``, counted on the
    meta device from its ``config.json`` (nothing is loaded); :class:`Underivable` otherwise."""
    model_path = os.path.expanduser(str(model_path)) if model_path else model_path
    if not model_path or not os.path.isfile(os.path.join(str(model_path), "config.json")):
        return Underivable(f"actor_rollout_ref.model.path {model_path!r} is not a local model folder "
                           "(its config.json cannot be read here)")
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(str(model_path))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        return sum(p.numel() for p in model.parameters()) / 1e9
    except Exception as e:  # an architecture transformers does not know, ...
        return Underivable(f"the model at {model_path!r} could not be instantiated on the meta device ({e})")


def spec_from_verl_config(config: Any, overrides: Optional[dict] = None):
    """The :class:`~rollmux.models.JobSpec` of a verl PPO / GRPO run (its Hydra config).

    Derived: ``job_id`` (``trainer.experiment_name`` made a valid id), ``model_params_b`` (the
    model at ``actor_rollout_ref.model.path``, counted on the meta device), ``num_prompts``
    (``data.train_batch_size``), ``responses_per_prompt`` (``actor_rollout_ref.rollout.n``),
    ``prompt_tokens`` / ``max_response_tokens`` (``data.max_prompt_length`` /
    ``data.max_response_length``), ``num_train_gpus`` (``trainer.nnodes x
    trainer.n_gpus_per_node``), ``num_rollout_gpus`` (a standalone rollout pool's
    ``actor_rollout_ref.rollout.nnodes x n_gpus_per_node``, else the training GPUs: verl's hybrid
    engine generates on them), ``zero_stage`` (3 for the FSDP strategies).

    Raises: SpecFieldMissing naming what cannot be derived; pydantic.ValidationError.
    """
    name = str(_get(config, "trainer.experiment_name", "") or "verl-ppo")
    jid = (re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._") or "verl-ppo")[:128]

    def num(path: str, what: str) -> Any:
        v = _get(config, path)
        return int(v) if isinstance(v, (int, float)) and v > 0 else Underivable(f"{path} ({what}) is not set")

    nnodes, ngpus = _get(config, "trainer.nnodes"), _get(config, "trainer.n_gpus_per_node")
    train_gpus = int(nnodes) * int(ngpus) if nnodes and ngpus else Underivable("trainer.nnodes / n_gpus_per_node not set")
    rn, rg = _get(config, "actor_rollout_ref.rollout.nnodes", 0), _get(config, "actor_rollout_ref.rollout.n_gpus_per_node", 0)
    derived: dict[str, Any] = {
        "job_id": jid,
        "model_params_b": model_params_b(_get(config, "actor_rollout_ref.model.path")),
        "num_prompts": num("data.train_batch_size", "prompts per step"),
        "responses_per_prompt": num("actor_rollout_ref.rollout.n", "responses per prompt"),
        "prompt_tokens": num("data.max_prompt_length", "prompt cap"),
        "max_response_tokens": num("data.max_response_length", "response cap"),
        "num_train_gpus": train_gpus,
        "num_rollout_gpus": int(rn) * int(rg) if rn and rg else train_gpus,
    }
    if str(_get(config, "actor_rollout_ref.actor.strategy", "")).startswith("fsdp"):
        derived["zero_stage"] = 3
    return build_spec("verl", derived, overrides)


def _make_job(config: Any, rollmux_spec: Optional[dict], attach: Optional[bool]):
    import rollmux

    env = json.loads(os.environ.get("ROLLMUX_SPEC") or "{}")
    spec = spec_from_verl_config(config, {**env, **(rollmux_spec or {})})
    return rollmux.Job(spec, attach=attach).driver_phases("rollout", "train", "sync")


class RollMuxV1Hooks:
    """Mixin for a verl v1 ``PPOTrainer`` subclass (put it first in the bases; see the module
    docstring). ``rollmux_job``: an existing :class:`rollmux.Job` (default: derived from the
    config); ``rollmux_spec``: spec overrides; ``rollmux_attach``: passed to the Job."""

    rollmux_job: Any = None

    def __init__(self, config, *args, rollmux_job=None, rollmux_spec: Optional[dict] = None,
                 rollmux_attach: Optional[bool] = None, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.rollmux_job = rollmux_job or _make_job(config, rollmux_spec, rollmux_attach)
        self.rollmux_job.driver_phases("rollout", "train", "sync")
        self.rollmux = PhaseSequencer(self.rollmux_job)

    # ---- phases
    def on_validate_begin(self):
        self.rollmux.enter("rollout")
        return super().on_validate_begin()

    def on_step_begin(self):
        self.rollmux.enter("rollout")
        return super().on_step_begin()

    def on_sample_end(self):
        out = super().on_sample_end()  # the sync trainer puts its replicas to sleep here
        self.rollmux.enter("train")
        return out

    def on_step_end(self):
        self.rollmux.enter("sync")
        try:
            out = super().on_step_end()  # checkpoint_manager.update_weights
        except BaseException as e:
            self.rollmux.close(e)
            raise
        self.rollmux.close()
        return out

    def fit(self, *args, **kwargs):
        try:
            out = super().fit(*args, **kwargs)
        except BaseException as e:
            self.rollmux.finish(e)
            raise
        self.rollmux.finish()
        return out


def rollmux_trainer_cls(base: type, extra_bases: tuple = ()) -> type:
    """A subclass of the verl v1 trainer class ``base`` with :class:`RollMuxV1Hooks` (and
    ``extra_bases`` before it, e.g. ``actors.driver.verl_placement.PinnedPlacement``).

    Raises ValueError for verl's v1 asynchronous trainers (their rollout is a continuous service:
    no rollout per iteration for a permit to bound) and TypeError for a class without the v1 hooks."""
    missing = [h for h in V1_HOOKS + ("fit",) if not callable(getattr(base, h, None))]
    if missing:
        raise TypeError(f"{base.__name__} is not a verl v1 trainer: it lacks {', '.join(missing)}")
    if "async" in base.__name__.lower() or "async" in base.__module__.lower():
        raise ValueError(f"{base.__name__}: verl's v1 asynchronous trainers serve rollouts continuously from a "
                         "standalone pool, with no rollout per iteration a RollMux permit could bound (use "
                         "trainer.v1.trainer_mode=sync; asynchronous jobs: docs/INTEGRATIONS.md)")
    return type(f"RollMux{base.__name__}", (*extra_bases, RollMuxV1Hooks, base), {"__module__": base.__module__})


def register(name: str = "rollmux_sync", extra_bases: tuple = ()) -> type:
    """Register ``PPOTrainerSync`` under RollMux as verl trainer mode ``name`` (call it in the
    process that builds the trainer: verl's task runner). Returns the class. Needs verl. The
    placement-pinning variant is ``actors.driver.verl_placement.register``."""
    from verl.trainer.ppo.v1.trainer_base import register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    cls = rollmux_trainer_cls(PPOTrainerSync, extra_bases)
    return register_trainer(name)(cls)


# ---- placement --------------------------------------------------------------------------------

def node_bundles(process_on_nodes: list[int], nodes: list[str], *, cpus: int, device: Optional[str]) -> list[list[dict]]:
    """Placement-group bundles, one group per RollMux node: ``process_on_nodes[i]`` bundles of
    ``{"CPU": cpus, device: 1, "rollmux_node:<nodes[i]>": 0.001}`` (``device`` None: CPU only).
    Raises ValueError when the counts differ (``trainer.nnodes`` vs the job's nodes)."""
    from rollmux.nodes import node_resource

    if len(process_on_nodes) != len(nodes):
        raise ValueError(f"verl resource pool spans {len(process_on_nodes)} node(s) (trainer.nnodes) but RollMux "
                         f"placed the job on {len(nodes)}: {nodes}")
    out = []
    for count, node in zip(process_on_nodes, nodes):
        b = {"CPU": cpus, node_resource(node): 0.001}
        if device:
            b[device] = 1
        out.append([dict(b) for _ in range(int(count))])
    return out


# ---- the older RayPPOTrainer.fit() -------------------------------------------------------------

@contextlib.contextmanager
def phases_by_timer(trainer: Any, job: Any = None, *, module: Any = None) -> Iterator[PhaseSequencer]:
    """Run ``RayPPOTrainer.fit()`` inside with its phases under RollMux permits::

        with phases_by_timer(trainer):
            trainer.fit()

    ``verl.trainer.ppo.ray_trainer.marked_timer`` is replaced for the block by a timer that
    enters the permit of :data:`PHASE_OF_TIMER` [name] before timing (other names, e.g. "step",
    time as before); the job finishes when the block ends (failed on an exception). ``job``:
    default derived from ``trainer.config``; ``module``: where ``marked_timer`` lives (tests)."""
    if module is None:
        import verl.trainer.ppo.ray_trainer as module
    job = job or _make_job(trainer.config, None, None)
    seq = PhaseSequencer(job.driver_phases("rollout", "train", "sync"))
    original: Callable = module.marked_timer

    @contextlib.contextmanager
    def timer(name, *args, **kwargs):
        phase = PHASE_OF_TIMER.get(str(name))
        if phase is not None:
            seq.enter(phase)
        with original(name, *args, **kwargs) as t:
            yield t
        if phase == "sync":
            seq.close()

    module.marked_timer = timer
    try:
        yield seq
    except BaseException as e:
        module.marked_timer = original
        seq.finish(e)
        raise
    module.marked_timer = original
    seq.finish()
