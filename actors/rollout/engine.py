"""Engine side of rollout request scheduling: engines that take their batches from
:class:`rollmux.rollout_sched.RolloutRequestScheduler`, and the in-process engine loop :func:`serve`.

Engines (one interface, :class:`RolloutEngine`):

* :class:`CPUEngine`: a tiny transformers causal LM built from a config (no download); prefill
  then a manual decode loop with a KV cache per request, ``slice_tokens`` decode steps per running
  generation per window. Reward queries are answered by a cheap scorer (one forward pass),
  replay items by a prompt log-probability pass, state queries by a short generation. It loads
  new weights (:meth:`CPUEngine.load_weights`) and reports their digest; every sampled token
  records the weights version that sampled it.
* :class:`actors.rollout.sim_engine.SimulatedEngine`: the same contract on a virtual clock with a
  cost model of one H20 serving a 7B model (prefill FLOPs, memory-bound decode steps), for scale runs.
* :class:`actors.rollout.vllm_engine.VLLMEngine`: vLLM's ``LLMEngine`` with automatic prefix
  caching on (vLLM's CPU build in the test command, or CUDA).

:func:`serve` runs scheduling windows in this process: poll arrivals and cancellations (queued
requests are dropped, running ones aborted: the engine stops them before the next slice, their KV
slot is free in the same window), then one serving window
(:func:`actors.rollout.window.run_window`: stage-1 budget + stage-2 ordering -> admit the batch ->
run one time slice -> report completions; the rollout service's loop runs the same function).
``serve(..., sample_target=n)`` ends a step once ``n`` generations finished (over-sampling: the
leftovers are aborted, not waited for). Because long generations advance one slice per window, a
short reward query submitted while they run enters at the next slice boundary (time slices), and
its wait is bounded (``MixedPolicy`` starvation bound). No Ray here.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from actors.rollout.window import LocalWindowEngine, drive, run_window
from rollmux.rollout_sched import Completion, Request, RequestType, RolloutRequestScheduler
from rollmux.rollout_sched.weights import TensorSpec


def _seed_of(request_id: str, seed: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest(), "little") >> 1


def request_seed(req: Request, engine_seed: int) -> int:
    """Sampling seed of ``req``: its own ``seed`` when it names one (then the tokens do not depend
    on the engine or replica), else derived from its id and the engine's seed."""
    return int(req.seed) if req.seed is not None else _seed_of(req.request_id, engine_seed)


class RolloutEngine(ABC):
    """Contract of an engine driven by a serving window. Times are seconds on ``now()``'s clock."""

    @abstractmethod
    def now(self) -> float:
        """Current time, seconds."""

    @abstractmethod
    def idle_until(self, t_s: float) -> None:
        """Nothing to run: wait (virtual: jump; real: sleep, bounded) until ``t_s``."""

    @abstractmethod
    def admit(self, batch: list[Request], hits: dict[str, int]) -> None:
        """Start ``batch``; ``hits`` = scheduler-measured prefix hit tokens per request id."""

    @abstractmethod
    def step(self) -> list[Completion]:
        """Run one time slice; return the requests that finished in it."""

    @property
    @abstractmethod
    def running(self) -> int:
        """Requests in flight."""

    #: the engine drops its prefix KV when new weights are loaded (vLLM ``reset_prefix_cache``,
    #: the CPU engine); the serving window then tells the scheduler, which stops crediting old prefixes.
    resets_prefix_cache_on_update: bool = True
    #: the weights version the engine serves (moved by :meth:`load_weights` through a window).
    weights_version: int = 0

    def on_weights_updated(self, version: int) -> None:  # noqa: B027 - optional hook
        """The policy version moved without new weights here (engines with a prefix cache may reset it)."""

    def load_weights(self, weights: Mapping[str, Any]) -> str:
        """Install ``weights`` (name -> tensor, every tensor of the model) and return the digest of
        the weights now served (:func:`actors.rollout.weights.state_digest`); all or nothing.
        Raises ValueError naming a missing / unexpected tensor or a wrong shape / dtype;
        NotImplementedError for an engine that cannot load weights."""
        raise NotImplementedError(f"{type(self).__name__} cannot load weights")

    def manifest(self) -> Optional[list[TensorSpec]]:
        """Name, dtype and shape of every tensor :meth:`load_weights` takes (None: not known)."""
        return None

    def partial_outputs(self, request_ids: list[str]) -> dict[str, list[int]]:
        """The tokens generated so far by those of ``request_ids`` still running (an engine that
        cannot tell reports none: their tokens then arrive with their completion)."""
        return {}

    @abstractmethod
    def abort(self, request_ids: list[str]) -> None:
        """Stop these running requests now: no completion is reported for them, their KV is freed."""


