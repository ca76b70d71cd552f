"""Training backend on plain torch: AdamW, gradient clipping, CPU or one CUDA device; data-parallel
over a job's process group when it trains on several workers (gradients averaged as DDP does)."""

from __future__ import annotations

import torch

from actors.backends.base import TrainBackend


class TorchTrainBackend(TrainBackend):
    """Plain torch training of ``model`` with AdamW (no weight decay, eps 1e-8).

    ``group``: a ``torch.distributed`` process group over the job's training workers (the job's
    own gloo group, not the process's default one, so jobs sharing a worker process never mix);
    each :meth:`backward_step` then averages the gradients over it before clipping and stepping
    (DDP's all-reduce of the flattened gradients, in parameter order), so every rank holds the same
    weights. The ranks must start from the same weights (same seed).
    """

    name = "torch"

    def __init__(self, model: torch.nn.Module, *, lr: float, max_grad_norm: float = 1.0, device: str = "cpu",
                 group=None) -> None:
        self.device = device
        self.group = group
        self.model = model.to(device).train()
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0, foreach=False)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids.to(self.device)).logits.float()

    def backward_step(self, loss):
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.group is not None:
            self._average_grads()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm, foreach=False)
        self.optimizer.step()
        return float(norm)

    def __getstate__(self) -> dict:  # the group is control plane: stays in the worker, re-attached per phase
        return {k: v for k, v in self.__dict__.items() if k != "group"}

    def __setstate__(self, st: dict) -> None:
        self.__dict__.update(st)
        self.group = None

    def _average_grads(self) -> None:
        """All-reduce (sum, then / world size) the gradients over ``group`` as one flat buffer."""
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)
        self.group.allreduce([flat]).wait()
        flat.div_(self.group.size())
        for g, v in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(v)

    def weights(self):
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict:
        """Checkpointable state (cold start): model weights and AdamW state."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])

    def _move(self, device: str) -> None:
        self.model.to(device)
        for st in self.optimizer.state.values():
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and k != "step":
                    st[k] = v.to(device)

    def offload(self) -> None:
        if self.device != "cpu":
            self._move("cpu")

    def load(self) -> None:
        if self.device != "cpu":
            self._move(self.device)
