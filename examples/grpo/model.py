"""Build the tiny causal LM of the example GRPO job from a transformers config (no download).

Source: issue 3 "A real RL job to run" (a few-million-parameter model built from a config).
"""

from __future__ import annotations

import torch

from examples.grpo.config import ModelConfig
from examples.grpo.tokenizer import CharTokenizer


def build_model(cfg: ModelConfig, seed: int, tok: CharTokenizer | None = None) -> torch.nn.Module:
    """A ``transformers.LlamaForCausalLM`` with random weights drawn from ``seed``.

    The global RNG is forked and restored, so building a model never perturbs other code.
    Returns the model in eval mode (no dropout), float32, on CPU.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tok or CharTokenizer()
    hf = LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )
    from actors.backends import GLOBAL_RNG_LOCK  # seeded init must not interleave with another job's sampling

    with GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = LlamaForCausalLM(hf)
    return model.float().eval()


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
