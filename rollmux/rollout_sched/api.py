"""Typed messages of the rollout service (its HTTP bodies and the service actor's replies).

Pure pydantic, no Ray. The HTTP face (``serve_api/rollouts.py``) validates bodies into these
models (``extra="forbid"``, no NaN / Infinity: a bad field gets a 422 naming it) and the service
actor (``actors/rollout/service.py``) answers with them. Limits that depend on the engine (vocabulary,
``max_tokens`` cap, context length) and on the service's state (sessions, minimum policy version,
queue capacity) are checked by the service itself and refused with :class:`Refusal`.

Text prompts use :class:`ByteTokenizer` (UTF-8 bytes as token ids 0..255), the tokenizer of the
CPU engine's byte-level vocabulary; token-id prompts pass through unchanged.
"""

from __future__ import annotations

import codecs
from enum import Enum
from typing import Annotated, Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollmux.rollout_sched.requests import (
    MAX_REQUEST_TOKENS, MAX_SEED, MAX_TEMPERATURE, MAX_TOKEN_ID, MAX_VERSION, RequestType,
)
from rollmux.rollout_sched.service_config import MAX_SUBMIT_REQUESTS
from rollmux.rollout_sched.weights import WeightsLoad

#: longest text prompt, characters (a byte-level prompt is at most 4 bytes a character).
MAX_PROMPT_CHARS = 256 * 1024
#: most ids one cancel / stream call names.
MAX_IDS = 4096
ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
FAMILY_PATTERN = r"^[A-Za-z0-9_.:/-]{1,128}$"
RequestId = Annotated[str, Field(pattern=ID_PATTERN)]  # a rollout request id in a body (as in the paths)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Priority(str, Enum):
    """Priority class (RolloutRequestScheduler's ``RequestClass``): the step waits on ``critical``;
    ``background`` only fills idle capacity; ``reusable`` is everything else."""

    CRITICAL = "critical"
    REUSABLE = "reusable"
    BACKGROUND = "background"


