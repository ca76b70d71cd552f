#!/usr/bin/env python
"""An ordinary TRL GRPO script: nothing in it knows RollMux.

A tiny Llama built from a config (random weights from ``--seed``, no download), a character-level
tokenizer from the ``tokenizers`` library, an in-memory dataset of digit-copy prompts ("3>" ->
reward for answering "3"), CPU (``use_cpu=True``), float32 (``bf16=False``), no vLLM. After every
optimizer step a callback records the SHA-256 of the policy weights (``--digests-out``: JSON
list, one entry per step), so two runs can be compared bit for bit.

Run plain::

    python examples/trl_grpo/train.py --steps 4 --digests-out /tmp/plain.json

Run the same file under RollMux (the one-line wrapper swaps in
:class:`rollmux.integrations.trl.RollMuxGRPOTrainer`; env ``ROLLMUX_ATTACH=1`` makes it attach
to a running RollMux scheduler, otherwise its permits are granted at once)::

    python -m rollmux.integrations.trl examples/trl_grpo/train.py --steps 4 --digests-out /tmp/rm.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random

import torch

CHARS = "0123456789+-=>?"
SPECIALS = ["<pad>", "<bos>", "<eos>"]


def build_tokenizer():
    """A transformers fast tokenizer over single characters (``tokenizers`` WordLevel on a
    per-character split): ids 0-2 = <pad> <bos> <eos>, then the 15 task characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="?", padding_side="left")


def build_model(tokenizer, seed: int, hidden: int = 32, layers: int = 2, heads: int = 2):
    """A ``LlamaForCausalLM`` from a config, random weights drawn from ``seed`` (float32, CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=2 * hidden,
                      max_position_embeddings=64, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg).float()


def build_dataset(n: int, seed: int):
    """``n`` prompts ``"<d>>"`` (a digit then ``>``) with the digit as the answer column."""
    from datasets import Dataset

    rng = random.Random(seed)
    digits = [rng.randrange(10) for _ in range(n)]
    return Dataset.from_dict({"prompt": [f"{d}>" for d in digits], "answer": [str(d) for d in digits]})


def copy_reward(completions, answer, **kwargs):
    """1 when the completion starts with the prompt's digit, + 0.1 per digit among its characters."""
    return [float(c[:1] == a) + 0.1 * sum(ch.isdigit() for ch in c) for c, a in zip(completions, answer)]


def weights_sha256(model) -> str:
    """SHA-256 over the raw bytes of every tensor of the state dict, in key order."""
    h = hashlib.sha256()
    sd = model.state_dict()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="tiny TRL GRPO run (CPU, no download)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default=os.environ.get("TMPDIR", "/tmp") + "/trl-grpo-tiny")
    ap.add_argument("--digests-out", default=None, help="write the per-step weight SHA-256 list here (JSON)")
    ap.add_argument("--run-name", default="trl-grpo-tiny")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (a GPU host)")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms (CUDA: needs CUBLAS_WORKSPACE_CONFIG=:4096:8)")
    args = ap.parse_args(argv)

    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    torch.set_num_threads(1)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    tok = build_tokenizer()
    model = build_model(tok, args.seed)
    cfg = GRPOConfig(
        output_dir=args.output_dir, run_name=args.run_name, max_steps=args.steps, seed=args.seed,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=args.device == "cpu", bf16=False, use_vllm=False, temperature=1.0,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    digests: list[str] = []

    class Digest(TrainerCallback):
        def on_step_end(self, targs, state, control, model=None, **kw):
            digests.append(weights_sha256(model))

    trainer = GRPOTrainer(model=model, reward_funcs=copy_reward, args=cfg, train_dataset=build_dataset(64, args.seed),
                          processing_class=tok, callbacks=[Digest()])
    trainer.train()
    if args.digests_out:
        with open(args.digests_out, "w") as f:
            json.dump({"digests": digests, "trainer": type(trainer).__name__, "device": str(trainer.accelerator.device)}, f)
    print(json.dumps({"steps": len(digests), "final_sha256": digests[-1] if digests else None,
                      "trainer": type(trainer).__name__}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
