"""Settings of the rollout service (``service:`` of a ``configs/rollout_sched.yaml`` section).

Pure pydantic, ``extra="forbid"``: a typo or an out-of-range value raises
:class:`pydantic.ValidationError` naming the field. Units are in the names.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: most requests one ``POST /v1/rollouts`` may carry.
MAX_SUBMIT_REQUESTS = 512
#: deepest JSON nesting (objects and arrays) the rollout routes accept.
MAX_JSON_DEPTH = 16


class ServiceConfig(BaseModel):
    """The rollout service: engine replicas, queue bound, request limits and lifetimes.

    Attributes:
        num_replicas: engine replicas (one serving loop each; requests are routed across them).
        policy: scheduling policy of every replica (``mixed`` | ``prefix`` | ``fifo``).
        queue_capacity: requests queued (not yet running) over all replicas at most; a submit that
            would pass it is refused whole (429 with ``Retry-After``), nothing enqueued.
        retry_after_s: the ``Retry-After`` of a 429, s.
        max_request_bytes: largest body of a rollout route, bytes (more: 413).
        max_submit_requests: requests per submit at most (1 .. 512).
        max_tokens_limit: largest ``max_tokens`` of one request (the engine's generation cap).
        context_tokens: prompt + ``max_tokens`` of one request (with its session history) at most.
        max_results: finished results kept for reading (oldest dropped first).
        max_sessions: multi-turn sessions kept (least recently used dropped first).
        disconnect_grace_s: a stream's unfinished requests are cancelled this long after its
            client stopped reading (disconnect), unless another stream or read claims them.
        stream_wait_s: longest wait of one stream poll for new results, s.
        completion_timeout_s: longest wait of an OpenAI-style completion for its result, s.
        max_policy_lag_versions: after ``POST /v1/policy`` with version v, requests issued by a
            version below ``v - max_policy_lag_versions`` are refused (409).
        engine_threads: torch threads of each CPU engine replica.
        max_replica_restarts: replacement replicas started for dead ones over the service's life.
        engine: ``cpu`` (the tiny transformers model, :class:`actors.rollout.engine.CPUEngine`) or
            ``vllm`` (:class:`actors.rollout.vllm_engine.VLLMEngine` serving ``vllm_model``: CUDA or vLLM's CPU build).
        vllm_model: model name or path vLLM serves (``engine: vllm`` only).
        model_name: the model id of the OpenAI-style routes (``GET /v1/models``; a request naming
            another model gets 404 ``model_not_found``).
        weights_root: directory checkpoints are loaded from (``POST /v1/weights/update_from_disk``;
            a path resolving outside it gets 403); None: loading from disk is off.
        max_weights_bytes: largest weights file of an update (upload or disk), bytes (413 past it).
        weights_chunk_bytes: size of one upload chunk, bytes (the last one may be shorter).
        upload_ttl_s: an upload not touched this long is dropped.
        update_timeout_s: the longest an update waits for every replica to serve it (``wait`` mode:
            for the running requests to end), s; then it answers 504 and the replicas go on loading it.
        ingress_host / ingress_port: where the rollout ingress listens (the rollout routes served
            without Serve's proxy; ``GET /v1/rollouts:ingress`` tells its address; port 0: the
            kernel picks one).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    num_replicas: int = Field(default=2, ge=1, le=64)
    policy: str = Field(default="mixed", pattern="^(mixed|prefix|fifo)$")
    queue_capacity: int = Field(default=4096, ge=1, le=1 << 20)
    retry_after_s: int = Field(default=1, ge=1, le=3600)
    max_request_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    max_submit_requests: int = Field(default=MAX_SUBMIT_REQUESTS, ge=1, le=MAX_SUBMIT_REQUESTS)
    max_tokens_limit: int = Field(default=256, ge=1, le=1 << 20)
    context_tokens: int = Field(default=2048, ge=2, le=1 << 20)
    max_results: int = Field(default=100_000, ge=16, le=10_000_000)
    max_sessions: int = Field(default=4096, ge=1, le=1_000_000)
    disconnect_grace_s: float = Field(default=5.0, ge=0, le=3600)
    stream_wait_s: float = Field(default=1.0, gt=0, le=60)
    completion_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    max_policy_lag_versions: int = Field(default=1, ge=0, le=(1 << 31) - 1)
    engine_threads: int = Field(default=1, ge=1, le=64)
    max_replica_restarts: int = Field(default=4, ge=0, le=1000)
    engine: Literal["cpu", "vllm"] = "cpu"
    vllm_model: Optional[str] = Field(default=None, min_length=1, max_length=1024)
    model_name: str = Field(default="rollmux", min_length=1, max_length=256)
    weights_root: Optional[str] = Field(default=None, min_length=1, max_length=4096)
    max_weights_bytes: int = Field(default=256 << 20, ge=1024, le=1 << 40)
    weights_chunk_bytes: int = Field(default=4 << 20, ge=1024, le=64 << 20)
    upload_ttl_s: float = Field(default=600.0, gt=0, le=86400)
    update_timeout_s: float = Field(default=120.0, gt=0, le=86400)
    ingress_host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    ingress_port: int = Field(default=0, ge=0, le=65535)

    @model_validator(mode="after")
    def _vllm_needs_a_model(self) -> "ServiceConfig":
        if self.engine == "vllm" and not self.vllm_model:
            raise ValueError("vllm_model: required with engine: vllm (a model name or path)")
        return self