class RequestSource(Protocol):
    """Where requests come from (a trainer model, a list, a worker's inbox)."""

    def poll(self, now_s: float) -> list[Request]: ...
    def next_event_s(self) -> float | None: ...
    def on_complete(self, completion: Completion, now_s: float) -> None: ...
    def trainer_waiting(self) -> bool: ...
    def policy_version(self) -> int: ...
    def done(self) -> bool: ...

    # optional: ``cancelled() -> list[str]``, request ids to drop (polled every window): queued ones
    # are dropped, running ones aborted within the window


class ListSource:
    """Releases a fixed list of requests at their ``arrival_s`` (relative to the engine clock)."""

    def __init__(self, requests: Iterable[Request], *, version: int = 0, waiting: bool = False):
        self._reqs = sorted(requests, key=lambda r: r.arrival_s)
        self._i = 0
        self.version, self.waiting = version, waiting
        self.completions: dict[str, Completion] = {}

    def poll(self, now_s: float) -> list[Request]:
        out = []
        while self._i < len(self._reqs) and self._reqs[self._i].arrival_s <= now_s:
            out.append(self._reqs[self._i])
            self._i += 1
        return out

    def next_event_s(self) -> float | None:
        return self._reqs[self._i].arrival_s if self._i < len(self._reqs) else None

    def on_complete(self, completion: Completion, now_s: float) -> None:
        self.completions[completion.request_id] = completion

    def trainer_waiting(self) -> bool:
        return self.waiting

    def policy_version(self) -> int:
        return self.version

    def done(self) -> bool:
        return self._i >= len(self._reqs)


@dataclass
class ServeStats:
    """What :func:`serve` did: windows run, completions, and whether it stopped on a bound."""

    windows: int = 0
    completed: int = 0
    stopped_by: str = "drained"  # | "sample_target" | "max_windows" | "max_wall_s"
    end_s: float = 0.0
    aborted: int = 0


def serve(
    scheduler: RolloutRequestScheduler,
    engine: RolloutEngine,
    source: RequestSource,
    *,
    max_windows: int = 1_000_000,
    max_wall_s: float = 600.0,
    on_window: Callable[[float, list[Request], list[Completion]], None] | None = None,
    sample_target: int | None = None,
) -> ServeStats:
    """Run scheduling windows until the source is done and every request finished.

    Bounded by ``max_windows`` windows and ``max_wall_s`` seconds of real time.
    ``sample_target``: stop as soon as that many generation requests completed (a step that
    over-samples): every request still queued or running is cancelled / aborted (``aborted``
    counts the running ones) and ``stopped_by`` is ``"sample_target"``; requests the source has
    not released yet are not polled.
    A source's ``cancelled()`` ids are dropped when queued and aborted when running, before the
    window's batch is chosen, so an aborted request's slot is reused in the same window.
    The engine's prefix cache and the scheduler's prefix credit move together: on a new policy
    version the engine is told (``on_weights_updated``) and, when it resets its prefix cache
    (``resets_prefix_cache_on_update``), the scheduler forgets every prefix.
    Each window is :func:`actors.rollout.window.run_window` on the engine (in this process).
    ``on_window(now_s, batch, completions)`` is called after each slice (metrics, logging).
    Raises RuntimeError when no progress is possible (queued requests that can never be admitted,
    nothing running, no next event).
    """
    if sample_target is not None and sample_target < 1:
        raise ValueError(f"sample_target must be >= 1, got {sample_target}")
    stats = ServeStats()
    t_wall = time.monotonic()
    stuck = 0
    samples = 0
    mine: set[str] = set()  # requests of this call (the scheduler may hold others')
    local = LocalWindowEngine(engine, version=scheduler.policy_version)

    while True:
        if stats.windows >= max_windows:
            stats.stopped_by = "max_windows"
            break
        if time.monotonic() - t_wall > max_wall_s:
            stats.stopped_by = "max_wall_s"
            break
        now = engine.now()
        for r in source.poll(now):
            scheduler.submit(r)
            mine.add(r.request_id)
        for rid in getattr(source, "cancelled", lambda: ())():
            scheduler.cancel(rid)
        out = drive(run_window(scheduler, local, now, version=source.policy_version(),
                               cache_reset=engine.resets_prefix_cache_on_update,
                               trainer_waiting=source.trainer_waiting(), engine_version=local.version))
        stats.aborted += len(out.aborts)
        if out.idle or not out.reply.stepped:
            nxt = source.next_event_s()
            if scheduler.pending == 0 and nxt is None:
                if source.done():
                    break
                stuck += 1  # the source may still produce (e.g. a trainer step ending)
            elif scheduler.pending and nxt is None:
                stuck += 1
            if stuck > 1000:
                raise RuntimeError(
                    f"no progress: {scheduler.pending} queued requests cannot be admitted, nothing is running "
                    "and the source has no next event"
                )
            if nxt is not None:
                engine.idle_until(max(nxt, now))
            stats.windows += 1
            continue
        stuck = 0
        stats.windows += 1
        comps = []
        for req, res in out.completed:
            if req.type is RequestType.GENERATION:
                samples += 1
            c = Completion(res.id, tuple(res.output_token_ids), res.finished_s, score=res.score,
                           token_versions=tuple(res.token_versions) if res.token_versions is not None else None)
            source.on_complete(c, c.finished_s)
            comps.append(c)
        stats.completed += len(comps)
        if on_window is not None:
            on_window(now, out.batch, comps)
        if sample_target is not None and samples >= sample_target:
            for rid in list(scheduler.queue) + list(scheduler.inflight):
                if rid in mine:
                    scheduler.cancel(rid)
            ids = scheduler.take_aborts()
            if ids:
                local.abort(ids)
                stats.aborted += len(ids)
            stats.stopped_by = "sample_target"
            break
    stats.end_s = engine.now()
    return stats


