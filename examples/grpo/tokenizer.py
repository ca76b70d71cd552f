"""A tiny character tokenizer for the digit tasks of the example GRPO job (no download).

Vocabulary: ``<pad> <bos> <eos>``, the digits ``0``-``9`` and the symbols ``+ - = > ?``
(15 ids). Ids are stable, so a checkpoint or a vLLM engine built from the same vocabulary
agrees with the training side token for token.
"""

from __future__ import annotations

import torch

SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS = tuple("0123456789") + ("+", "-", "=", ">", "?")


class CharTokenizer:
    """Character-level tokenizer; ``encode(text) -> list[int]``, ``decode(ids) -> str``.

    Raises:
        ValueError: ``encode`` of a character outside the vocabulary (names the character).
    """

    def __init__(self) -> None:
        self.itos: list[str] = list(SPECIALS) + list(CHARS)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def digit_id(self, d: int) -> int:
        """Token id of the digit ``d`` (0-9)."""
        return self.stoi[str(d)]

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        bad = [c for c in text if c not in self.stoi]
        if bad:
            raise ValueError(f"character {bad[0]!r} is not in the tokenizer vocabulary {CHARS}")
        return ([self.bos_id] if bos else []) + [self.stoi[c] for c in text]

    def encode_batch(self, texts: list[str]) -> torch.Tensor:
        """Equal-length texts -> LongTensor ``[B, 1 + len]`` (with ``<bos>``).

        Raises:
            ValueError: texts of different lengths (the digit tasks use fixed-length prompts).
        """
        ids = [self.encode(t) for t in texts]
        if len({len(x) for x in ids}) > 1:
            raise ValueError("encode_batch needs equal-length prompts")
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids, *, stop_at_eos: bool = True) -> str:
        out = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i == self.eos_id and stop_at_eos:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            out.append(self.itos[i])
        return "".join(out)
