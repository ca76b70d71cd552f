"""Verifiable digit tasks for the example GRPO job, and their rule-based reward.

Each answer position is one of ten digits, so a random policy over the 15-token vocabulary gets
about 1 position in 15 right and a GRPO group almost always has a reward spread: learning shows
within tens of iterations on a CPU. ``answer_len`` (n) sets the response length, hence the
rollout phase's cost.

Tasks (prompt -> answer of n digits):
    ``next``: ``"d>"`` -> ``d+1, d+2, ..., d+n`` (mod 10), i.e. count on from ``d``;
    ``copy``: ``"a1..an="`` -> ``a1..an``;
    ``add``:  ``"a+b="`` -> ``(a + b) mod 10`` (n = 1 only).

Reward: fraction of the first n response tokens equal to the answer digits (0.0 - 1.0).
A verifiable task whose reward a random policy gets sometimes.
"""

from __future__ import annotations

import torch

from examples.grpo.tokenizer import CharTokenizer

TASKS: tuple[str, ...] = ("next", "copy", "add")


class PromptSampler:
    """Samples task prompts from its own ``torch.Generator`` (no global RNG).

    The sampler lives in the job's rollout state, so its position is part of the phase state
    that RollMux keeps between phases (on-policy determinism solo vs co-executed).

    Raises:
        ValueError: unknown ``task``, ``answer_len < 1``, or ``add`` with ``answer_len != 1``.
    """

    def __init__(self, task: str, seed: int, answer_len: int = 1) -> None:
        if task not in TASKS:
            raise ValueError(f"task: unknown task {task!r} (known: {', '.join(TASKS)})")
        if answer_len < 1 or (task == "add" and answer_len != 1):
            raise ValueError(f"answer_len: {answer_len} is not valid for task {task!r}")
        self.task, self.n = task, answer_len
        self.gen = torch.Generator().manual_seed(int(seed))

    def sample(self, m: int) -> tuple[list[str], torch.Tensor]:
        """``m`` prompts and their answers: (texts, LongTensor ``[m, n]`` of digits)."""
        if self.task == "add":
            a = torch.randint(0, 10, (m,), generator=self.gen)
            b = torch.randint(0, 10, (m,), generator=self.gen)
            return [f"{x}+{y}=" for x, y in zip(a.tolist(), b.tolist())], ((a + b) % 10).unsqueeze(1)
        if self.task == "next":
            d = torch.randint(0, 10, (m,), generator=self.gen)
            ans = (d.unsqueeze(1) + torch.arange(1, self.n + 1)) % 10
            return [f"{x}>" for x in d.tolist()], ans
        digits = torch.randint(0, 10, (m, self.n), generator=self.gen)
        return ["".join(map(str, row)) + "=" for row in digits.tolist()], digits


def reward(response_ids: torch.Tensor, answers: torch.Tensor, tok: CharTokenizer) -> torch.Tensor:
    """Rule-based reward per sample.

    Args:
        response_ids: LongTensor ``[B, N]`` generated tokens (after the prompt), ``N >= n``.
        answers: LongTensor ``[B, n]`` answer digits.
    Returns:
        FloatTensor ``[B]``: fraction of positions ``i < n`` with ``response_ids[:, i]`` equal to
        the token of ``answers[:, i]``.
    Raises:
        ValueError: responses shorter than the answer.
    """
    n = answers.shape[1]
    if response_ids.shape[1] < n:
        raise ValueError(f"max_new_tokens ({response_ids.shape[1]}) is shorter than answer_len ({n})")
    want = answers + tok.digit_id(0)  # digit tokens are contiguous
    return (response_ids[:, :n] == want).float().mean(dim=1)
