"""Rollout backend ``sched``: generation runs as requests through the rollout request scheduler.

Integration of the rollout request scheduler: :meth:`SchedRolloutBackend.generate` turns each prompt row
into a generation :class:`~rollmux.rollout_sched.Request` (``critical=True``: the training step
waits on the batch; ``task_family`` = the job's task; ``policy_version`` = the weights' version),
submits them to a :class:`~rollmux.rollout_sched.RolloutRequestScheduler` (``mixed`` policy by
default, ``configs/rollout_sched.yaml`` section ``cpu_engine``) and runs them with
:func:`actors.rollout.engine.serve` on a :class:`~actors.rollout.engine.CPUEngine` serving the
job's own policy model (transformers, manual decode loop with KV cache and prompt-prefix KV reuse).
Long generations advance ``slice_tokens`` tokens per scheduling window, so short requests (reward
queries, state queries) submitted while they run enter at the next window
(:meth:`SchedRolloutBackend.submit_side`).

Determinism (RollMux §5, co-executed == solo bit for bit): request ids derive from the call's
seed and the row index, and the engine samples each request from a generator seeded by its id, so
tokens do not depend on batching; the engine's clock is *logical* (one unit per scheduling window)
so the scheduler's waiting-time score never sees wall time; the engine (and its prefix KV cache)
is built per call. The scheduler itself (prefix index, cold-start controller) persists across
calls and pickles with the backend (plain Python state), so the runtime's state convention moves
it between phases like any other value.

GPU: :class:`actors.rollout.vllm_engine.VLLMEngine` is the same engine contract on vLLM with prefix
caching; this backend is CPU-only (``device != "cpu"`` raises), see docs/ARCHITECTURE.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from actors.backends.base import ProgressFn, RolloutBackend, pad_to
from actors.rollout.engine import CPUEngine, ListSource, serve
from rollmux.rollout_sched import (
    Completion,
    Request,
    RequestType,
    RolloutRequestScheduler,
    RolloutSchedConfig,
    load_rollout_sched_config,
)
from rollmux.rollout_sched.config import DEFAULT_CONFIG_PATH


class _JobEngine(CPUEngine):
    """:class:`CPUEngine` over an existing model with temperature, ``min_new_tokens`` and a logical clock.

    ``now()`` = windows run so far (one :meth:`step` = one unit); ``idle_until`` jumps the clock.
    """

    def __init__(self, model: torch.nn.Module, *, temperature: float, min_new_tokens: int, eos_id: int,
                 slice_tokens: int, seed: int, num_threads: int, block_tokens: int = 1) -> None:
        super().__init__(model=model, slice_tokens=slice_tokens, eos_token_id=eos_id, seed=seed,
                         num_threads=num_threads, prefix_cache_entries=16, block_tokens=block_tokens)
        self.temperature = float(temperature)
        self.min_new_tokens = int(min_new_tokens)
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def idle_until(self, t_s: float) -> None:
        self.clock = max(self.clock, float(t_s))

    def step(self) -> list[Completion]:
        done = super().step()
        self.clock += 1.0
        return done

    def _sample(self, logits, gen, drawn: int) -> int:
        torch_ = self._torch
        z = logits.float() / self.temperature
        if drawn < self.min_new_tokens and self.eos is not None:
            z = z.clone()
            z[self.eos] = float("-inf")
        return int(torch_.multinomial(torch_.softmax(z, -1), 1, generator=gen))


class _CallSource(ListSource):
    """The call's generation requests at t=0 plus side requests released at their window (``arrival_s``);
    records the window (engine clock after the slice) each request finished in. The trainer waits."""

    def __init__(self, requests: list[Request], version: int, clock):
        super().__init__(requests, version=version, waiting=True)
        self.window_of: dict[str, int] = {}
        self._clock = clock

    def on_complete(self, completion: Completion, now_s: float) -> None:
        super().on_complete(completion, now_s)
        self.window_of[completion.request_id] = int(self._clock())


class SchedRolloutBackend(RolloutBackend):
    """Rollout backend whose batches come from the rollout request scheduler (integration of :mod:`rollmux.rollout_sched`).

    Args:
        model: the policy (a transformers causal LM, e.g. ``examples.grpo.model.build_model``).
        device: ``"cpu"`` only.
        task_family: task family of this job's generation requests (diversity across families).
        policy: scheduler policy name (``mixed`` | ``prefix`` | ``fifo``).
        config: a :class:`RolloutSchedConfig`, or None to load ``config_path`` / ``config_section``.
        max_windows: bound on scheduling windows per :meth:`generate` call.
        num_threads: torch intra-op threads while decoding (batch-1 decode steps of a tiny model run
            fastest on one thread; the process's setting is restored after each call).
    Raises:
        ValueError: ``device`` is not ``cpu``; unknown policy.
        rollmux.config.ConfigError: bad scheduler config (names the field).
    """

    name = "sched"

    def __init__(self, model: torch.nn.Module, *, device: str = "cpu", task_family: str = "default",
                 policy: str = "mixed", config: Optional[RolloutSchedConfig] = None,
                 config_path: str | Path = DEFAULT_CONFIG_PATH, config_section: str = "cpu_engine",
                 max_windows: int = 100_000, num_threads: int = 1) -> None:
        if device != "cpu":
            raise ValueError(f"device: rollout_backend 'sched' runs on CPU (got {device!r}); use 'vllm' on GPUs")
        self.device = device
        self.model = model.to("cpu").eval()
        self.task_family = task_family
        cfg = config or load_rollout_sched_config(config_path, config_section)
        # a job's engine is built per call, with an empty prefix cache, and runs a deterministic
        # schedule: its outputs are reproducible with token-granular prefix reuse (block 1), which
        # saves the most prefill on a job's short prompts
        cfg = cfg.model_copy(update={"prefix_block_tokens": 1})
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        if vocab:  # the cold-start output entropy is normalised by the served model's vocabulary
            cfg = cfg.model_copy(update={"coldstart": cfg.coldstart.model_copy(update={"vocab_size": int(vocab)})})
        self.config = cfg
        self.scheduler = RolloutRequestScheduler(self.config, policy, log_limit=4096)
        self.version = 0
        self.max_windows = int(max_windows)
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.num_threads = int(num_threads)
        self.calls = 0
        self.offloads = 0
        self.loads = 0
        self._side: list[Request] = []
        self.side_completions: dict[str, Completion] = {}
        self.last_completion_window: dict[str, int] = {}
        self.last_windows = 0

    # ------------------------------------------------------------------ side requests
    def submit_side(self, request: Request | dict[str, Any], at_window: int = 0) -> None:
        """Queue a short request (reward / state query / replay) for the next :meth:`generate`
        call, released to the scheduler at scheduling window ``at_window`` (while the call's long
        generations run). Its completion lands in ``side_completions[request_id]``.

        Raises: pydantic.ValidationError on a bad request dict; ValueError on ``at_window < 0``.
        """
        if at_window < 0:
            raise ValueError(f"at_window must be >= 0, got {at_window}")
        r = request if isinstance(request, Request) else Request.model_validate(request)
        self._side.append(r.model_copy(update={"arrival_s": float(at_window)}))

    # ------------------------------------------------------------------ RolloutBackend
    @torch.no_grad()
    def generate(self, prompt_ids, *, max_new_tokens, temperature, seed, eos_id, pad_id,
                 progress: Optional[ProgressFn] = None, min_new_tokens: int = 0):
        """See :meth:`RolloutBackend.generate`: LongTensor ``[B, P + N]``, rows padded with
        ``pad_id`` after ``<eos>``. Queued side requests (:meth:`submit_side`) run in the same call.

        Raises:
            ValueError: ``P + N`` exceeds the scheduler's ``budget.kv_capacity_tokens``.
            RuntimeError: the call hit ``max_windows`` (its requests are dropped from the scheduler).
        """
        B, P = prompt_ids.shape
        N = int(max_new_tokens)
        cap = self.config.budget.kv_capacity_tokens
        if P + N > cap:
            raise ValueError(f"max_new_tokens: prompt ({P}) + max_new_tokens ({N}) tokens exceed the rollout "
                             f"scheduler's budget.kv_capacity_tokens ({cap})")
        rows = prompt_ids.tolist()
        ids = [f"s{int(seed)}-v{self.version}-r{i}" for i in range(B)]
        reqs = [Request(request_id=ids[i], prompt_token_ids=tuple(rows[i]), type=RequestType.GENERATION,
                        max_tokens=N, arrival_s=0.0, critical=True, policy_version=self.version,
                        task_family=self.task_family) for i in range(B)]
        side, self._side = self._side, []
        engine = _JobEngine(self.model, temperature=temperature, min_new_tokens=min_new_tokens, eos_id=eos_id,
                            slice_tokens=self.config.slice_tokens, seed=int(seed), num_threads=self.num_threads,
                            block_tokens=1)
        self.scheduler.on_engine_cache_reset()  # a fresh engine holds no prefix KV: credit none from earlier calls
        source = _CallSource(reqs + side, self.version, engine.now)
        want = set(ids)
        state = {"done": 0}

        def on_window(now_s: float, batch: list[Request], comps: list[Completion]) -> None:
            n = sum(1 for c in comps if c.request_id in want)
            if n and progress is not None:
                state["done"] += n
                progress(state["done"], B)

        try:
            stats = serve(self.scheduler, engine, source, max_windows=self.max_windows, on_window=on_window)
        except BaseException:
            self._forget(ids + [r.request_id for r in side])
            raise
        if stats.stopped_by != "drained":
            self._forget(ids + [r.request_id for r in side])
            raise RuntimeError(f"rollout_backend 'sched': generation stopped by {stats.stopped_by} after "
                               f"{stats.windows} windows (max_windows={self.max_windows})")
        self.calls += 1
        self.last_windows = stats.windows
        self.last_completion_window = dict(source.window_of)
        out = torch.full((B, P + N), pad_id, dtype=torch.long)
        out[:, :P] = prompt_ids.cpu()
        for i, rid in enumerate(ids):
            toks = source.completions[rid].output_token_ids[:N]
            if toks:
                out[i, P:P + len(toks)] = torch.tensor(toks, dtype=torch.long)
        for r in side:
            self.side_completions[r.request_id] = source.completions[r.request_id]
        return pad_to(out, P + N, pad_id)

    def _forget(self, request_ids: list[str]) -> None:
        """Drop a failed call's requests from the scheduler (queued: cancel; running: abort, which
        releases their KV; the call's engine is gone, so nothing is left to stop)."""
        for rid in request_ids:
            self.scheduler.cancel(rid)
        self.scheduler.take_aborts()

    @torch.no_grad()
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Install new policy weights and bump the policy version (prefix-index expiry, cold-start step)."""
        self.model.load_state_dict({k: v.to("cpu") for k, v in weights.items()})
        self.version += 1
        self.scheduler.set_policy_version(self.version)

    def metrics(self) -> dict[str, Any]:
        """The scheduler's metrics (:meth:`RolloutRequestScheduler.metrics`) plus ``backend_calls``."""
        return {**self.scheduler.metrics(), "backend_calls": self.calls, "last_windows": self.last_windows}

    def state_dict(self) -> dict:
        """Checkpointable state (cold start): the policy weights."""
        return self.model.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd)

    def offload(self) -> None:
        self.offloads += 1

    def load(self) -> None:
        self.loads += 1

    sleep = offload
    wake_up = load
