"""TRL integration: a ``GRPOTrainer`` whose phases run under RollMux permits (TRL 1.16).

Where TRL's phases are (``trl==1.16.*``, ``trl/trainer/grpo_trainer.py``): the Trainer's epoch
loop calls ``training_step``, which calls ``_prepare_inputs``; on the steps where a rollout is
due (every ``steps_per_generation x num_iterations`` steps) that calls
``_generate_and_score_completions``, which generates with ``_generate`` and then scores the
completions (rewards, the old and reference policies' log-probabilities); the batch is buffered
and split over the following steps. The backward pass is inside ``training_step``, the optimizer
step in the Trainer's loop after it, and with vLLM the weights reach the engine lazily at the
next generation (``VLLMGeneration.sync_weights``). A ``TrainerCallback`` alone cannot separate
rollout from training (both happen inside one ``training_step`` call); this subclass can:

- ``_generate`` (the generation itself) runs under the **rollout** permit;
- everything from the scoring of that batch up to the next generation (log-probabilities,
  forward / backward, every optimizer step on the buffered batch) runs under the **train** permit;
- before the next generation (and once at the end of ``train()``), the weight publication runs
  under the **sync** permit: with vLLM, ``VLLMGeneration.sync_weights()`` is called there (and
  TRL's lazy sync then finds the engine up to date); without vLLM generation uses the training
  model itself, so there is nothing to send and the sync permit only keeps the job's turn.

One RollMux iteration = one generation, its training steps, one sync. Permits come from
:class:`rollmux.Job` (scheduled when env ``ROLLMUX_ATTACH=1`` / ``ROLLMUX_JOB_ID`` is set and a
scheduler is reachable, else plain: granted at once, so the same script runs alone unchanged).

Offload: ``rollmux_offload="auto"`` (default) moves the policy model (and, for training, the
optimizer state) to host memory at the end of each permit and back to its device at the next one
when it lives on a GPU (the co-executed job then has the GPU memory); on CPU nothing moves.
``None`` disables it; a dict ``{"rollout": [...], "train": [...]}`` gives explicit targets
(objects with ``offload_states`` / ``sleep`` / ``offload`` and their reload counterparts, e.g.
TRL's colocated vLLM ``LLM`` with sleep mode).

The job spec is derived from the trainer (:func:`spec_from_trainer`); ``rollmux_spec`` (or env
``ROLLMUX_SPEC``, a JSON object) adds or overrides fields such as ``slo``.

Env ``ROLLMUX_TIMELINE_OUT``: a file the job's permit records are written to when ``train()``
ends (JSON: ``job_id``, ``mode``, ``group_id``, ``timeline``).

One-line wrapper for an existing script (swaps ``trl.GRPOTrainer`` for this class, then runs the
script as ``__main__``)::

    python -m rollmux.integrations.trl train.py --your --args

Progress: TRL's transformers ``generate`` returns the whole batch at once, so a rollout cannot
be split and no progress is reported (long-tail migration does not act on TRL jobs).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import sys
from typing import Any, Optional

import torch
from trl import GRPOTrainer

from rollmux.integrations.permits import PhaseSequencer
from rollmux.integrations.protocol import Underivable, build_spec

PROMPT_SCAN_ROWS = 1024  # prompts tokenized to find the longest (the spec's prompt_tokens)


@contextlib.contextmanager
def preserved_rng():
    """Keep Python's, NumPy's and torch's global RNG states across the block (attaching to a
    Ray cluster must not perturb a seeded run: co-executed == plain, bit for bit)."""
    import numpy as np

    py, npst, th = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npst)
        torch.random.set_rng_state(th)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _job_id(args) -> str:
    raw = getattr(args, "run_name", None) or os.path.basename(os.path.normpath(str(args.output_dir or "trl-grpo")))
    jid = re.sub(r"[^A-Za-z0-9._-]+", "-", str(raw)).strip("-._") or "trl-grpo"
    return jid[:128]


def _prompt_tokens(trainer) -> Any:
    ds = trainer.train_dataset
    tok = trainer.processing_class
    tok = getattr(tok, "tokenizer", tok)  # a processor wraps its tokenizer
    try:
        n = min(len(ds), PROMPT_SCAN_ROWS)
        rows = ds.select(range(n)) if hasattr(ds, "select") else [ds[i] for i in range(n)]
    except TypeError:
        return Underivable("the training dataset has no length (an iterable dataset): its prompt lengths are unknown")
    longest = 0
    for row in rows:
        p = row.get("prompt") if isinstance(row, dict) else None
        if p is None:
            return Underivable("the training dataset rows have no 'prompt' column")
        if isinstance(p, str):
            ids = tok(p, add_special_tokens=True)["input_ids"]
        elif getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(p, tokenize=True, add_generation_prompt=True)
            ids = ids["input_ids"] if isinstance(ids, dict) else ids
        else:
            return Underivable("conversational prompts and a tokenizer without a chat template")
        longest = max(longest, len(ids))
    return longest or Underivable("the training dataset is empty")


def spec_from_trainer(trainer, overrides: Optional[dict] = None):
    """The :class:`~rollmux.models.JobSpec` of a GRPO trainer (after ``GRPOTrainer.__init__``).

    Derived: ``job_id`` (``run_name``, else the output folder's name, made a valid id),
    ``model_params_b`` (the policy's parameter count), ``responses_per_prompt``
    (``num_generations``), ``num_prompts`` (``generation_batch_size / num_generations``: the
    prompts of one generation batch), ``max_response_tokens`` (``max_completion_length``),
    ``prompt_tokens`` (the longest of the first 1,024 dataset prompts, tokenized),
    ``num_train_gpus`` (the trainer's processes), ``num_rollout_gpus`` (the same processes when
    generation runs in them: no vLLM or vLLM colocated; not derivable for ``vllm_mode="server"``),
    ``train_precision`` (bf16 -> ``bf16_mixed``, else ``fp32``) and ``zero_stage`` (DeepSpeed's
    stage, 3 under FSDP, else 0).

    Raises: SpecFieldMissing naming what cannot be derived and was not given;
    pydantic.ValidationError for an out-of-range value (naming the field).
    """
    args = trainer.args
    n_proc = max(1, int(getattr(trainer.accelerator, "num_processes", 1) or 1))
    gen = int(args.num_generations)
    gbs = getattr(args, "generation_batch_size", None)
    derived: dict[str, Any] = {
        "job_id": _job_id(args),
        "model_params_b": sum(p.numel() for p in trainer.model.parameters()) / 1e9,
        "responses_per_prompt": gen,
        "num_prompts": (int(gbs) // gen) if gbs else Underivable("generation_batch_size is not set"),
        "max_response_tokens": (int(args.max_completion_length) if args.max_completion_length
                                else Underivable("max_completion_length is None (no generation cap)")),
        "prompt_tokens": _prompt_tokens(trainer),
        "num_train_gpus": n_proc,
        "num_rollout_gpus": (Underivable("vllm_mode='server': the vLLM server's GPUs are not in the trainer's config")
                             if args.use_vllm and args.vllm_mode == "server" else n_proc),
        "train_precision": "bf16_mixed" if args.bf16 else "fp32",
    }
    plugin = getattr(getattr(trainer.accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is not None:
        derived["zero_stage"] = int(plugin.zero_stage)
    elif getattr(trainer, "is_fsdp_enabled", False):
        derived["zero_stage"] = 3
    else:
        derived["zero_stage"] = 0
    return build_spec("TRL", derived, overrides)


class TorchOffload:
    """Offload target: the trainer's model (and optionally its optimizer state) to host memory
    and back to ``home`` (the accelerator's device); exact copies, so a round trip changes no
    bit. Nothing moves when ``home`` is the CPU."""

    def __init__(self, trainer, optimizer: bool, home):
        self.trainer, self.optimizer, self.home = trainer, optimizer, torch.device(home)
        self.offloads = self.reloads = 0

    def _move(self, dev: torch.device) -> None:
        self.trainer.model.to(dev)
        opt = getattr(self.trainer, "optimizer", None) if self.optimizer else None
        inner = getattr(opt, "optimizer", opt)  # accelerate wraps the torch optimizer
        for st in (getattr(inner, "state", None) or {}).values():
            for k, v in list(st.items()):
                if isinstance(v, torch.Tensor) and v.device != dev and not (k == "step" and v.dim() == 0):
                    st[k] = v.to(dev)

    def offload(self) -> None:
        if self.home.type == "cpu":
            return
        self._move(torch.device("cpu"))
        self.offloads += 1
        torch.cuda.empty_cache()

    def load(self) -> None:
        if self.home.type == "cpu":
            return
        self._move(self.home)
        self.reloads += 1


class DeepSpeedOffload:
    """Offload target of a DeepSpeed-wrapped trainer: the engine's ``offload_states`` /
    ``reload_states`` (found when training started; before that there is nothing to move)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def _engine(self):
        eng = getattr(self.trainer, "deepspeed", None) or getattr(self.trainer, "model_wrapped", None)
        return eng if callable(getattr(eng, "offload_states", None)) else None

    def offload(self) -> None:
        eng = self._engine()
        if eng is not None and getattr(eng, "zero_optimization_stage", lambda: 0)() > 0:
            eng.offload_states()

    def load(self) -> None:
        eng = self._engine()
        if eng is not None and getattr(eng.optimizer, "offloaded_states", None):
            eng.reload_states()


def auto_offload(trainer) -> dict[str, list]:
    """The default offload targets: DeepSpeed's own states under DeepSpeed, nothing under FSDP
    (its sharded parameters are not moved behind its back), else the model (rollout) and the
    model + optimizer (training) to host memory when they live on a GPU."""
    if getattr(trainer, "is_deepspeed_enabled", False):
        return {"train": [DeepSpeedOffload(trainer)], "sync": []}
    if getattr(trainer, "is_fsdp_enabled", False):
        return {}
    home = trainer.accelerator.device
    return {"rollout": [TorchOffload(trainer, optimizer=False, home=home)],
            "train": [TorchOffload(trainer, optimizer=True, home=home)], "sync": []}


class RollMuxGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with its rollout, training and weight publication under RollMux permits
    (see the module docstring). Takes every ``GRPOTrainer`` argument, plus:

    Args:
        rollmux_job: an existing :class:`rollmux.Job` to run under (default: one created from
            :func:`spec_from_trainer`, scheduled or plain as the environment says).
        rollmux_spec: JobSpec fields added to / overriding the derived spec (also env
            ``ROLLMUX_SPEC``, JSON; the argument wins).
        rollmux_offload: ``"auto"`` | None | ``{"rollout": [...], "train": [...]}`` (module docstring).
        rollmux_attach: passed to :class:`rollmux.Job` (None: decided from the environment).
    Raises: SpecFieldMissing (a spec field cannot be derived), AdmissionRefused (the scheduler
    refused the job), and whatever ``GRPOTrainer`` raises.
    """

    def __init__(self, *args, rollmux_job=None, rollmux_spec: Optional[dict] = None, rollmux_offload: Any = "auto",
                 rollmux_attach: Optional[bool] = None, **kwargs):
        super().__init__(*args, **kwargs)
        import rollmux

        if rollmux_job is None:
            env = json.loads(os.environ.get("ROLLMUX_SPEC") or "{}")
            spec = spec_from_trainer(self, {**env, **(rollmux_spec or {})})
            with preserved_rng():  # attaching (Ray) must not move a seeded run's random streams
                rollmux_job = rollmux.Job(spec, attach=rollmux_attach)
        self.rollmux_job = rollmux_job.driver_phases("rollout", "train", "sync")
        if rollmux_offload == "auto":
            self._rollmux_offload = auto_offload(self)
        else:
            self._rollmux_offload = dict(rollmux_offload or {})
        self.rollmux = PhaseSequencer(self.rollmux_job, offload=self._rollmux_offload)
        self.rollmux_published = 0  # weight publications done under a sync permit (vLLM)

    # ---- phases
    def _rollmux_sync(self) -> None:
        """The weight publication under the sync permit (after training, before the next rollout)."""
        if self.rollmux.current != "train":
            return
        with preserved_rng():
            self.rollmux.enter("sync")
        if self.use_vllm and self.state.global_step != getattr(self, "_last_loaded_step", None):
            self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step  # TRL's lazy sync finds the engine up to date
            self.rollmux_published += 1

    def _generate(self, prompts: list):
        if not self.model.training:  # evaluation generates inside the permit that is open
            return super()._generate(prompts)
        try:
            self._rollmux_sync()
            with preserved_rng():
                self.rollmux.enter("rollout")
            out = super()._generate(prompts)
            with preserved_rng():
                self.rollmux.enter("train")  # scoring, forward / backward and optimizer steps follow
        except BaseException as e:
            self.rollmux.close(e)
            raise
        return out

    def train(self, *args, **kwargs):
        """``Trainer.train`` under the permits; the job finishes (departs) when it returns, or
        is reported failed with the exception."""
        try:
            out = super().train(*args, **kwargs)
            self._rollmux_sync()
            self.rollmux.finish()
        except BaseException as e:
            self.rollmux.finish(e)
            raise
        finally:
            self._rollmux_dump()
        return out

    def _rollmux_dump(self) -> None:
        """Env ``ROLLMUX_TIMELINE_OUT``: write the job's permit records there (JSON list)."""
        path = os.environ.get("ROLLMUX_TIMELINE_OUT")
        if path:
            with open(path, "w") as f:
                json.dump({"job_id": self.rollmux_job.job_id, "mode": self.rollmux_job.mode,
                           "group_id": self.rollmux_job.info.get("group_id"),
                           "timeline": self.rollmux_job.timeline}, f, default=str)


def patch_trl() -> None:
    """Make ``trl.GRPOTrainer`` (and its module's name) :class:`RollMuxGRPOTrainer`."""
    import trl
    import trl.trainer.grpo_trainer as gt

    trl.GRPOTrainer = RollMuxGRPOTrainer
    gt.GRPOTrainer = RollMuxGRPOTrainer
    try:
        import trl.trainer as tt

        tt.GRPOTrainer = RollMuxGRPOTrainer
    except Exception:  # pragma: no cover - layouts without the re-export
        pass


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m rollmux.integrations.trl script.py [args...]``: run an unchanged TRL script
    with :class:`RollMuxGRPOTrainer` in place of ``trl.GRPOTrainer``."""
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(main.__doc__)
        return 0 if argv else 2
    patch_trl()
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
