"""Rollout backend on transformers ``generate`` (CPU, or one CUDA device).

Sampling is seeded per call from the job's own generator: the global RNG is forked around
``generate`` and restored, under :data:`actors.backends.GLOBAL_RNG_LOCK` (two jobs' rollouts may
run at once in one worker after a long-tail migration), so results do not depend on what else ran
in the process (RollMux's on-policy guarantee: co-executed == solo, bit for bit). On CPU this
serialises concurrent generations in one process.
"""

from __future__ import annotations

from typing import Optional

import torch

from actors.backends import GLOBAL_RNG_LOCK, ProgressFn, RolloutBackend, pad_to


class _Progress:
    """A transformers ``StoppingCriteria`` that never stops; reports finished rows per step."""

    def __init__(self, fn: ProgressFn, prompt_len: int, eos_id: int, total: int) -> None:
        self.fn, self.p, self.eos, self.total, self.last = fn, prompt_len, eos_id, total, -1

    def __call__(self, input_ids: torch.Tensor, scores=None, **kw) -> torch.Tensor:
        done = int((input_ids[:, self.p :] == self.eos).any(dim=1).sum())
        if done != self.last:
            self.last = done
            self.fn(done, self.total)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class _RowMinLength:
    """A transformers ``LogitsProcessor``: ``<eos>`` is suppressed in row ``i`` until it has
    ``mins[i]`` new tokens (per-row minimum lengths: long-tailed response lengths)."""

    def __init__(self, prompt_len: int, mins: torch.Tensor, eos_id: int) -> None:
        self.p, self.mins, self.eos = prompt_len, mins, eos_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        block = self.mins.to(scores.device) > (input_ids.shape[1] - self.p)
        if bool(block.any()):
            scores[block, self.eos] = -float("inf")
        return scores


class HFRolloutBackend(RolloutBackend):
    """transformers ``model.generate(do_sample=True)`` with a per-call seed."""

    name = "hf"

    def __init__(self, model: torch.nn.Module, *, device: str = "cpu") -> None:
        self.device = device
        self.model = model.to(device).eval()
        self.offloads = 0
        self.loads = 0

    @torch.no_grad()
    def generate(self, prompt_ids, *, max_new_tokens, temperature, seed, eos_id, pad_id,
                 progress: Optional[ProgressFn] = None, min_new_tokens=0):
        from transformers import LogitsProcessorList, StoppingCriteriaList

        B, P = prompt_ids.shape
        crit = StoppingCriteriaList([_Progress(progress, P, eos_id, B)]) if progress else None
        procs = None
        if isinstance(min_new_tokens, torch.Tensor):  # per-row minimum lengths, shape [B]
            procs = LogitsProcessorList([_RowMinLength(P, min_new_tokens.reshape(B).long(), eos_id)])
            min_new_tokens = 0
        devices = [torch.device(self.device).index or 0] if self.device.startswith("cuda") else []
        with GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seed))
            out = self.model.generate(
                input_ids=prompt_ids.to(self.device),
                attention_mask=torch.ones_like(prompt_ids, device=self.device),
                do_sample=True,
                temperature=float(temperature),
                top_k=0,
                top_p=1.0,
                max_new_tokens=int(max_new_tokens),
                min_new_tokens=int(min_new_tokens),
                eos_token_id=eos_id,
                pad_token_id=pad_id,
                stopping_criteria=crit,
                logits_processor=procs,
            )
        if progress:
            progress(B, B)
        return pad_to(out.cpu(), P + max_new_tokens, pad_id)

    @torch.no_grad()
    def load_weights(self, weights):
        self.model.load_state_dict({k: v.to(self.device) for k, v in weights.items()})

    def state_dict(self) -> dict:
        """Checkpointable state (cold start): the policy weights."""
        return self.model.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.load_weights(sd)

    def offload(self) -> None:
        self.offloads += 1
        if self.device != "cpu":
            self.model.to("cpu")

    def load(self) -> None:
        self.loads += 1
        if self.device != "cpu":
            self.model.to(self.device)

    sleep = offload
    wake_up = load
