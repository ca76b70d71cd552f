"""The rollout service routes (one ``APIRouter``; :func:`rollouts_router`), on the admission API's app.

``POST /v1/rollouts`` (one request or a batch -> 202 per request: id, ``queued``, expected window,
queue position, matched prefix tokens), ``GET /v1/rollouts/{id}``, ``POST /v1/rollouts:stream``
(NDJSON or server-sent events, results as they finish), ``DELETE /v1/rollouts/{id}``,
``POST /v1/rollouts:cancel``, ``POST /v1/policy``, ``GET /v1/stats`` (JSON) and
``GET /v1/stats/prometheus``, and the OpenAI-style ``POST /v1/completions`` /
``POST /v1/chat/completions`` (``stream: true``: server-sent chunks as the tokens are produced) and
``GET /v1/models``.
Writes need the bearer token; reads follow ``open_read_routes``.
Bodies pass :mod:`serve_api.rollout_boundary` first. The work is done by the rollout service actor
(:mod:`actors.rollout.service`), reached through :class:`actors.handles.RolloutServiceHandle`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Optional

from fastapi import APIRouter, Depends
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from actors.handles import ActorLost, CallTimeout, RolloutServiceHandle
from rollmux.rollout_sched.api import (
    ID_PATTERN, ByteTokenizer, CancelBody, CancelReply, ChatBody, CompletionBody, PolicyBody, PolicyView, PollReply,
    Refusal,
    RolloutIn, RolloutView, Status, StreamBody, SubmitBatch, SubmitReply, TokenCursor, openai_request,
)
from serve_api.rollout_boundary import service_settings
from serve_api.views import ApiError, ErrorBody

class _RefusedError(Exception):
    def __init__(self, refusal: Refusal):
        self.refusal = refusal


def _refused(r: Refusal) -> JSONResponse:
    body: dict[str, Any] = {"error": r.error, "detail": r.detail}
    if r.errors:
        body["errors"] = [e.model_dump() for e in r.errors]
    headers = {"Retry-After": str(r.retry_after_s or 1)} if r.status in (429, 503, 504) else None
    return JSONResponse(body, status_code=r.status, headers=headers)


async def _cancel_quietly(h: RolloutServiceHandle, rid: str) -> None:
    """Cancel a request whose reader went away (the service being gone cancels nothing)."""
    try:
        await h.cancel([rid])
    except Exception:  # the service is gone: nothing runs there
        pass


async def _detach(h: RolloutServiceHandle, ids: list[str]) -> None:
    """Start the grace period of a broken stream's requests (their leases lapse anyway if this fails)."""
    try:
        await h.detach(ids)
    except Exception:  # the service is gone: nothing to cancel there
        pass


class _Service:
    """The service handle of a replica, created (and the service actor with it) on first use."""

    def __init__(self, name: str, timeout_s: float):
        self.name, self.timeout_s = name, timeout_s
        self._h: Optional[RolloutServiceHandle] = None

    async def get(self) -> RolloutServiceHandle:
        if self._h is None:
            from actors.rollout.service import ensure_rollout_service

            self._h = await asyncio.to_thread(ensure_rollout_service, self.name, timeout_s=self.timeout_s)
        return self._h

    async def call(self, fn) -> Any:
        try:
            return await fn(await self.get())
        except ActorLost as e:
            self._h = None
            raise ApiError(503, "rollout_service_unavailable", f"the rollout service cannot be reached ({e})",
                           retry_after_s=1) from None
        except CallTimeout as e:
            raise ApiError(503, "rollout_service_unavailable", str(e), retry_after_s=1) from None


def service_of(ctx: Any) -> _Service:
    """The rollout service handle of an app (one per router; the actor is shared)."""
    from actors.rollout.service import service_name

    return _Service(service_name(ctx.settings.scheduler_name or "default"), ctx.settings.request_timeout_s)