class Status(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


TERMINAL = (Status.FINISHED, Status.CANCELLED, Status.FAILED)


class ByteTokenizer:
    """UTF-8 bytes as token ids (0..255): ``encode("hi") == [104, 105]``; ``decode`` drops ids
    above 255 and replaces an invalid byte sequence with U+FFFD."""

    vocab_size = 256

    @staticmethod
    def encode(text: str) -> list[int]:
        return list(text.encode("utf-8"))

    @staticmethod
    def decode(ids: list[int] | tuple[int, ...]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", "replace")

    @staticmethod
    def incremental() -> Callable[..., str]:
        """A decoder of ids that arrive in pieces: ``dec(ids, final=False)`` -> the text they
        complete (a character split across pieces comes with its last byte); the pieces of one
        stream, the last one with ``final=True``, join into :meth:`decode` of all its ids."""
        d = codecs.getincrementaldecoder("utf-8")("replace")
        return lambda ids, final=False: d.decode(bytes(i for i in ids if 0 <= i < 256), final)


# ----------------------------------------------------------------------------- submit
class ChainIn(_In):
    """The request that follows a generation on the server (a reward / verification query), run
    when the sample ends, with no client round trip. Its prompt: ``prompt`` / ``prompt_token_ids``
    (optional, first), then the generation's prompt when ``include_prompt``, then the generated
    tokens (the last ``output_tail_tokens`` of them when set). Class: ``priority`` or the generation's."""

    task_type: RequestType = Field(default=RequestType.REWARD, description="reward (default) | generation | state_query | replay")
    prompt: Optional[str] = Field(default=None, min_length=1, max_length=MAX_PROMPT_CHARS)
    prompt_token_ids: Optional[list[int]] = Field(default=None, min_length=1, max_length=MAX_REQUEST_TOKENS)
    include_prompt: bool = Field(default=False, description="the generation's prompt goes before its output")
    output_tail_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_REQUEST_TOKENS,
                                              description="only the last n generated tokens")
    max_tokens: int = Field(default=1, ge=0, le=MAX_REQUEST_TOKENS)
    priority: Optional[Priority] = Field(default=None, description="default: the generation's class")
    seed: Optional[int] = Field(default=None, ge=0, le=MAX_SEED)

    @model_validator(mode="after")
    def _check(self) -> "ChainIn":
        if self.prompt is not None and self.prompt_token_ids is not None:
            raise ValueError("prompt: give at most one of prompt and prompt_token_ids")
        if self.prompt_token_ids is not None and (min(self.prompt_token_ids) < 0 or max(self.prompt_token_ids) > MAX_TOKEN_ID):
            raise ValueError(f"prompt_token_ids: token ids must be in [0, {MAX_TOKEN_ID}]")
        if self.task_type is not RequestType.REPLAY and self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1 for a {self.task_type.value} request")
        return self

    def prefix_ids(self) -> list[int]:
        if self.prompt_token_ids is not None:
            return list(self.prompt_token_ids)
        return ByteTokenizer.encode(self.prompt) if self.prompt is not None else []

    def prompt_for(self, gen_prompt: list[int] | tuple[int, ...], output: list[int] | tuple[int, ...]) -> list[int]:
        """The chained request's prompt for a generation of ``gen_prompt`` that produced ``output``."""
        out = list(output)[-self.output_tail_tokens:] if self.output_tail_tokens else list(output)
        return self.prefix_ids() + (list(gen_prompt) if self.include_prompt else []) + out


class RolloutIn(_In):
    """One rollout request: exactly one of ``prompt`` (text) / ``prompt_token_ids``.

    ``priority`` sets the class; without it ``critical`` / ``background`` do (critical wins).
    ``session_id`` continues a multi-turn session (its history is prepended to the prompt and
    it runs on the session's replica); ``open_session`` starts one (its id is returned)."""

    task_type: RequestType = Field(default=RequestType.GENERATION, description="generation | reward | state_query | replay")
    prompt: Optional[str] = Field(default=None, min_length=1, max_length=MAX_PROMPT_CHARS,
                                  description="text prompt (byte-level tokens)")
    prompt_token_ids: Optional[list[int]] = Field(default=None, min_length=1, max_length=MAX_REQUEST_TOKENS,
                                                  description="prompt token ids, each in [0, vocab)")
    max_tokens: int = Field(default=64, ge=0, le=MAX_REQUEST_TOKENS,
                            description="generation cap, tokens (<= the service's max_tokens_limit; 0 only for replay)")
    critical: bool = Field(default=False, description="the current training step waits on it")
    background: bool = Field(default=False, description="evaluation / logging work: only fills idle capacity")
    priority: Optional[Priority] = Field(default=None, description="critical | reusable | background (overrides the flags)")
    policy_version: Optional[int] = Field(default=None, ge=0, le=MAX_VERSION,
                                          description="policy version that issued it (default: the service's current one)")
    task_family: str = Field(default="default", pattern=FAMILY_PATTERN, description="task family (diversity)")
    session_id: Optional[str] = Field(default=None, pattern=ID_PATTERN, description="continue this session")
    open_session: bool = Field(default=False, description="start a session with this request (its id is returned)")
    logprobs: bool = Field(default=False, description="return the log-probability of each generated token")
    seed: Optional[int] = Field(default=None, ge=0, le=MAX_SEED,
                                description="sampling seed (same seed, prompt and weights: same tokens on any replica)")
    ignore_eos: bool = Field(default=False, description="generate max_tokens tokens whatever is sampled")
    temperature: float = Field(default=1.0, ge=0.0, le=MAX_TEMPERATURE, description="sampling temperature (0: greedy)")
    stream_tokens: bool = Field(default=False, description="report its tokens as the engine produces them (read "
                                "with POST /v1/rollouts:stream and tokens: true), not only when it ends")
    then: Optional[ChainIn] = Field(default=None, description="a reward / verification request run on the server "
                                    "when this generation's sample ends (its id is returned as chained_id)")

    @model_validator(mode="after")
    def _one_prompt(self) -> "RolloutIn":
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError("prompt: give exactly one of prompt (text) and prompt_token_ids")
        if self.prompt_token_ids is not None and (min(self.prompt_token_ids) < 0 or max(self.prompt_token_ids) > MAX_TOKEN_ID):
            raise ValueError(f"prompt_token_ids: token ids must be in [0, {MAX_TOKEN_ID}]")
        if self.task_type is not RequestType.REPLAY and self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1 for a {self.task_type.value} request")
        if self.open_session and self.session_id is not None:
            raise ValueError("session_id: open_session and session_id exclude each other (a session is opened once)")
        if self.then is not None and self.task_type not in (RequestType.GENERATION, RequestType.STATE_QUERY):
            raise ValueError("then: only a generation or a state query produces a sample to chain on")
        return self

    def token_ids(self) -> list[int]:
        return list(self.prompt_token_ids) if self.prompt_token_ids is not None else ByteTokenizer.encode(self.prompt or "")

    def flags(self) -> tuple[bool, bool]:
        """(critical, background) after ``priority``."""
        if self.priority is not None:
            return self.priority is Priority.CRITICAL, self.priority is Priority.BACKGROUND
        return self.critical, self.background and not self.critical


class SubmitBatch(_In):
    """``POST /v1/rollouts``: a batch (``{"requests": [...]}``, 1..512) or one request object."""

    requests: list[RolloutIn] = Field(min_length=1, max_length=MAX_SUBMIT_REQUESTS)

    @model_validator(mode="before")
    @classmethod
    def _one(cls, v: Any) -> Any:
        if isinstance(v, dict) and "requests" not in v:
            return {"requests": [v]}
        return v


class Accepted(_Out):
    """A queued request: its id, where it waits and what prefix it matched at submission."""

    id: str
    status: Status = Status.QUEUED
    replica: int = Field(description="engine replica it was routed to")
    expected_window: int = Field(description="scheduling window it is expected to start in (estimate)")
    queue_position: int = Field(description="requests queued on its replica including it")
    matched_prefix_tokens: int = Field(description="prompt tokens found in the replica's prefix index")
    session_id: Optional[str] = None
    chained_id: Optional[str] = Field(default=None, description="id of the request that follows it (then)")
    policy_version: int = Field(default=0, description="the policy version it was issued at")


class SubmitReply(_Out):
    requests: list[Accepted]


class FieldError(_Out):
    field: str
    msg: str
    type: str


class Refusal(_Out):
    """A refused call: HTTP status, error kind, reason and (422) the fields at fault. Nothing of a
    refused submit is enqueued."""

    status: int
    error: str
    detail: str
    errors: list[FieldError] = []
    retry_after_s: Optional[int] = None


# ----------------------------------------------------------------------------- results
class Timings(_Out):
    """Seconds on the service's clock; ``queue_wait_s`` = dispatched - submitted."""

    submitted_s: float
    dispatched_s: Optional[float] = None
    finished_s: Optional[float] = None
    queue_wait_s: Optional[float] = None
    run_s: Optional[float] = None


class RolloutView(_Out):
    """A request's status and (when finished) its result."""

    id: str
    status: Status
    task_type: RequestType
    priority: Priority
    policy_version: int
    task_family: str
    replica: Optional[int] = None
    session_id: Optional[str] = None
    matched_prefix_tokens: int = 0
    output_token_ids: list[int] = []
    text: Optional[str] = None
    logprobs: Optional[list[float]] = None
    token_versions: Optional[list[int]] = Field(default=None, description="weights version that sampled each output token")
    version_span: Optional[list[int]] = Field(default=None, description="[oldest, newest] weights version of its tokens")
    score: Optional[float] = Field(default=None, description="reward score / replay mean log-probability")
    finish_reason: Optional[str] = Field(default=None, description="stop | length | cancelled | replica_lost")
    error: Optional[str] = None
    retries: int = 0
    requeued: int = Field(default=0, description="times it was stopped by a weight update (pause_mode abort) and re-queued")
    chained_id: Optional[str] = Field(default=None, description="the request that follows it (then)")
    chained_from: Optional[str] = Field(default=None, description="the generation it follows")
    timings: Timings


class StreamBody(_In):
    """``POST /v1/rollouts:stream``: the results of ``ids`` and/or of a session's requests, as they finish."""

    ids: list[RequestId] = Field(default=[], max_length=MAX_IDS)
    session_id: Optional[str] = Field(default=None, pattern=ID_PATTERN)
    format: Literal["ndjson", "sse"] = Field(default="ndjson", description="chunked NDJSON or server-sent events")
    timeout_s: float = Field(default=600.0, gt=0, le=3600, description="the stream ends after this long")
    tokens: bool = Field(default=False, description="also send each request's new tokens as they are produced "
                         "(event tokens; those submitted with stream_tokens, else all at their end), following "
                         "the requests pending when the stream starts")

    @model_validator(mode="after")
    def _some(self) -> "StreamBody":
        if not self.ids and self.session_id is None:
            raise ValueError("ids: give ids and/or session_id")
        return self


class PollReply(_Out):
    results: list[RolloutView]
    unknown: list[str] = []
    pending: list[str] = []


class TokenCursor(_Out):
    """How far a reader got in a request's tokens: ``offset`` tokens read since its ``restarts``-th start."""

    id: str
    offset: int = Field(default=0, ge=0)
    restarts: int = Field(default=0, ge=0)


class TokenDelta(_Out):
    """The tokens a request produced past a reader's :class:`TokenCursor` (``stream: true`` /
    ``tokens: true``)."""

    id: str
    offset: int = Field(description="index of the first token in tokens (0 after a restart)")
    tokens: list[int]
    restarts: int = Field(default=0, description="times it started over (re-queued by a weight update, or retried)")
    view: Optional[RolloutView] = Field(default=None, description="its view once it ended")


class TokensReply(_Out):
    deltas: list[TokenDelta] = Field(default=[], description="the requests with news: tokens, a restart, or the end")
    unknown: list[str] = []


class CancelBody(_In):
    ids: list[RequestId] = Field(min_length=1, max_length=MAX_IDS)


class CancelReply(_Out):
    """Ids dropped while queued, aborted while running, already ended, unknown."""

    dropped: list[str] = []
    aborted: list[str] = []
    already_ended: list[str] = []
    unknown: list[str] = []


class PolicyBody(_In):
    """``POST /v1/policy``: the trainer's weights advanced to ``version``."""

    version: int = Field(ge=0, le=MAX_VERSION)
    min_version: Optional[int] = Field(default=None, ge=0, le=MAX_VERSION,
                                       description="oldest version still accepted (default: version - max_policy_lag_versions)")

    @model_validator(mode="after")
    def _order(self) -> "PolicyBody":
        if self.min_version is not None and self.min_version > self.version:
            raise ValueError("min_version: must be <= version")
        return self


class PolicyView(_Out):
    version: int
    min_version: int
    previous_version: int
    prefix_entries_dropped: int = Field(description="prefix-index nodes dropped by the update, all replicas")


class Limits(_Out):
    """What the service accepts (for clients and for the HTTP face's checks)."""

    vocab_size: int
    max_tokens_limit: int
    context_tokens: int
    max_submit_requests: int
    max_request_bytes: int
    queue_capacity: int
    num_replicas: int
    policy: str
    policy_version: int = 0
    model_name: str = "rollmux"
    weights_chunk_bytes: int = 4 << 20
    max_weights_bytes: int = 256 << 20


# ----------------------------------------------------------------------------- OpenAI-style
class ReplicaStats(_Out):
    """One engine replica's figures in :class:`ServiceStats`."""

    replica: int
    alive: bool
    queued: int  # requests in its scheduler's queues
    running: int
    windows: int  # scheduling windows run
    engine_busy_s: float  # time in its engine's windows, s
    policy_version: int
    kv_in_use_tokens: int
    prefix_hit_ratio: float
    index_bytes: int  # its prefix index's memory, B
    index_nodes: int
    coldstart_phase: Optional[str] = None
    weights_version: Optional[int] = None  # the weights version it serves (None: its initial weights)
    weights_sha256: Optional[str] = None


class ServiceStats(_Out):
    """The rollout service's figures (the service's ``stats``, ``GET /v1/stats``; the metrics are
    defined in docs/ROLLOUT_SERVICE.md)."""

    sample_throughput_per_s: float
    trainer_idle_ratio: Optional[float]
    prefix_hit_ratio: float
    training_step_time_s: Optional[float]  # mean time between policy versions, s
    last_training_step_time_s: Optional[float]
    diversity_score: float
    index_bytes: int  # the replicas' prefix indexes, B
    policy_version: int
    weight_version: Optional[int]  # the latest weights update's version (None: none)
    min_policy_version: Optional[int]
    queued: int
    running: int
    queued_by_class: dict[str, int]  # request class -> queued requests
    queue_capacity: int
    results_kept: int
    sessions: int
    counters: dict[str, int]  # counter name -> its count
    submit_handling_ms_p50: Optional[float]  # ms
    replicas: list[ReplicaStats]
    uptime_s: float  # s since the service started
    service_rss_bytes: int  # B


class _OpenAIExtras(_In):
    model: Optional[str] = Field(default=None, max_length=256, description="ignored (one model is served)")
    max_tokens: int = Field(default=16, ge=1, le=MAX_REQUEST_TOKENS)
    n: int = Field(default=1, ge=1, le=1, description="1 only")
    stream: bool = Field(default=False, description="true: server-sent events (chat.completion.chunk / text_completion chunks)")
    logprobs: Optional[bool | int] = Field(default=None, description="true / >0: token log-probabilities")
    user: Optional[str] = Field(default=None, max_length=256)
    priority: Priority = Field(default=Priority.REUSABLE, description="extra field: the request's class")
    policy_version: Optional[int] = Field(default=None, ge=0, le=MAX_VERSION,
                                          description="extra field (default: the service's current version)")
    seed: Optional[int] = Field(default=None, ge=0, le=MAX_SEED)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=MAX_TEMPERATURE, description="0: greedy (default 1)")
    ignore_eos: bool = Field(default=False, description="extra field (vLLM's): generate max_tokens tokens")
    stream_options: Optional[dict[str, Any]] = Field(default=None, description="include_usage (stream only)")
    task_family: str = Field(default="default", pattern=FAMILY_PATTERN, description="extra field")
    session_id: Optional[str] = Field(default=None, pattern=ID_PATTERN, description="extra field: continue a session")

    @model_validator(mode="after")
    def _check(self):
        if isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool) and not 0 <= self.logprobs <= 5:
            raise ValueError("logprobs: 0..5")
        return self