# ----------------------------------------------------------------------------- CPU engine
@dataclass
class _Live:
    req: Request
    cache: Any
    next_token: int
    out: list[int]
    gen: Any
    next_version: int = 0
    versions: list[int] = field(default_factory=list)
    logprobs: Optional[list[float]] = None


class _WallClockEngine(RolloutEngine):
    """Real engines: ``now()`` is wall time since ``_t0``; idling sleeps, at most 50 ms a call."""

    _t0: float

    def now(self) -> float:
        return time.monotonic() - self._t0

    def idle_until(self, t_s: float) -> None:
        time.sleep(min(0.05, max(0.0, t_s - self.now())))


class CPUEngine(_WallClockEngine):
    """A tiny transformers causal LM on CPU (built from a ``LlamaConfig``; random weights, no download).

    Generation: prefill, then a manual decode loop reusing the KV cache, ``slice_tokens`` tokens
    per running request per :meth:`step`; stops at ``eos_token_id`` (if set) or ``max_tokens``.
    Prefill runs in blocks of ``block_tokens`` positions ([0, B), [B, 2B), ..., then the rest),
    and prefix caching reuses whole blocks: the KV of the last ``prefix_cache_entries`` prompts is
    kept; a new prompt copies the entry with the longest common prefix, crops it to the whole
    blocks of that prefix (at most ``len - 1`` tokens: the last one runs to give logits) and
    prefills only the rest (``prefill_tokens_reused`` / ``prefill_tokens_computed`` count it), as
    vLLM's block-granular prefix cache does. Because a block's KV is always computed the same way
    (same tokens, same earlier blocks), a request's logits, and so its tokens, are bit-identical
    whether its prefix came from the cache or not: the output does not depend on what ran before
    it, on which replica, or on the cache's state. The cache is dropped on a weight update.
    Sampling is seeded per request (its ``seed``, else its id and ``seed``) at the request's
    ``temperature`` (0: greedy), so a request's output does not depend on what it was batched with.
    Reward query: score = sigmoid(logit[1] - logit[0]) at the last prompt position. Replay: mean log-probability of the prompt (one full forward).

    Args:
        vocab_size, hidden_size, num_layers, num_heads, num_kv_heads: model shape.
        slice_tokens: decode steps per request per window.
        eos_token_id: stop token (None: always run to max_tokens).
        seed: weight-init and sampling seed.
        model: an existing transformers causal LM to serve instead of building one (the rollout
            backend ``sched`` passes the job's policy); the shape arguments are then ignored.
        block_tokens: prefill block (and prefix-reuse granularity), tokens (vLLM's default block is 16).
            1: any prefix is reused and the rest runs in one forward (fewest forwards; a prompt's
            logits may then differ in their last bits with the cache's state).
    """

    def __init__(
        self,
        *,
        vocab_size: int = 256,
        hidden_size: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int = 2,
        max_positions: int = 2048,
        slice_tokens: int = 8,
        eos_token_id: int | None = 0,
        seed: int = 0,
        num_threads: int | None = 1,
        prefix_cache_entries: int = 16,
        model: Any = None,
        block_tokens: int = 16,
    ):
        import inspect

        import torch

        self._torch = torch
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        if model is not None:  # an existing causal LM (e.g. a job's policy); shape args are ignored
            self.model = model.eval()
            vocab_size = int(model.config.vocab_size)
        else:
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                self.model = tiny_llama(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                                        num_heads=num_heads, num_kv_heads=num_kv_heads, max_positions=max_positions)
        self.vocab_size = vocab_size
        self.slice_tokens = slice_tokens
        self.eos = eos_token_id
        self.seed = seed
        self.block_tokens = int(block_tokens)
        self._t0 = time.monotonic()
        self._live: list[_Live] = []
        self._done: list[Completion] = []
        self.forward_calls = 0
        self.num_threads = num_threads
        self.prefix_cache_entries = prefix_cache_entries
        self._pcache: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.prefill_tokens_reused = 0
        self.prefill_tokens_computed = 0
        self.weights_version = 0
        self._want_lp: set[str] = set()
        self._lp_done: dict[str, list[float]] = {}
        # transformers >= 5 renamed the forward's ``past_key_values`` to ``cache``
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    @property
    def running(self) -> int:
        return len(self._live) + len(self._done)

    @contextlib.contextmanager
    def _threads(self):
        """Run torch under inference mode with ``num_threads`` intra-op threads (restored after)."""
        torch, prev = self._torch, self._torch.get_num_threads()
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        try:
            with torch.inference_mode():
                yield
        finally:
            torch.set_num_threads(prev)

    def _forward(self, ids: list[int], cache=None):
        torch = self._torch
        self.forward_calls += 1
        out = self.model(input_ids=torch.tensor([ids]), use_cache=True, **{self._cache_kw: cache})
        return out.logits[0], out[self._cache_kw] if self._cache_kw in out else out.past_key_values

    def _prefill(self, ids: tuple[int, ...]):
        """Prefill ``ids`` in blocks, reusing the whole blocks of the longest cached prompt prefix;
        returns (logits of the last block run, cache)."""
        best, common = None, 0
        for key in self._pcache:
            n = min(len(key), len(ids))
            k = 0
            while k < n and key[k] == ids[k]:
                k += 1
            if k > common:
                best, common = key, k
        B = self.block_tokens
        hit = (min(common, len(ids) - 1) // B) * B  # whole blocks; the last token always runs
        cache = None
        if best is not None and hit > 0:
            self._pcache.move_to_end(best)
            cache = copy.deepcopy(self._pcache[best])
            extra = cache.get_seq_length() - hit
            if extra > 0:
                cache.crop(-extra)  # negative: tokens to drop (all versions)
        else:
            hit = 0
        pos, logits = hit, None
        while pos < len(ids):
            end = len(ids) if B == 1 else min(len(ids), (pos // B + 1) * B)  # B == 1: the rest in one forward
            logits, cache = self._forward(list(ids[pos:end]), cache)
            pos = end
        self.prefill_tokens_reused += hit
        self.prefill_tokens_computed += len(ids) - hit
        if self.prefix_cache_entries > 0:
            self._pcache[ids] = copy.deepcopy(cache)
            while len(self._pcache) > self.prefix_cache_entries:
                self._pcache.popitem(last=False)
        return logits, cache

    def on_weights_updated(self, version: int) -> None:
        """KV made by the old weights is stale: drop the prefix cache."""
        self._pcache.clear()

    def load_weights(self, weights: Mapping[str, Any]) -> str:
        """Install ``weights`` (every tensor of the model, same names, shapes and dtypes) in place,
        drop the prefix cache; returns the digest of the weights now served. All or nothing:
        raises ValueError naming the first mismatch before any tensor is written."""
        from actors.rollout.weights import check_state, specs_of, state_digest

        live = self.model.state_dict()
        check_state(weights, specs_of(live))
        with self._torch.no_grad():
            for k, t in live.items():
                t.copy_(weights[k])
        self._pcache.clear()
        return state_digest(self.model.state_dict())

    def weights_sha256(self) -> str:
        """Digest of the weights served now (:func:`actors.rollout.weights.state_digest`)."""
        from actors.rollout.weights import state_digest

        return state_digest(self.model.state_dict())

    def manifest(self) -> list[TensorSpec]:
        from actors.rollout.weights import specs_of

        return specs_of(self.model.state_dict())

    def partial_outputs(self, request_ids: list[str]) -> dict[str, list[int]]:
        want = set(request_ids)
        return {s.req.request_id: s.out for s in self._live if s.req.request_id in want}

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        self._live = [s for s in self._live if s.req.request_id not in ids]
        self._done = [c for c in self._done if c.request_id not in ids]
        for rid in ids:
            self._want_lp.discard(rid)
            self._lp_done.pop(rid, None)

    def want_logprobs(self, request_id: str) -> None:
        """Record the log-probability of each token ``request_id`` samples (call before admitting it)."""
        self._want_lp.add(request_id)

    def take_logprobs(self, request_id: str) -> list[float] | None:
        """The token log-probabilities of a finished request that asked (None otherwise); forgets them."""
        self._want_lp.discard(request_id)
        return self._lp_done.pop(request_id, None)

    def _sample(self, logits, gen, drawn: int) -> int:
        """Sample one token; ``drawn`` = tokens this request has sampled before (hook for subclasses)."""
        torch = self._torch
        return int(torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen))

    def _draw(self, s: _Live, logits) -> None:
        """Sample ``s``'s next token from ``logits`` with the weights served now, at its request's
        temperature (0: the most likely token)."""
        t = s.req.temperature
        s.next_token = (int(logits.argmax()) if t == 0
                        else self._sample(logits if t == 1 else logits.float() / t, s.gen, len(s.out)))
        s.next_version = self.weights_version
        if s.logprobs is not None:
            s.logprobs.append(float(self._torch.log_softmax(logits.float(), -1)[s.next_token]))

    def _finish(self, s: _Live) -> Completion:
        if s.logprobs is not None:
            self._lp_done[s.req.request_id] = s.logprobs[:len(s.out)]
        return Completion(s.req.request_id, tuple(s.out), self.now(), token_versions=tuple(s.versions))

    def admit(self, batch: list[Request], hits: dict[str, int]) -> None:
        torch = self._torch
        with self._threads():
            for r in batch:
                ids = list(r.prompt_token_ids)
                if r.type is RequestType.REWARD:
                    logits, _ = self._prefill(r.prompt_token_ids)
                    score = float(torch.sigmoid(logits[-1, 1] - logits[-1, 0]))
                    self._done.append(Completion(r.request_id, (), self.now(), score=score))
                elif r.type is RequestType.REPLAY:  # needs logits at every position: no reuse
                    logits, _ = self._forward(ids)
                    self.prefill_tokens_computed += len(ids)
                    lp = torch.log_softmax(logits[:-1].float(), -1)
                    score = float(lp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).mean()) if len(ids) > 1 else 0.0
                    self._done.append(Completion(r.request_id, (), self.now(), score=score))
                else:
                    gen = torch.Generator().manual_seed(request_seed(r, self.seed))
                    logits, cache = self._prefill(r.prompt_token_ids)
                    s = _Live(r, cache, 0, [], gen, logprobs=[] if r.request_id in self._want_lp else None)
                    self._draw(s, logits[-1])
                    self._live.append(s)

    def step(self) -> list[Completion]:
        done, self._done = self._done, []
        with self._threads():
            for _ in range(self.slice_tokens):
                still = []
                for s in self._live:
                    s.out.append(s.next_token)
                    s.versions.append(s.next_version)
                    if len(s.out) >= s.req.max_tokens or (s.next_token == self.eos and not s.req.ignore_eos):
                        done.append(self._finish(s))
                        continue
                    logits, s.cache = self._forward([s.next_token], s.cache)
                    self._draw(s, logits[-1])
                    still.append(s)
                self._live = still
                if not self._live:
                    break
        return done


def tiny_llama(*, vocab_size: int = 256, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
               num_kv_heads: int = 2, max_positions: int = 2048) -> Any:
    """The CPU engine's model: a ``LlamaForCausalLM`` of this shape with random weights (torch's
    global RNG: seed it, or fork it, around the call). A trainer that serves its policy through the
    rollout service builds the same (``examples/rollout_service_trainer.py``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions)).eval()
