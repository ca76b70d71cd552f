"""Training backend on DeepSpeed ZeRO (CPU over gloo, or CUDA over NCCL).

Written against DeepSpeed 0.19's public API: ``deepspeed.accelerator.get_accelerator()`` (device
and communication backend: ``cpu`` + ``gloo`` on a CPU machine, ``cuda`` + ``nccl`` on a GPU
host), ``deepspeed.init_distributed``, ``deepspeed.initialize`` with a ZeRO config,
``engine.backward`` / ``engine.step``, ``engine.get_global_grad_norm``,
``deepspeed.zero.GatheredParameters`` (full weights under ZeRO-3) and, for warm start,
``engine.offload_states()`` / ``engine.reload_states()`` (ZeRO 1-3: the flat fp32 master weights,
the low-precision flat buffers, gradients and Adam moments move, not only module views).

Process group: DeepSpeed's engines use the process's default ``torch.distributed`` group. The
job's rank and world size come from its placement (its index among its training workers, and
their number). A multi-rank job's world meets through the job's own rendezvous store (``store``:
the key-value store its rank-0 training worker hosts on a port the kernel picks when it binds,
RollMux's per-job control plane), or at an explicit ``master_addr:master_port``; a world of one
uses an in-process store and binds no port (so two DeepSpeed workers on one host never collide). A process holds one default group at a time: every
single-rank DeepSpeed job hosted by a worker process shares its world of size 1; a job needing
another world replaces it once no live engine uses it (:meth:`DeepSpeedTrainBackend.close`, called
when a job leaves the worker), else :class:`BackendUnavailable` names the conflict.

The first ``init_distributed`` on CPU builds DeepSpeed's shared-memory comm op with ninja and the
C++ compiler (~1-1.5 min, cached under ``~/.cache/torch_extensions`` afterwards). ``torch_adam``
(default True) selects ``torch.optim.AdamW`` inside DeepSpeed instead of its FusedAdam / CPU Adam
ops (a CPU Adam build takes > 8 minutes).

The engine holds communicators, so it is *resident* (``rollmux_resident``): it stays alive in the
TrainWorker process between phases (RollMux §5 "the process and its control plane stay alive");
``offload()`` / ``load()`` call ``offload_states`` / ``reload_states``.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import torch

from actors.backends.base import BackendUnavailable, TrainBackend

try:  # import guard: DeepSpeed is a main dependency, but keep the CPU registry importable without it
    import deepspeed

    HAVE_DEEPSPEED = True
except Exception:  # pragma: no cover - broken installs
    HAVE_DEEPSPEED = False

_INIT_LOCK = threading.Lock()


#: ZeRO-1/2 reduce and all-gather bucket size, elements (DeepSpeed's default is 5e8: 2 GB fp32
#: buffers per bucket). Small buckets keep the engine's transient GPU memory low; a vLLM engine
#: starting on the same GPU profiles free memory and asserts it did not grow while it profiled,
#: which a ZeRO engine freeing 2 GB buckets meanwhile trips.
ZERO_BUCKET_ELEMENTS = 50_000_000


def zero_config(*, lr: float, max_grad_norm: float, stage: int, micro_batch: int, bf16: bool,
                torch_adam: bool = True, bucket_elements: int = ZERO_BUCKET_ELEMENTS) -> dict:
    """The DeepSpeed config dict used by :class:`DeepSpeedTrainBackend` (AdamW, no weight decay;
    ZeRO-1/2: ``reduce_bucket_size`` / ``allgather_bucket_size`` = ``bucket_elements``)."""
    params = {"lr": lr, "weight_decay": 0.0, "eps": 1e-8}
    if torch_adam:
        params["torch_adam"] = True
    zero: dict = {"stage": stage}
    if stage in (1, 2):
        zero.update(reduce_bucket_size=int(bucket_elements), allgather_bucket_size=int(bucket_elements))
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": params},
        "gradient_clipping": max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


# the world this process's default group belongs to: its key (None: single-rank, shared; else the
# job's rendezvous store object) and how many live engines use it
_WORLD: dict = {"key": None, "users": 0}


def ensure_process_group(rank: int, world_size: int, master_addr: str = "127.0.0.1",
                         master_port: Optional[int] = None, store=None) -> str:
    """Join the default process group DeepSpeed uses, over the accelerator's communication
    backend, and count this caller as one of its users (:func:`release_process_group`). A
    multi-rank world meets through ``store`` (the job's rendezvous store) when given, else at
    ``master_addr:master_port``. A world of another job (another store) or another rank / size
    replaces the current one once nothing uses it. Returns the backend name. Raises
    BackendUnavailable when this process's current world is still in use by another job."""
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    backend = get_accelerator().communication_backend_name()
    key = store if world_size > 1 else None
    with _INIT_LOCK:
        if dist.is_initialized():
            same = (dist.get_rank(), dist.get_world_size()) == (rank, world_size) and _WORLD["key"] is key
            if same:
                _WORLD["users"] += 1
                return backend
            if _WORLD["users"] > 0:
                raise BackendUnavailable(
                    f"train_backend 'deepspeed': this worker process already joined a DeepSpeed world as rank "
                    f"{dist.get_rank()} of {dist.get_world_size()}, still used by {_WORLD['users']} engine(s); a "
                    f"job as rank {rank} of {world_size} of another world needs its own process")
            import deepspeed.comm as ds_comm

            ds_comm.destroy_process_group()  # also drops DeepSpeed's cached groups of the old world
        if (store is not None and world_size > 1) or (world_size == 1 and master_port is None):
            # a multi-rank world meets through the job's store; a world of one meets nobody: an
            # in-process store, no port to bind or to race for
            st = dist.PrefixStore("deepspeed/", store) if world_size > 1 else dist.HashStore()
            os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world_size))  # DeepSpeed's checks
            dist.init_process_group(backend, store=st, rank=rank, world_size=world_size)
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
        else:
            if master_port is None:
                raise ValueError("deepspeed: a multi-rank job needs its rendezvous store or the master_port "
                                 "chosen by its rank 0")
            port = master_port
            os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR=master_addr,
                              MASTER_PORT=str(port))
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False,
                                       init_method=f"tcp://{master_addr}:{port}", rank=rank, world_size=world_size)
        _WORLD.update(key=key, users=1)
    return backend


