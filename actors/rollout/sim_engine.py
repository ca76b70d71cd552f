"""The simulated rollout engine: the engine contract of :mod:`actors.rollout.engine` on a virtual
clock with a roofline cost model of one inference GPU (scale runs of the rollout request
scheduler, ``scripts/bench_rollout_sched.py``). No Ray, no torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from actors.rollout.engine import RolloutEngine
from rollmux.rollout_sched import Completion, Request, RequestType


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



__all__ = ["SimCostModel", "SimulatedEngine"]
