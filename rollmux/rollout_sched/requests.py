"""Request model of the rollout request scheduler.

A rollout phase is a stream of requests of four types: long generations,
tiny reward queries, multi-turn state queries and replay items (prefill-only re-scoring of old
samples). Each belongs to one priority class: critical > reusable > background.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


#: longest prompt and generation cap of one request, tokens (1 Mi).
MAX_REQUEST_TOKENS = 1 << 20
#: largest token id (vocabularies are < 2^31).
MAX_TOKEN_ID = (1 << 31) - 1
#: latest arrival time on a scheduler's clock, s (about 31 years).
MAX_ARRIVAL_S = 1e9
#: largest policy / weights version.
MAX_VERSION = (1 << 31) - 1
#: largest per-request sampling seed.
MAX_SEED = (1 << 63) - 1
#: largest sampling temperature (OpenAI's bound).
MAX_TEMPERATURE = 2.0


class RequestType(str, Enum):
    """Request types of a mixed RL rollout."""

    GENERATION = "generation"
    REWARD = "reward"
    STATE_QUERY = "state_query"
    REPLAY = "replay"


class RequestClass(IntEnum):
    """Priority classes, lower value first.

    CRITICAL: the current training step waits on it. BACKGROUND: replay items and requests
    flagged ``background`` (evaluation, logging); they only fill idle capacity. REUSABLE: every
    other request; ordered by the weighted score, where prefix reuse counts.
    """

    CRITICAL = 0
    REUSABLE = 1
    BACKGROUND = 2


class Request(BaseModel):
    """One rollout request.

    Attributes:
        request_id: unique id within a scheduler.
        prompt_token_ids: prompt token ids (1 .. 1,048,576 of them, each in [0, 2^31 - 1]).
        type: :class:`RequestType`.
        max_tokens: generation cap, tokens (1 .. 1,048,576 for generation / state query / reward;
            0 allowed for replay, which is prefill-only).
        arrival_s: submission time, seconds on the scheduler's clock (finite, 0 .. 1e9 s).
        critical: the current training step waits on this request.
        background: evaluation / logging work that only fills idle capacity.
        policy_version: policy version (training step) that issued the request.
        task_family: task family label (diversity is measured across families).
        seed: sampling seed of this request (None: derived from ``request_id`` and the engine's
            seed); the same seed, prompt and weights give the same tokens on any engine replica.
        ignore_eos: generate ``max_tokens`` tokens whatever is sampled (vLLM's ``ignore_eos``).
        temperature: sampling temperature of a generation (0 .. 2; 0: greedy, the most likely token).

    Raises:
        pydantic.ValidationError: empty prompt, negative token id, max_tokens out of range, ...
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    request_id: str = Field(min_length=1, max_length=256)
    prompt_token_ids: tuple[int, ...] = Field(min_length=1, max_length=MAX_REQUEST_TOKENS)
    type: RequestType = RequestType.GENERATION
    max_tokens: int = Field(default=256, ge=0, le=MAX_REQUEST_TOKENS)
    arrival_s: float = Field(default=0.0, ge=0, le=MAX_ARRIVAL_S)
    critical: bool = False
    background: bool = False
    policy_version: int = Field(default=0, ge=0, le=MAX_VERSION)
    task_family: str = Field(default="default", min_length=1, max_length=256)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    ignore_eos: bool = False
    temperature: float = Field(default=1.0, ge=0.0, le=MAX_TEMPERATURE)

    @field_validator("prompt_token_ids")
    @classmethod
    def _non_negative(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if min(v) < 0 or max(v) > MAX_TOKEN_ID:
            raise ValueError(f"token ids must be in [0, {MAX_TOKEN_ID}]")
        return v

    @model_validator(mode="after")
    def _tokens(self) -> "Request":
        if self.type is not RequestType.REPLAY and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 for a {self.type.value} request")
        return self

    @property
    def kv_tokens(self) -> int:
        """Worst-case KV footprint, tokens: prompt + max_tokens."""
        return len(self.prompt_token_ids) + self.max_tokens

    def is_short(self, short_max_tokens: int) -> bool:
        """Reward queries, and requests with ``max_tokens <= short_max_tokens`` (replay excluded)."""
        if self.type is RequestType.REWARD:
            return True
        return self.type is not RequestType.REPLAY and self.max_tokens <= short_max_tokens

    def request_class(self) -> RequestClass:
        """Priority class: critical flag first, then replay/background, else reusable."""
        if self.critical:
            return RequestClass.CRITICAL
        if self.background or self.type is RequestType.REPLAY:
            return RequestClass.BACKGROUND
        return RequestClass.REUSABLE


@dataclass(frozen=True)
class Completion:
    """Result of one request as reported by an engine.

    ``output_token_ids``: generated tokens (empty for replay); ``score``: reward / replay
    log-probability where the type has one; ``finished_s``: completion time on the clock;
    ``token_versions``: the weights version that sampled each output token (engines that track it).
    """

    request_id: str
    output_token_ids: tuple[int, ...]
    finished_s: float
    score: float | None = None
    token_versions: tuple[int, ...] | None = None