def release_process_group() -> None:
    """One user of this process's DeepSpeed world is gone (its engine closed)."""
    with _INIT_LOCK:
        _WORLD["users"] = max(0, _WORLD["users"] - 1)


class DeepSpeedTrainBackend(TrainBackend):
    """ZeRO-``stage`` training of ``model`` on the accelerator's device (CPU or this process's GPU).

    Args:
        model: the policy (a transformers causal LM: ``model(input_ids=...).logits``).
        lr / max_grad_norm: AdamW learning rate (no weight decay, eps 1e-8) and gradient clipping.
        stage: ZeRO stage 0-3 (CPU: 1 and 2 are tested bit-identical to torch AdamW).
        micro_batch: ``train_micro_batch_size_per_gpu`` (DeepSpeed bookkeeping only).
        rank / world_size: this process's place in the job's training workers.
        store: the job's rendezvous store (multi-rank worlds meet there; RollMux's workers pass it).
        master_addr / master_port: the rendezvous without a store (a world of one needs neither).
        torch_adam: use ``torch.optim.AdamW`` inside DeepSpeed (no Adam op build).
        bucket_elements: ZeRO-1/2 reduce / all-gather bucket size, elements (:data:`ZERO_BUCKET_ELEMENTS`).
    Raises:
        BackendUnavailable: DeepSpeed missing, or this process belongs to another DeepSpeed world.
    """

    name = "deepspeed"
    rollmux_resident = True

    def __init__(self, model: torch.nn.Module, *, lr: float, max_grad_norm: float = 1.0, stage: int = 2,
                 micro_batch: int = 64, bf16: bool = False, rank: int = 0, world_size: int = 1,
                 master_addr: str = "127.0.0.1", master_port: Optional[int] = None, torch_adam: bool = True,
                 store=None, bucket_elements: int = ZERO_BUCKET_ELEMENTS) -> None:
        if not HAVE_DEEPSPEED:
            raise BackendUnavailable("train_backend 'deepspeed' needs the deepspeed package (pip install deepspeed ninja)")
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {stage}")
        from deepspeed.accelerator import get_accelerator

        acc = get_accelerator()
        self.comm_backend = ensure_process_group(rank, world_size, master_addr, master_port, store=store)
        self.closed = False
        self.stage = stage
        self.rank, self.world_size = rank, world_size
        self.device = acc.device_name() if acc.device_name() == "cpu" else f"{acc.device_name()}:{acc.current_device()}"
        cfg = zero_config(lr=lr, max_grad_norm=max_grad_norm, stage=stage, micro_batch=micro_batch, bf16=bf16,
                          torch_adam=torch_adam, bucket_elements=bucket_elements)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=None, config=cfg)
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
        """Optimizer states (fp32 master weights, flat buffers, gradients, Adam moments) to host
        memory with DeepSpeed's own ``offload_states`` (pinned on CUDA, plain on CPU)."""
        if self.offloaded or self.stage == 0:
            return
        self.engine.offload_states(pin_memory=self.device != "cpu")
        self.offloaded = True
        if torch.cuda.is_available() and self.device != "cpu":
            torch.cuda.empty_cache()

    def load(self) -> None:
        """``reload_states``: the offloaded states back to the device."""
        if not self.offloaded:
            return
        self.engine.reload_states()
        self.offloaded = False

    def offloaded_states(self) -> set:
        """The state kinds DeepSpeed reports offloaded now (empty after :meth:`load`)."""
        return {str(s.value) if hasattr(s, "value") else str(s) for s in getattr(self.engine.optimizer, "offloaded_states", ())}

    def close(self) -> None:
        """The job left this worker: drop the engine and release this process's DeepSpeed world
        (another job may then build its own). Idempotent."""
        if getattr(self, "closed", True):
            return
        self.closed = True
        try:
            self.engine.destroy()
        except Exception:
            pass
        release_process_group()
