"""Training backend on DeepSpeed ZeRO (GPU).

Written against DeepSpeed's public API: ``deepspeed.init_distributed``, ``deepspeed.initialize``
with a ZeRO config, ``engine.backward`` / ``engine.step``, ``engine.get_global_grad_norm``,
``deepspeed.zero.GatheredParameters`` (full weights under ZeRO-3) and, for warm start,
``engine.offload_states()`` / ``engine.reload_states()`` (DeepSpeed >= 0.16, ZeRO-3); with
older versions or stages offload falls back to moving the module to host memory.
Import-guarded: without DeepSpeed or CUDA the constructor raises
:class:`~actors.backends.BackendUnavailable`.

The engine holds NCCL communicators, so it is *resident* (``rollmux_resident``): it stays alive
in the TrainWorker process between phases (RollMux §5 "the process and its control plane stay
alive"); ``offload()`` / ``load()`` move its device state to and from host memory.
"""

from __future__ import annotations

import os

import torch

from actors.backends.base import BackendUnavailable, TrainBackend

try:  # import guard: DeepSpeed exists on GPU hosts only
    import deepspeed

    HAVE_DEEPSPEED = True
except Exception:  # pragma: no cover - CPU machines
    HAVE_DEEPSPEED = False


def zero_config(*, lr: float, max_grad_norm: float, stage: int, micro_batch: int, bf16: bool) -> dict:
    """The DeepSpeed config dict used by :class:`DeepSpeedTrainBackend` (AdamW, no weight decay)."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "eps": 1e-8}},
        "gradient_clipping": max_grad_norm,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
    }


class DeepSpeedTrainBackend(TrainBackend):
    """ZeRO-``stage`` training of ``model`` on this process's CUDA device (single- or multi-rank).

    Raises:
        BackendUnavailable: DeepSpeed or CUDA missing.
    """

    name = "deepspeed"
    rollmux_resident = True

    def __init__(self, model: torch.nn.Module, *, lr: float, max_grad_norm: float = 1.0, stage: int = 2,
                 micro_batch: int = 64, bf16: bool = False) -> None:
        if not HAVE_DEEPSPEED:
            raise BackendUnavailable("train_backend 'deepspeed' needs the deepspeed package (pip install 'rollmux[gpu]')")
        if not torch.cuda.is_available():
            raise BackendUnavailable("train_backend 'deepspeed' needs a CUDA device")
        for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": "29533"}.items():
            os.environ.setdefault(k, v)
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl")
        self.stage = stage
        self.device = f"cuda:{torch.cuda.current_device()}"
        cfg = zero_config(lr=lr, max_grad_norm=max_grad_norm, stage=stage, micro_batch=micro_batch, bf16=bf16)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                                  config=cfg)
        self.offloaded = False

    def forward(self, input_ids):
        return self.engine(input_ids=input_ids.to(self.engine.device)).logits.float()

    def backward_step(self, loss):
        self.engine.backward(loss)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def weights(self):
        module = self.engine.module
        if self.stage == 3:
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}

    def offload(self) -> None:
        if self.offloaded:
            return
        if hasattr(self.engine, "offload_states") and self.stage == 3:
            self.engine.offload_states()
        else:
            self.engine.module.to("cpu")
        self.offloaded = True
        torch.cuda.empty_cache()

    def load(self) -> None:
        if not self.offloaded:
            return
        if hasattr(self.engine, "reload_states") and self.stage == 3:
            self.engine.reload_states()
        else:
            self.engine.module.to(self.engine.device)
        self.offloaded = False
