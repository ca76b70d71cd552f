"""A real (tiny) GRPO job: a transformers causal LM learns digit tasks with a verifiable reward.

Modules: :mod:`.tokenizer` (character vocabulary), :mod:`.task` (prompts, reward), :mod:`.model`
(LlamaForCausalLM from a config), :mod:`.algo` (GRPO math), :mod:`.config` (job file models),
:mod:`.job` (state builders, phase functions, the user's loop on the phase API), :mod:`.bind`
(import-light picklable config binding for RollMux workers), :mod:`.report` (figures from a
recorded phase timeline). The user script is ``scripts/grpo_job.py``.
"""
