"""A plain TRL GRPO script (tiny Llama, char-level tokenizer, in-memory data): the example the
TRL integration (:mod:`rollmux.integrations.trl`) runs unchanged under RollMux."""