class CompletionBody(_OpenAIExtras):
    prompt: str | list[int] = Field(description="text, or token ids")

    @model_validator(mode="after")
    def _prompt(self) -> "CompletionBody":
        if isinstance(self.prompt, str) and not 1 <= len(self.prompt) <= MAX_PROMPT_CHARS:
            raise ValueError(f"prompt: 1..{MAX_PROMPT_CHARS} characters")
        if isinstance(self.prompt, list) and not 1 <= len(self.prompt) <= MAX_REQUEST_TOKENS:
            raise ValueError(f"prompt: 1..{MAX_REQUEST_TOKENS} token ids")
        return self


class ChatMessage(_In):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_PROMPT_CHARS)


class ChatBody(_OpenAIExtras):
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The text the engine sees for a chat: ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``."""
    return "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages) + "<|assistant|>\n"


def openai_request(body: CompletionBody | ChatBody) -> RolloutIn:
    """The rollout request an OpenAI-style body stands for (a generation; without ``policy_version``
    it is issued at the service's current version)."""
    if isinstance(body, ChatBody):
        prompt: dict[str, Any] = {"prompt": chat_prompt(body.messages)}
    elif isinstance(body.prompt, str):
        prompt = {"prompt": body.prompt}
    else:
        prompt = {"prompt_token_ids": body.prompt}
    return RolloutIn(task_type=RequestType.GENERATION, max_tokens=body.max_tokens, priority=body.priority,
                     policy_version=body.policy_version, task_family=body.task_family, session_id=body.session_id,
                     logprobs=bool(body.logprobs), seed=body.seed, ignore_eos=body.ignore_eos, stream_tokens=body.stream,
                     temperature=1.0 if body.temperature is None else body.temperature, **prompt)


# ----------------------------------------------------------------------------- service <-> replica
class EngineResult(_Out):
    """One finished request as an engine replica reports it."""

    id: str
    output_token_ids: list[int] = []
    score: Optional[float] = None
    logprobs: Optional[list[float]] = None
    finish_reason: str = "length"
    finished_s: Optional[float] = Field(default=None, description="on the engine's clock (in-process engines)")
    token_versions: Optional[list[int]] = None


class WindowCall(_Out):
    """One scheduling window for a replica: load ``weights`` when given (else a bare version change
    of ``policy_version`` drops the stale prefix KV), stop ``aborts``, start ``batch`` (``hits``:
    prefix tokens per id), run one time slice (:func:`actors.rollout.window.run_window`)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    policy_version: int
    aborts: list[str] = []
    batch: list[Any] = Field(default=[], description="rollmux.rollout_sched.Request objects")
    hits: dict[str, int] = {}
    logprobs: list[str] = Field(default=[], description="ids of the batch that want token log-probabilities")
    stream: list[str] = Field(default=[], description="ids of the batch that want their tokens as they are produced")
    weights: Optional[WeightsLoad] = Field(default=None, description="a complete weight version to load first")


class WindowReply(_Out):
    results: list[EngineResult]
    running: int
    engine_s: float = Field(description="time the engine computed in this window, s")
    stepped: bool = Field(default=True, description="a time slice ran (something was running)")
    weights_version: Optional[int] = Field(default=None, description="the weights version the engine serves")
    weights_sha256: Optional[str] = Field(default=None, description="digest of the weights it serves (after a load)")
    partial: dict[str, list[int]] = Field(default={}, description="streamed requests still running: the tokens they "
                                          "produced in this window (after those reported before)")
