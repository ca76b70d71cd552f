"""The checks of one rollout request against the service's limits and state (vocabulary, the
engine's ``max_tokens`` cap, context length with a session's history and a chained request, known
session, policy version): what a submit refuses before anything is enqueued. No Ray."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from actors.rollout.records import Session
from rollmux.rollout_sched.api import FieldError, Limits, Refusal, RolloutIn


def check_request(i: int, r: RolloutIn, lim: Limits, sessions: Mapping[str, Session], version: int,
                  min_version: int) -> tuple[Optional[Refusal], list[int], Optional[Session]]:
    """Check request ``i`` of a submit against the service's limits and state: ``(refusal or None,
    its prompt token ids, its session)``. A field error -> 422 naming ``requests.<i>.<field>``; a
    policy version below ``min_version`` -> 409."""
    f = f"requests.{i}"
    bad = lambda fld, msg, typ="value_error": (Refusal(  # noqa: E731
        status=422, error="invalid_request", detail=f"{f}.{fld}: {msg}",
        errors=[FieldError(field=f"{f}.{fld}", msg=msg, type=typ)]), [], None)
    toks = r.token_ids()
    if max(toks) >= lim.vocab_size:
        return bad("prompt_token_ids" if r.prompt_token_ids is not None else "prompt",
                   f"token id {max(toks)} is outside the vocabulary [0, {lim.vocab_size})", "vocab_range")
    if r.max_tokens > lim.max_tokens_limit:
        return bad("max_tokens", f"{r.max_tokens} exceeds the engine's limit {lim.max_tokens_limit}", "less_than_equal")
    sess = None
    if r.session_id is not None:
        sess = sessions.get(r.session_id)
        if sess is None:
            return bad("session_id", f"unknown session {r.session_id!r} (open one with open_session: true)",
                       "unknown_session")
    ctx = (len(sess.tokens) if sess else 0) + len(toks) + r.max_tokens
    if ctx > lim.context_tokens:
        return bad("max_tokens", f"session history + prompt + max_tokens = {ctx} tokens exceeds the context "
                   f"of {lim.context_tokens} tokens", "context_length")
    if (c := r.then) is not None:
        pre = c.prefix_ids()
        if pre and max(pre) >= lim.vocab_size:
            return bad("then.prompt_token_ids" if c.prompt_token_ids is not None else "then.prompt",
                       f"token id {max(pre)} is outside the vocabulary [0, {lim.vocab_size})", "vocab_range")
        if c.max_tokens > lim.max_tokens_limit:
            return bad("then.max_tokens", f"{c.max_tokens} exceeds the engine's limit {lim.max_tokens_limit}",
                       "less_than_equal")
        worst = len(pre) + (ctx - r.max_tokens if c.include_prompt else 0) + \
            min(r.max_tokens, c.output_tail_tokens or r.max_tokens) + c.max_tokens
        if worst > lim.context_tokens:
            return bad("then.max_tokens", f"the chained request may need {worst} tokens, more than the context of "
                       f"{lim.context_tokens}", "context_length")
    if r.policy_version is not None and r.policy_version < min_version:
        return (Refusal(status=409, error="stale_policy_version",
                        detail=f"{f}.policy_version: {r.policy_version} is older than the service's minimum "
                               f"{min_version} (current policy version {version})"), [], None)
    return None, toks, sess


__all__ = ["check_request"]
