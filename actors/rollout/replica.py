"""One engine replica of the rollout service: an actor around a :class:`actors.rollout.engine.CPUEngine`.

The service's serving loop for this replica (``actors/rollout/service.py``) owns the scheduler;
each :meth:`EngineReplica.window` call is one scheduling window on the engine: load a new policy
version first (the engine drops its prefix KV, made by the old weights), stop aborted requests
(their KV freed before the batch starts), start the batch, run one time slice (``slice_tokens``
decode steps per running generation) and report what finished. Requests that asked for them get
the log-probability of each sampled token. With ``service.engine: vllm`` a
:class:`actors.rollout.vllm_engine.VLLMEngine` takes the same place (no token log-probs there),
its KV cache sized to the scheduler's ``kv_capacity_tokens`` and its context to ``context_tokens``.
"""

from __future__ import annotations

import time
from typing import Any

from actors.rollout.engine import CPUEngine, _seed_of
from rollmux.rollout_sched import RequestType
from rollmux.rollout_sched.api import EngineResult, WindowCall, WindowReply


class _LogprobEngine(CPUEngine):
    """CPUEngine that keeps the log-probability of each token it samples for the requests that ask
    (a request's sampling generator is seeded by its id, so the generator names the request)."""

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._want: dict[int, str] = {}  # generator seed -> request id
        self._lp: dict[str, list[float]] = {}

    def want_logprobs(self, request_id: str) -> None:
        self._want[_seed_of(request_id, self.seed)] = request_id
        self._lp[request_id] = []

    def _sample(self, logits, gen, drawn: int) -> int:
        tok = super()._sample(logits, gen, drawn)
        rid = self._want.get(gen.initial_seed())
        if rid is not None:
            self._lp[rid].append(float(self._torch.log_softmax(logits.float(), -1)[tok]))
        return tok

    def take_logprobs(self, request_id: str) -> list[float] | None:
        """The request's token log-probabilities (None when it did not ask); forgets them."""
        self._want.pop(_seed_of(request_id, self.seed), None)
        return self._lp.pop(request_id, None)


class EngineReplica:
    """Actor body of one replica. ``config``: the section's ``RolloutSchedConfig`` as a dict."""

    def __init__(self, index: int, config: dict, seed: int = 0):
        from rollmux.rollout_sched import RolloutSchedConfig

        cfg = RolloutSchedConfig.model_validate(config)
        self.index = index
        if cfg.service.engine == "vllm":  # vLLM's CPU build or CUDA (no token log-probs from this adapter)
            from actors.rollout.vllm_engine import VLLMEngine

            self.engine: Any = VLLMEngine(cfg.service.vllm_model, slice_steps=cfg.slice_tokens, seed=seed,
                                          kv_capacity_tokens=cfg.budget.kv_capacity_tokens,
                                          max_model_len=cfg.service.context_tokens)
        else:
            self.engine = _LogprobEngine(vocab_size=cfg.coldstart.vocab_size, max_positions=cfg.service.context_tokens,
                                         slice_tokens=cfg.slice_tokens, seed=seed, num_threads=cfg.service.engine_threads)
        self.version = 0
        self._max_tokens: dict[str, int] = {}

    def ping(self) -> int:
        return self.index

    def window(self, call: WindowCall) -> WindowReply:
        e = self.engine
        t0 = time.perf_counter()
        if call.policy_version != self.version:
            e.on_weights_updated(call.policy_version)
            self.version = call.policy_version
        lp = isinstance(e, _LogprobEngine)
        if call.aborts:
            e.abort(call.aborts)
            for rid in call.aborts:
                self._max_tokens.pop(rid, None)
                if lp:
                    e.take_logprobs(rid)
        if call.batch:
            for rid in call.logprobs if lp else ():
                e.want_logprobs(rid)
            for r in call.batch:
                self._max_tokens[r.request_id] = r.max_tokens
            e.admit(call.batch, call.hits)
        done = e.step() if e.running else []
        out = []
        for c in done:
            toks = list(c.output_token_ids)
            cap = self._max_tokens.pop(c.request_id, 0)
            reason = "length" if c.score is None and len(toks) >= cap else "stop"
            out.append(EngineResult(id=c.request_id, output_token_ids=toks, score=c.score,
                                    logprobs=e.take_logprobs(c.request_id) if lp else None, finish_reason=reason))
        return WindowReply(results=out, running=e.running, engine_s=time.perf_counter() - t0)
