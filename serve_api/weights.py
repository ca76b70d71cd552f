"""The weight-update routes of the rollout service (one ``APIRouter``; :func:`weights_router`).

A trainer hands the service its new policy as one safetensors file, the shapes of SGLang's
``update_weights_from_disk`` and of a chunked upload:

- ``POST /v1/weights/update_from_disk`` ``{model_path, weight_version, pause_mode, sha256?}``: a
  checkpoint under the service's ``weights_root``;
- ``POST /v1/weights/uploads`` ``{weight_version, size_bytes, sha256, pause_mode}`` -> 201 with the
  upload id and chunk size; ``PUT /v1/weights/uploads/{id}/chunks/{i}`` (raw bytes, each
  ``chunk_bytes`` but the last); ``POST /v1/weights/uploads/{id}:commit`` checks and applies it;
  ``DELETE /v1/weights/uploads/{id}`` drops it;
- ``GET /v1/weights``: the latest version, its digest, what each replica serves, recent updates.

An update answers when every replica serves it (``weights_sha256`` per replica); a refused one
(4xx naming the field) changes nothing. Work is done by the rollout service actor
(:mod:`actors.rollout.service`, :mod:`actors.rollout.updates`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from rollmux.rollout_sched.api import ID_PATTERN, Refusal
from rollmux.rollout_sched.weights import DiskUpdateBody, UploadStartBody, UploadView, WeightsView, WeightUpdateView
from serve_api.rollout_boundary import service_settings
from serve_api.rollouts import _refused, service_of
from serve_api.views import ErrorBody


def _answer(out: Any, status: int = 200) -> JSONResponse:
    return _refused(out) if isinstance(out, Refusal) else JSONResponse(out.model_dump(mode="json"), status_code=status)


def weights_router(ctx: Any) -> APIRouter:
    """The weight routes of one app (``ctx`` as :func:`serve_api.rollouts.rollouts_router`'s)."""
    app, svc, wait_s = APIRouter(), service_of(ctx), service_settings().update_timeout_s
    need_token, read_access, err, tags = ctx.need_token, ctx.read_access, {"model": ErrorBody}, ["weights"]

    @app.post("/v1/weights/update_from_disk", response_model=WeightUpdateView, dependencies=[Depends(need_token)],
              responses={401: err, 403: err, 404: err, 409: err, 413: err, 415: err, 422: err, 503: err,
                         504: err}, tags=tags)
    async def update_from_disk(body: DiskUpdateBody) -> Any:
        """Load ``model_path`` (a ``.safetensors`` file or a directory holding ``model.safetensors``,
        under ``weights_root``; elsewhere 403) as ``weight_version`` and apply it with ``pause_mode``.
        Answers when every replica serves it, with its digest (``weights_sha256``)."""
        return _answer(await svc.call(lambda h: h.update_from_disk(body, wait_s)))

    @app.post("/v1/weights/uploads", status_code=201, response_model=UploadView, dependencies=[Depends(need_token)],
              responses={401: err, 409: err, 413: err, 415: err, 422: err, 429: err, 503: err}, tags=tags)
    async def start_upload(body: UploadStartBody) -> Any:
        """Announce an upload of a safetensors file: ``size_bytes`` (at most ``max_weights_bytes``,
        else 413), its SHA-256, the version it is and the pause mode of its update -> the upload id,
        ``chunk_bytes`` and ``chunks``."""
        return _answer(await svc.call(lambda h: h.start_upload(body)), 201)

    @app.put("/v1/weights/uploads/{upload_id}/chunks/{index}", response_model=UploadView,
             dependencies=[Depends(need_token)], responses={401: err, 404: err, 413: err, 415: err, 422: err, 503: err},
             tags=tags, openapi_extra={"requestBody": {"required": True, "content": {
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def put_chunk(request: Request, upload_id: str = PathParam(pattern=ID_PATTERN),
                        index: int = PathParam(ge=0, le=1 << 30)) -> Any:
        """Chunk ``index``: bytes ``[index * chunk_bytes, ...)`` of the file, raw
        (``application/octet-stream``), ``chunk_bytes`` long (the last one: the rest)."""
        data = await request.body()
        return _answer(await svc.call(lambda h: h.put_chunk(upload_id, index, data)))

    @app.post("/v1/weights/uploads/{upload_id}:commit", response_model=WeightUpdateView,
              dependencies=[Depends(need_token)], responses={401: err, 404: err, 409: err, 413: err, 422: err, 503: err,
                                                             504: err}, tags=tags)
    async def commit_upload(upload_id: str = PathParam(pattern=ID_PATTERN)) -> Any:
        """Check the upload (every chunk received, SHA-256, a safetensors file with the engine's
        tensors, a newer version) and apply it; a refusal names the field and changes nothing."""
        return _answer(await svc.call(lambda h: h.commit_upload(upload_id, wait_s)))

    @app.delete("/v1/weights/uploads/{upload_id}", dependencies=[Depends(need_token)],
                responses={401: err, 404: err, 503: err}, tags=tags)
    async def cancel_upload(upload_id: str = PathParam(pattern=ID_PATTERN)) -> Any:
        if not await svc.call(lambda h: h.cancel_upload(upload_id)):
            return _refused(Refusal(status=404, error="not_found", detail=f"upload_id: unknown upload {upload_id!r}"))
        return JSONResponse({"upload_id": upload_id, "deleted": True})

    @app.get("/v1/weights", response_model=WeightsView, dependencies=[Depends(read_access)],
             responses={401: err, 503: err}, tags=tags)
    async def weights() -> Any:
        """The latest weights version and its digest, what every replica serves, the recent updates
        (version, digest, bytes, load time)."""
        return _answer(await svc.call(lambda h: h.weights_view()))

    return app


__all__ = ["weights_router"]
