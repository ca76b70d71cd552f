"""Training backend on plain torch: AdamW, gradient clipping, CPU or one CUDA device."""

from __future__ import annotations

import torch

from actors.backends.base import TrainBackend


class TorchTrainBackend(TrainBackend):
    """Plain torch training of ``model`` with AdamW (no weight decay, eps 1e-8)."""

    name = "torch"

    def __init__(self, model: torch.nn.Module, *, lr: float, max_grad_norm: float = 1.0, device: str = "cpu") -> None:
        self.device = device
        self.model = model.to(device).train()
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0, foreach=False)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids.to(self.device)).logits.float()

    def backward_step(self, loss):
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm, foreach=False)
        self.optimizer.step()
        return float(norm)

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
