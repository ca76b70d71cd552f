"""One serving window of a rollout engine: the cycle every serving loop runs, written once.

A window (one time slice of the rollout request scheduler) is, in this order:

1. the scheduler takes the version the engine will serve (``set_policy_version``, with the
   engine's ``cache_reset``: an engine that drops its prefix KV on a weight load empties the
   scheduler's index too) and whether the trainer waits on critical work;
2. ``next_batch`` (stage 1 budget + stage 2 ordering) and ``take_aborts`` (running requests
   cancelled since the last window);
3. the engine runs the window (:class:`rollmux.rollout_sched.api.WindowCall`): load new weights
   when the call carries them, stop the aborted requests (their KV slot is free in the same
   window), admit the batch, run one slice when anything runs;
4. ``on_complete`` for every result whose request is still in flight at the scheduler (a late
   result of an aborted request is dropped).

:func:`run_window` is that function. The rollout service's per-replica loop
(:mod:`actors.rollout.service`) awaits it with the replica actor as the engine; the in-process
loop :func:`actors.rollout.engine.serve` drives it synchronously (:func:`drive`) with a
:class:`LocalWindowEngine` around its engine. :class:`LocalWindowEngine` is also what an engine
replica runs per call (:mod:`actors.rollout.replica`), so the engine side of a window is written
once too. No Ray here.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from rollmux.rollout_sched import Completion, Request, RolloutRequestScheduler
from rollmux.rollout_sched.api import EngineResult, WeightsLoad, WindowCall, WindowReply


class WindowEngine(Protocol):
    """The engine side of a window: an engine replica actor's handle, or :class:`LocalWindowEngine`."""

    async def window(self, call: WindowCall) -> WindowReply: ...


@dataclass
class WindowOutcome:
    """What one :func:`run_window` did.

    ``batch``: requests started; ``aborts``: running requests stopped; ``completed``: (request,
    result) of the requests that finished and were still in flight (``on_complete`` applied);
    ``reply``: the engine's reply (None when the window was idle: nothing to start, stop, run
    or load, so the engine was not called)."""

    batch: list[Request] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    completed: list[tuple[Request, EngineResult]] = field(default_factory=list)
    reply: Optional[WindowReply] = None

    @property
    def idle(self) -> bool:
        return self.reply is None