def rollouts_router(ctx: Any) -> APIRouter:
    """The rollout routes of one app (``ctx``: has ``settings`` (:class:`serve_api.views.AppSettings`),
    ``need_token`` and ``read_access``, e.g. the admission API's :class:`serve_api.jobs.AppContext`)."""
    settings, app, svc = service_settings(), APIRouter(), service_of(ctx)
    need_token, read_access, err, tags = ctx.need_token, ctx.read_access, {"model": ErrorBody}, ["rollouts"]

    @app.post("/v1/rollouts", status_code=202, response_model=SubmitReply, dependencies=[Depends(need_token)],
              responses={401: err, 409: err, 413: err, 415: err, 422: err, 429: err, 503: err}, tags=tags)
    async def submit_rollouts(batch: SubmitBatch) -> Any:
        """Queue one request or a batch (``{"requests": [...]}``, at most 512): 202 with, per request,
        its id, status ``queued``, expected window, queue position and matched prefix tokens. All or
        nothing: a bad field -> 422 naming it (``requests.<i>.<field>``), an old policy version -> 409,
        a full queue -> 429 with ``Retry-After``."""
        out = await svc.call(lambda h: h.submit(batch))
        if isinstance(out, Refusal):
            return _refused(out)
        return JSONResponse(out.model_dump(mode="json"), status_code=202)

    @app.get("/v1/rollouts/{request_id}", response_model=RolloutView, dependencies=[Depends(read_access)],
             responses={401: err, 404: err, 503: err}, tags=tags)
    async def get_rollout(request_id: str = PathParam(pattern=ID_PATTERN)) -> Any:
        """Status and result: output tokens and text, log-probs (when asked), score, finish reason, timings (s)."""
        v = await svc.call(lambda h: h.get(request_id))
        if v is None:
            raise ApiError(404, "not_found", f"request_id: unknown rollout request {request_id!r}")
        return JSONResponse(v.model_dump(mode="json"))

    @app.post("/v1/rollouts:stream", dependencies=[Depends(need_token)], tags=tags,
              responses={200: {"content": {"application/x-ndjson": {}, "text/event-stream": {}},
                               "description": "one RolloutView per line (NDJSON) or per event (SSE), then an end record"},
                         401: err, 404: err, 413: err, 415: err, 422: err, 503: err})
    async def stream_rollouts(body: StreamBody) -> Any:
        """Results of ``ids`` and/or a session's requests as they finish, over one long-lived response
        (chunked NDJSON, or SSE with ``"format": "sse"``); ends with ``{"event": "end", ...}`` when none is
        pending or after ``timeout_s``. ``"tokens": true``: before each result, records
        ``{"event": "tokens", "id", "offset", "tokens", "restarts"}`` as the engine produces them
        (``stream_tokens`` requests; ``offset`` back to 0 with ``restarts`` up when one started over). A client that goes away: its unfinished requests are cancelled after
        ``disconnect_grace_s``. Unknown ids -> 404."""
        first = await svc.call(lambda h: h.poll(body.ids, body.session_id, 0.0))
        if first.unknown and not first.results and not first.pending:
            raise ApiError(404, "not_found", f"ids: unknown rollout requests {first.unknown[:8]}")
        h = await svc.get()
        sse = body.format == "sse"

        def line(obj: dict, event: str = "result") -> bytes:
            data = json.dumps(obj, separators=(",", ":"))
            return f"event: {event}\ndata: {data}\n\n".encode() if sse else (data + "\n").encode()

        async def gen() -> AsyncIterator[bytes]:
            delivered: set[str] = set()
            pending = list(first.pending)
            deadline = time.monotonic() + body.timeout_s
            reply = first
            cursors = {rid: TokenCursor(id=rid) for rid in pending} if body.tokens else {}
            try:
                while True:
                    for v in reply.results:
                        if v.id not in delivered:
                            delivered.add(v.id)
                            yield line(v.model_dump(mode="json"))
                    pending = [i for i in reply.pending if i not in delivered]
                    if not pending or time.monotonic() >= deadline:
                        break
                    wait = min(settings.stream_wait_s, max(0.0, deadline - time.monotonic()))
                    try:
                        if body.tokens:
                            got = await h.tokens([cursors[i] for i in pending], wait)
                            for d in got.deltas:
                                if d.tokens or d.restarts != cursors[d.id].restarts:
                                    yield line({"event": "tokens", **d.model_dump(mode="json", exclude={"view"})},
                                               "tokens")
                                cursors[d.id] = TokenCursor(id=d.id, offset=d.offset + len(d.tokens), restarts=d.restarts)
                            ended = {d.id: d.view for d in got.deltas if d.view is not None}
                            gone = set(ended) | set(got.unknown)
                            reply = PollReply(results=list(ended.values()), pending=[i for i in pending if i not in gone])
                        else:
                            reply = await h.poll(pending, body.session_id, wait)
                    except (ActorLost, CallTimeout) as e:  # headers are sent: end the stream saying why
                        yield line({"event": "end", "delivered": len(delivered), "pending": pending,
                                    "unknown": first.unknown, "error": "rollout_service_unavailable",
                                    "detail": str(e).splitlines()[0][:300]}, "end")
                        return
                yield line({"event": "end", "delivered": len(delivered), "pending": pending, "unknown": first.unknown}, "end")
                pending = []
            finally:
                if pending:  # the client went away mid-stream (or the stream broke): start the grace period
                    asyncio.ensure_future(_detach(h, pending))

        media = "text/event-stream" if sse else "application/x-ndjson"
        return StreamingResponse(gen(), media_type=media, headers={"Cache-Control": "no-store"})

    @app.delete("/v1/rollouts/{request_id}", response_model=CancelReply, dependencies=[Depends(need_token)],
                responses={401: err, 404: err, 409: err, 503: err}, tags=tags)
    async def cancel_rollout(request_id: str = PathParam(pattern=ID_PATTERN)) -> Any:
        """Cancel one request: queued -> dropped; running -> aborted (its KV freed in the same window).
        404 unknown, 409 already ended."""
        out: CancelReply = await svc.call(lambda h: h.cancel([request_id]))
        if out.unknown:
            raise ApiError(404, "not_found", f"request_id: unknown rollout request {request_id!r}")
        if out.already_ended:
            raise ApiError(409, "already_ended", f"request_id: {request_id!r} already ended")
        return JSONResponse(out.model_dump(mode="json"))

    @app.post("/v1/rollouts:cancel", response_model=CancelReply, dependencies=[Depends(need_token)],
              responses={401: err, 413: err, 415: err, 422: err, 503: err}, tags=tags)
    async def cancel_rollouts(body: CancelBody) -> Any:
        """Batch cancel (e.g. the leftovers after over-sampling): which ids were dropped (queued),
        aborted (running), had already ended, or are unknown."""
        out = await svc.call(lambda h: h.cancel(body.ids))
        return JSONResponse(out.model_dump(mode="json"))

    @app.post("/v1/policy", response_model=PolicyView, dependencies=[Depends(need_token)],
              responses={401: err, 409: err, 413: err, 415: err, 422: err, 503: err}, tags=tags)
    async def set_policy(body: PolicyBody) -> Any:
        """The trainer's weights advanced to ``version``: prefix entries made by older weights stop
        matching at once; requests from versions below the new minimum get 409. A version older than
        the current minimum -> 409."""
        out = await svc.call(lambda h: h.set_policy(body.version, body.min_version))
        if isinstance(out, Refusal):
            return _refused(out)
        return JSONResponse(out.model_dump(mode="json"))

    @app.get("/v1/stats", dependencies=[Depends(read_access)], responses={401: err, 503: err}, tags=tags)
    async def stats() -> Any:
        """Sample throughput, trainer idle ratio, prefix hit ratio, training step time, diversity score,
        prefix-index memory, queues and per-replica figures (docs/ROLLOUT_SERVICE.md)."""
        return JSONResponse((await svc.call(lambda h: h.stats())).model_dump())

    @app.get("/v1/stats/prometheus", dependencies=[Depends(read_access)], tags=tags,
             responses={200: {"content": {"text/plain": {}}}, 401: err, 503: err})
    async def stats_prometheus() -> Any:
        """The same figures as Prometheus series (bounded labels: replica, cls, outcome)."""
        from actors.rollout.metrics import render_prometheus

        s = await svc.call(lambda h: h.stats())
        return Response(render_prometheus(s), media_type="text/plain; version=0.0.4")

    async def _submit(body: CompletionBody | ChatBody) -> tuple[str, RolloutIn]:
        """Submit an OpenAI-style body as one generation -> (its id, the request). Raises
        :class:`_RefusedError` when the service refuses it."""
        if body.model is not None and body.model != settings.model_name:
            raise ApiError(404, "model_not_found", f"model: {body.model!r} is not served here (GET /v1/models lists "
                           f"{settings.model_name!r})")
        try:
            req = openai_request(body)
        except ValidationError as e:
            raise RequestValidationError([{**x, "loc": ("body", *x.get("loc", ()))} for x in e.errors()]) from None
        out = await svc.call(lambda h: h.submit(SubmitBatch(requests=[req])))
        if isinstance(out, Refusal):
            raise _RefusedError(out)
        return out.requests[0].id, req

    async def _finished(body: CompletionBody | ChatBody) -> tuple[RolloutView, RolloutIn]:
        """Run an OpenAI-style body as a generation and wait for it (at most ``completion_timeout_s``)."""
        rid, req = await _submit(body)
        timeout = settings.completion_timeout_s
        v: RolloutView = await svc.call(lambda h: h.wait_result(rid, timeout))
        if v is None or v.status is not Status.FINISHED:
            if v is not None and v.status in (Status.QUEUED, Status.RUNNING):
                await svc.call(lambda h: h.cancel([rid]))
                raise ApiError(503, "timeout", f"request {rid} did not finish within {timeout:g} s "
                               "(completion_timeout_s; it was cancelled)", retry_after_s=1)
            raise ApiError(409 if v is not None and v.status is Status.CANCELLED else 503,
                           str(v.finish_reason if v else "lost"), (v.error if v else None) or "the request did not finish",
                           retry_after_s=1)
        return v, req

    def _usage(v: RolloutView, req: RolloutIn) -> dict:
        n_prompt = len(req.token_ids())
        return {"prompt_tokens": n_prompt, "completion_tokens": len(v.output_token_ids),
                "total_tokens": n_prompt + len(v.output_token_ids)}

    def _rollmux(v: RolloutView) -> dict:
        return {"priority": v.priority.value, "policy_version": v.policy_version, "replica": v.replica,
                "matched_prefix_tokens": v.matched_prefix_tokens, "session_id": v.session_id,
                "version_span": v.version_span, "timings": v.timings.model_dump()}

    async def _complete(body: CompletionBody | ChatBody, chat: bool) -> Any:
        obj = "chat.completion" if chat else "text_completion"
        model = body.model or settings.model_name
        try:
            if body.stream:
                rid, req = await _submit(body)
                include_usage = bool((body.stream_options or {}).get("include_usage"))
                return StreamingResponse(_sse(await svc.get(), rid, req, chat, model, include_usage),
                                         media_type="text/event-stream", headers={"Cache-Control": "no-store"})
            v, req = await _finished(body)
        except _RefusedError as e:
            return _refused(e.refusal)
        text = v.text or ""
        lp = None
        if v.logprobs is not None:
            lp = {"tokens": [ByteTokenizer.decode([t]) for t in v.output_token_ids], "token_logprobs": v.logprobs}
        choice: dict[str, Any] = {"index": 0, "finish_reason": v.finish_reason, "logprobs": lp}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({"id": v.id, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
                             "usage": _usage(v, req), "rollmux": _rollmux(v)})

    async def _sse(h: RolloutServiceHandle, rid: str, req: RolloutIn, chat: bool, model: str,
                   usage: bool) -> AsyncIterator[bytes]:
        """OpenAI's streamed chunks (``chat.completion.chunk`` / ``text_completion``) of generation
        ``rid`` as the engine produces its tokens (one chunk per token, as a window reports them),
        then the finish reason, then ``[DONE]``; an error chunk (``{"error": ...}``, what OpenAI's
        clients raise on) when it fails, is cancelled, restarts after tokens were sent, or passes
        ``completion_timeout_s``. A client that goes away cancels the generation."""
        obj, created = ("chat.completion.chunk" if chat else "text_completion"), int(time.time())

        def data(obj_: dict) -> bytes:
            return f"data: {json.dumps(obj_, separators=(',', ':'))}\n\n".encode()

        def chunk(delta: Optional[str], finish: Optional[str] = None, first: bool = False,
                  view: Optional[RolloutView] = None) -> bytes:
            if chat:
                d: dict[str, Any] = {"role": "assistant", "content": ""} if first else {} if delta is None else {"content": delta}
                choice: dict[str, Any] = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            out = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
            if view is not None:
                out["rollmux"] = _rollmux(view)
            return data(out)

        def error(kind: str, msg: str) -> bytes:
            return data({"error": {"message": f"request {rid}: {msg}", "type": kind, "code": kind}})

        decode = ByteTokenizer.incremental()
        offset, restarts, ended = 0, 0, None
        deadline = time.monotonic() + settings.completion_timeout_s
        try:
            if chat:
                yield chunk(None, first=True)
            while ended is None:
                wait = min(settings.stream_wait_s, max(0.0, deadline - time.monotonic()))
                try:
                    got = await h.tokens([TokenCursor(id=rid, offset=offset, restarts=restarts)], wait)
                except (ActorLost, CallTimeout) as e:  # headers are sent: end the stream saying why
                    yield error("rollout_service_unavailable", str(e).splitlines()[0][:300])
                    return
                if got.unknown:
                    yield error("not_found", "the rollout service lost it")
                    return
                if not got.deltas:
                    if time.monotonic() >= deadline:
                        yield error("timeout", f"not finished within completion_timeout_s "
                                    f"{settings.completion_timeout_s:g} s (it was cancelled)")
                        return
                    continue
                d = got.deltas[0]
                if d.restarts != restarts:
                    if offset:  # tokens already sent cannot be taken back
                        yield error("restarted", f"it started over after {offset} tokens were streamed (a weight "
                                    "update with pause_mode abort, or its replica was lost); resubmit it")
                        return
                    restarts = d.restarts
                for t in d.tokens:
                    if piece := decode([t]):
                        yield chunk(piece)
                offset, ended = d.offset + len(d.tokens), d.view
            if ended.status is not Status.FINISHED:
                yield error(str(ended.finish_reason or ended.status.value), ended.error or "the request did not finish")
                return
            if tail := decode([], final=True):
                yield chunk(tail)
            yield chunk(None, ended.finish_reason or "stop", view=ended)
            if usage:
                yield data({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                            "usage": _usage(ended, req)})
            yield b"data: [DONE]\n\n"
        finally:
            if ended is None:  # the client went away, or the stream broke: stop the generation
                asyncio.ensure_future(_cancel_quietly(h, rid))

    oa = ["openai"]
    sse = {"text/event-stream": {}}

    @app.post("/v1/completions", dependencies=[Depends(need_token)], tags=oa,
              responses={200: {"content": sse, "description": "a completion, or (stream: true) server-sent chunks"},
                         401: err, 404: err, 409: err, 413: err, 415: err, 422: err, 429: err, 503: err})
    async def completions(body: CompletionBody) -> Any:
        """OpenAI-style completion through the same scheduler, at the service's current policy
        version unless ``policy_version`` names one (the answer's ``rollmux.policy_version`` says
        which); extra fields ``priority``, ``policy_version``, ``task_family``, ``session_id``.
        ``stream: true``: server-sent ``text_completion`` chunks as the tokens are produced, then
        ``data: [DONE]``."""
        return await _complete(body, chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(need_token)], tags=oa,
              responses={200: {"content": sse, "description": "a chat completion, or (stream: true) server-sent chunks"},
                         401: err, 404: err, 409: err, 413: err, 415: err, 422: err, 429: err, 503: err})
    async def chat_completions(body: ChatBody) -> Any:
        """OpenAI-style chat completion (messages rendered as ``<|role|>\\ncontent\\n``); extra fields as
        ``/v1/completions``. With ``session_id`` send only the new messages: the session's history is kept.
        ``stream: true``: server-sent ``chat.completion.chunk`` chunks as the tokens are produced,
        then ``data: [DONE]``."""
        return await _complete(body, chat=True)

    def _model() -> dict:
        return {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "rollmux"}

    @app.get("/v1/models", dependencies=[Depends(read_access)], tags=oa, responses={401: err})
    async def list_models() -> Any:
        """The model the OpenAI-style routes serve (``service.model_name``)."""
        return JSONResponse({"object": "list", "data": [_model()]})

    @app.get("/v1/models/{model}", dependencies=[Depends(read_access)], tags=oa, responses={401: err, 404: err})
    async def get_model(model: str = PathParam(max_length=256)) -> Any:
        if model != settings.model_name:
            raise ApiError(404, "model_not_found", f"model: {model!r} is not served here (served: {settings.model_name!r})")
        return JSONResponse(_model())

    return app
