"""Engine side of rollout request scheduling: engines that take their batches from
:class:`rollmux.rollout_sched.RolloutRequestScheduler`, and the engine loop :func:`serve`.

Engines (one interface, :class:`RolloutEngine`):

* :class:`CPUEngine`: a tiny transformers causal LM built from a config (no download); prefill
  then a manual decode loop with a KV cache per request, ``slice_tokens`` decode steps per running
  generation per window. Reward queries are answered by a cheap scorer (one forward pass),
  replay items by a prompt log-probability pass, state queries by a short generation.
* :class:`SimulatedEngine`: the same contract on a virtual clock with a cost model of one H20
  serving a 7B model (prefill FLOPs, memory-bound decode steps), for scale runs.
* :class:`actors.rollout.vllm_engine.VLLMEngine`: vLLM's ``LLMEngine`` with automatic prefix
  caching on (vLLM's CPU build in the test command, or CUDA).

:func:`serve` runs scheduling windows: poll arrivals and cancellations (queued requests are dropped,
running ones aborted: the engine stops them before the next slice, their KV slot is free in the
same window) -> stage-1 budget + stage-2 ordering -> admit the batch -> run one time slice ->
report completions. ``serve(..., sample_target=n)`` ends a step once ``n`` generations finished
(over-sampling: the leftovers are aborted, not waited for). Because long generations advance one
slice per window, a short reward query submitted while they run enters at the next slice boundary
(time slices), and its wait is bounded (``MixedPolicy`` starvation bound).
No Ray here: the RolloutWorker actor wraps an engine and calls :func:`serve`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import time
from collections import OrderedDict
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rollmux.rollout_sched import Completion, Request, RequestType, RolloutRequestScheduler


def _seed_of(request_id: str, seed: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest(), "little") >> 1


class RolloutEngine(ABC):
    """Contract of an engine driven by :func:`serve`. Times are seconds on ``now()``'s clock."""

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
    #: the CPU engine); :func:`serve` then tells the scheduler, which stops crediting old prefixes.
    resets_prefix_cache_on_update: bool = True

    def on_weights_updated(self, version: int) -> None:  # noqa: B027 - optional hook
        """New policy weights were loaded (engines with a prefix cache may reset it)."""

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
    version the engine loads it (``on_weights_updated``) and, when it resets its prefix cache
    (``resets_prefix_cache_on_update``), the scheduler forgets every prefix.
    ``on_window(now_s, batch, completions)`` is called after each slice (metrics, logging).
    Raises RuntimeError when no progress is possible (queued requests that can never be admitted,
    nothing running, no next event).
    """
    if sample_target is not None and sample_target < 1:
        raise ValueError(f"sample_target must be >= 1, got {sample_target}")
    stats = ServeStats()
    t_wall = time.monotonic()
    version = None
    stuck = 0
    samples = 0
    mine: set[str] = set()  # requests of this call (the scheduler may hold others')

    def abort_running() -> None:
        ids = scheduler.take_aborts()
        if ids:
            engine.abort(ids)
            stats.aborted += len(ids)

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
        abort_running()
        v = source.policy_version()
        if v != version:
            version = v
            if v != scheduler.policy_version:  # new weights: the engine loads them, maybe dropping its prefix KV
                engine.on_weights_updated(v)
                scheduler.set_policy_version(v, cache_reset=engine.resets_prefix_cache_on_update)
        scheduler.set_trainer_waiting(source.trainer_waiting())
        batch = scheduler.next_batch(now)
        if batch:
            engine.admit(batch, {r.request_id: scheduler.hit_of(r.request_id) for r in batch})
        if engine.running == 0:
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
        comps = engine.step()
        stats.windows += 1
        comps = [c for c in comps if c.request_id in scheduler.inflight]  # an aborted request's late result
        for c in comps:
            if scheduler.inflight[c.request_id][0].req.type is RequestType.GENERATION:
                samples += 1
            scheduler.on_complete(c.request_id, c.output_token_ids, c.finished_s)
            source.on_complete(c, c.finished_s)
        stats.completed += len(comps)
        if on_window is not None:
            on_window(now, batch, comps)
        if sample_target is not None and samples >= sample_target:
            for rid in list(scheduler.queue) + list(scheduler.inflight):
                if rid in mine:
                    scheduler.cancel(rid)
            abort_running()
            stats.stopped_by = "sample_target"
            break
    stats.end_s = engine.now()
    return stats


# ----------------------------------------------------------------------------- simulated engine
@dataclass(frozen=True)
class SimCostModel:
    """Roofline cost model of one inference GPU, seconds.

    Defaults: a 7B bf16 policy on one H20 (148 TFLOP/s, 4.0 TB/s) at ~50% MFU: one token of
    compute = 2 x 7e9 FLOP / 74e12 FLOP/s = 1.9e-4 s (prefill per token; decode per running
    sequence). A decode step takes max(memory time, compute time): memory = the weights
    (14 GB / 4 TB/s = 3.5 ms) + every running sequence's KV (57 KB/token / 4 TB/s = 1.4e-8 s/token);
    compute = running sequences x 1.9e-4 s.
    """

    prefill_s_per_token: float = 1.9e-4
    prefill_base_s: float = 2e-3
    decode_base_s: float = 3.5e-3
    decode_s_per_seq: float = 1.9e-4
    decode_s_per_kv_token: float = 1.4e-8


@dataclass
class _SimReq:
    req: Request
    remaining: int
    kv: int
    out: list[int] = field(default_factory=list)


class SimulatedEngine(RolloutEngine):
    """Virtual-clock engine with :class:`SimCostModel`.

    Args:
        slice_tokens: decode steps per window.
        output_len: true output length of a request (default ``max_tokens``), capped at max_tokens.
        output_tokens: ``(request, n) -> tokens`` generated (default: uniform over 32000 ids).
        cost: the cost model. Prefix hits skip their prefill tokens (the engine's prefix cache).
    """

    def __init__(
        self,
        slice_tokens: int = 32,
        *,
        output_len: Callable[[Request], int] | None = None,
        output_tokens: Callable[[Request, int], tuple[int, ...]] | None = None,
        cost: SimCostModel = SimCostModel(),
        seed: int = 0,
    ):
        self.slice_tokens = slice_tokens
        self.cost = cost
        self._len = output_len or (lambda r: r.max_tokens)
        rng = np.random.default_rng(seed)
        self._tok = output_tokens or (lambda r, n: tuple(int(x) for x in rng.integers(0, 32000, n)))
        self.clock = 0.0
        self._run: list[_SimReq] = []
        self._new: list[tuple[_SimReq, int]] = []
        self.busy_s = 0.0
        self.prefill_tokens = 0
        self.prefill_saved_tokens = 0
        self.decode_tokens = 0

    def now(self) -> float:
        return self.clock

    def idle_until(self, t_s: float) -> None:
        self.clock = max(self.clock, t_s)

    @property
    def running(self) -> int:
        return len(self._run) + len(self._new)

    def admit(self, batch: list[Request], hits: dict[str, int]) -> None:
        for r in batch:
            n = 0 if r.type is RequestType.REPLAY else max(1, min(r.max_tokens, int(self._len(r))))
            self._new.append((_SimReq(r, n, len(r.prompt_token_ids)), hits.get(r.request_id, 0)))

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        self._run = [s for s in self._run if s.req.request_id not in ids]
        self._new = [(s, h) for s, h in self._new if s.req.request_id not in ids]

    def step(self) -> list[Completion]:
        c, t = self.cost, self.clock
        done: list[Completion] = []
        if self._new:
            toks = sum(len(s.req.prompt_token_ids) - h for s, h in self._new)
            self.prefill_tokens += toks
            self.prefill_saved_tokens += sum(h for _, h in self._new)
            t += c.prefill_base_s + c.prefill_s_per_token * toks
            for s, _ in self._new:
                if s.remaining > 0:  # prefill emits the first token
                    s.remaining -= 1
                    s.kv += 1
                if s.remaining == 0:
                    done.append(self._finish(s, t))
                else:
                    self._run.append(s)
            self._new = []
        for _ in range(self.slice_tokens):
            if not self._run:
                break
            kv = sum(s.kv for s in self._run)
            t += max(c.decode_base_s + c.decode_s_per_kv_token * kv, c.decode_s_per_seq * len(self._run))
            self.decode_tokens += len(self._run)
            still = []
            for s in self._run:
                s.remaining -= 1
                s.kv += 1
                if s.remaining == 0:
                    done.append(self._finish(s, t))
                else:
                    still.append(s)
            self._run = still
        self.busy_s += t - self.clock
        self.clock = t
        return done

    def _finish(self, s: _SimReq, t: float) -> Completion:
        r = s.req
        if r.type is RequestType.REPLAY:
            return Completion(r.request_id, (), t, score=0.0)
        n = min(r.max_tokens, int(self._len(r)))
        out = self._tok(r, max(1, n))
        score = float(sum(out) % 1000) / 1000.0 if r.type is RequestType.REWARD else None
        return Completion(r.request_id, tuple(out), t, score=score)


# ----------------------------------------------------------------------------- CPU engine
@dataclass
class _Live:
    req: Request
    cache: Any
    next_token: int
    out: list[int]
    gen: Any


class _WallClockEngine(RolloutEngine):
    """Real engines: ``now()`` is wall time since ``_t0``; idling sleeps, at most 50 ms a call."""

    _t0: float

    def now(self) -> float:
        return time.monotonic() - self._t0

    def idle_until(self, t_s: float) -> None:
        time.sleep(min(0.05, max(0.0, t_s - self.now())))


class CPUEngine(_WallClockEngine):
    """A tiny transformers causal LM on CPU (built from a ``LlamaConfig``; random weights, no download).

    Generation: one prefill forward, then a manual decode loop reusing the KV cache
    (``past_key_values``), ``slice_tokens`` tokens per running request per :meth:`step`; stops at
    ``eos_token_id`` (if set) or ``max_tokens``. Prefix caching: the KV of the last
    ``prefix_cache_entries`` prompts is kept; a new prompt copies the entry with the longest common
    prefix, crops it to that prefix and prefills only the rest (``prefill_tokens_reused`` /
    ``prefill_tokens_computed`` count it); the cache is dropped on a weight update. Sampling is seeded per request id, so a request's
    output does not depend on what it was batched with. Reward query: score = sigmoid(logit[1] -
    logit[0]) at the last prompt position (one forward). Replay: mean log-probability of the prompt.

    Args:
        vocab_size, hidden_size, num_layers, num_heads, num_kv_heads: model shape.
        slice_tokens: decode steps per request per window.
        eos_token_id: stop token (None: always run to max_tokens).
        seed: weight-init and sampling seed.
        model: an existing transformers causal LM to serve instead of building one (the rollout
            backend ``sched`` passes the job's policy); the shape arguments are then ignored.
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
    ):
        import inspect

        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        self._torch = torch
        cfg = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=max_positions,
        )
        if model is not None:  # an existing causal LM (e.g. a job's policy); shape args are ignored
            self.model = model.eval()
            vocab_size = int(model.config.vocab_size)
        else:
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                self.model = LlamaForCausalLM(cfg).eval()
        self.vocab_size = vocab_size
        self.slice_tokens = slice_tokens
        self.eos = eos_token_id
        self.seed = seed
        self._t0 = time.monotonic()
        self._live: list[_Live] = []
        self._done: list[Completion] = []
        self.forward_calls = 0
        self.num_threads = num_threads
        self.prefix_cache_entries = prefix_cache_entries
        self._pcache: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.prefill_tokens_reused = 0
        self.prefill_tokens_computed = 0
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
        """Prefill ``ids`` reusing the longest cached prompt prefix; returns (logits, cache)."""
        best, hit = None, 0
        for key in self._pcache:
            n = min(len(key), len(ids))
            k = 0
            while k < n and key[k] == ids[k]:
                k += 1
            if k > hit:
                best, hit = key, k
        hit = min(hit, len(ids) - 1)  # at least one token must run to produce logits
        if best is not None and hit > 0:
            self._pcache.move_to_end(best)
            cache = copy.deepcopy(self._pcache[best])
            cache.crop(-(cache.get_seq_length() - hit))  # negative: tokens to drop (all versions)
            logits, cache = self._forward(list(ids[hit:]), cache)
        else:
            hit = 0
            logits, cache = self._forward(list(ids))
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

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        self._live = [s for s in self._live if s.req.request_id not in ids]
        self._done = [c for c in self._done if c.request_id not in ids]

    def _sample(self, logits, gen, drawn: int) -> int:
        """Sample one token; ``drawn`` = tokens this request has sampled before (hook for subclasses)."""
        torch = self._torch
        return int(torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen))

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
                    gen = torch.Generator().manual_seed(_seed_of(r.request_id, self.seed))
                    logits, cache = self._prefill(r.prompt_token_ids)
                    self._live.append(_Live(r, cache, self._sample(logits[-1], gen, 0), [], gen))

    def step(self) -> list[Completion]:
        torch = self._torch
        done, self._done = self._done, []
        with self._threads():
            for _ in range(self.slice_tokens):
                still = []
                for s in self._live:
                    s.out.append(s.next_token)
                    if len(s.out) >= s.req.max_tokens or s.next_token == self.eos:
                        done.append(Completion(s.req.request_id, tuple(s.out), self.now()))
                        continue
                    logits, s.cache = self._forward([s.next_token], s.cache)
                    s.next_token = self._sample(logits[-1], s.gen, len(s.out))
                    still.append(s)
                self._live = still
                if not self._live:
                    break
        return done