async def run_window(sched: RolloutRequestScheduler, engine: WindowEngine, now_s: float, *, version: int,
                     cache_reset: bool, trainer_waiting: bool, weights: Optional[WeightsLoad] = None,
                     engine_version: Optional[int] = None, logprobs: Callable[[Request], bool] = lambda r: False,
                     stream: Callable[[Request], bool] = lambda r: False, hold: bool = False,
                     on_dispatch: Optional[Callable[[list[Request]], None]] = None,
                     now: Optional[Callable[[], float]] = None) -> WindowOutcome:
    """Run one serving window of ``sched`` on ``engine`` at ``now_s`` (the scheduler's clock, s).

    Args:
        version: the policy version this window serves; a change moves the scheduler
            (``set_policy_version(version, cache_reset=cache_reset)``).
        weights: new weights the engine loads before the window (the call carries them).
        engine_version: the version the engine holds (None: ``version``); a window whose engine
            holds another version is not idle even with nothing to run, so the engine catches up.
        logprobs: whether a request of the batch wants its token log-probabilities.
        stream: whether a request of the batch wants its tokens as they are produced
            (``WindowReply.partial``).
        hold: start nothing this window (a weight update waits for the running requests to end).
        on_dispatch: called with the batch before the engine runs it (mark requests running).
        now: the clock read when the engine answered (None: ``now_s``); completions take the
            engine's ``finished_s`` when it reports one.
    Returns:
        :class:`WindowOutcome`. Raises whatever the engine call raises (a lost replica).
    """
    if version != sched.policy_version:
        sched.set_policy_version(version, cache_reset=cache_reset)
    sched.set_trainer_waiting(trainer_waiting)
    batch = [] if hold else sched.next_batch(now_s)
    aborts = sched.take_aborts()
    held = version if engine_version is None else engine_version
    if not batch and not aborts and sched.running == 0 and weights is None and held == version:
        return WindowOutcome()
    if on_dispatch is not None and batch:
        on_dispatch(batch)
    call = WindowCall(policy_version=version, aborts=aborts, batch=batch,
                      hits={r.request_id: sched.hit_of(r.request_id) for r in batch},
                      logprobs=[r.request_id for r in batch if logprobs(r)],
                      stream=[r.request_id for r in batch if stream(r)], weights=weights)
    reply = await engine.window(call)
    t = now() if now is not None else now_s
    out = WindowOutcome(batch=batch, aborts=aborts, reply=reply)
    for res in reply.results:
        if res.id not in sched.inflight:
            continue  # aborted (cancelled or re-queued) meanwhile
        req = sched.inflight[res.id][0].req
        sched.on_complete(res.id, tuple(res.output_token_ids), res.finished_s if res.finished_s is not None else t)
        out.completed.append((req, res))
    return out


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (:func:`run_window` on a :class:`LocalWindowEngine`)
    to its end, without an event loop. Raises RuntimeError if it suspends."""
    try:
        coro.send(None)
    except StopIteration as e:
        return e.value
    coro.close()
    raise RuntimeError("drive(): the window suspended (an engine that awaits needs an event loop)")


class LocalWindowEngine:
    """The engine side of a window on an engine in this process (:class:`actors.rollout.engine.RolloutEngine`).

    Per call: load ``call.weights`` (the engine's ``load_weights``) or, on a bare version change,
    tell the engine (``on_weights_updated``: its prefix KV is stale); stop ``call.aborts``; admit
    the batch; run one slice when anything runs; report what finished (with the engine's
    ``finished_s``, per-token weight versions and, where asked, token log-probabilities) and, for
    the running requests that asked to be streamed, the tokens they produced in the window (what
    the engine's ``partial_outputs`` holds beyond what was reported before).

    Args:
        engine: the engine. ``version``: the weights version it holds at start.
        logprob_hooks: ``(want(request_id), take(request_id) -> list | None)`` of an engine that
            records token log-probabilities (the replica's), or None.
        resolve: the tensors of a :class:`WeightsLoad` (default: decode its file; a replica
            resolves a sync-plan version it holds staged).
    """

    def __init__(self, engine: Any, version: int = 0, logprob_hooks: Optional[tuple[Callable, Callable]] = None,
                 resolve: Optional[Callable[[WeightsLoad], Any]] = None):
        self.engine = engine
        self._resolve = resolve
        self.version = version
        self.weights_version = version
        self.weights_sha256: Optional[str] = None
        self._lp = logprob_hooks
        self._max_tokens: dict[str, int] = {}
        self._streamed: dict[str, int] = {}  # streamed request -> tokens reported so far

    async def window(self, call: WindowCall) -> WindowReply:
        return self.run(call)

    def run(self, call: WindowCall) -> WindowReply:
        import time

        e = self.engine
        t0 = time.perf_counter()
        if call.weights is not None:
            if self._resolve is not None:
                tensors = self._resolve(call.weights)
            else:
                from actors.rollout.weights import decode

                tensors = decode(call.weights)
            self.weights_sha256 = e.load_weights(tensors)
            self.weights_version = call.weights.version
            e.weights_version = call.weights.version
        if call.policy_version != self.version:
            if call.weights is None:
                e.on_weights_updated(call.policy_version)
            self.version = call.policy_version
        if call.aborts:
            e.abort(call.aborts)
            for rid in call.aborts:
                self._max_tokens.pop(rid, None)
                self._streamed.pop(rid, None)
                if self._lp:
                    self._lp[1](rid)
        if call.batch:
            if self._lp:
                for rid in call.logprobs:
                    self._lp[0](rid)
            for r in call.batch:
                self._max_tokens[r.request_id] = r.max_tokens
            for rid in call.stream:
                self._streamed[rid] = 0
            e.admit(call.batch, call.hits)
        stepped = e.running > 0
        done: list[Completion] = e.step() if stepped else []
        out = []
        for c in done:
            toks = list(c.output_token_ids)
            cap = self._max_tokens.pop(c.request_id, 0)
            self._streamed.pop(c.request_id, None)
            out.append(EngineResult(
                id=c.request_id, output_token_ids=toks, score=c.score, finished_s=c.finished_s,
                token_versions=list(c.token_versions) if c.token_versions is not None else None,
                logprobs=self._lp[1](c.request_id) if self._lp else None,
                finish_reason="length" if c.score is None and len(toks) >= cap else "stop"))
        partial = {}
        if self._streamed:
            for rid, toks in e.partial_outputs(list(self._streamed)).items():
                if len(toks) > self._streamed[rid]:
                    partial[rid] = list(toks[self._streamed[rid]:])
                    self._streamed[rid] = len(toks)
        return WindowReply(results=out, running=e.running, engine_s=time.perf_counter() - t0, stepped=stepped,
                           weights_version=self.weights_version, weights_sha256=self.weights_sha256, partial=partial)

    def abort(self, request_ids: list[str]) -> None:
        """Stop these running requests now (outside a window: a loop that ends early)."""
        self.engine.abort(request_ids)
        for rid in request_ids:
            self._max_tokens.pop(rid, None)
            self._streamed.pop(rid, None)


__all__ = ["LocalWindowEngine", "WindowEngine", "WindowOutcome", "drive", "run_window"]
