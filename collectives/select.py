"""Which transport a job's weight sync uses (RollMux §5.2 plan executors; §5.1 workers).

``sync_backend="auto"`` (the default of :class:`rollmux.Job`) picks, once per set of endpoints:

- ``"nccl"`` (cupy-NCCL, :mod:`collectives.nccl_executor`) when *every* endpoint of the job (its
  training and rollout workers) holds a CUDA device, cupy-NCCL loads there, and no two endpoints
  share a device (NCCL cannot put two ranks of one communicator on one GPU);
- ``"gloo"`` (:mod:`collectives.gloo_executor`) otherwise, with the reason NCCL was not taken;
- the Ray object store is never chosen here: the runtime falls back to it only when the
  collectives endpoints cannot be built (and says so in the sync phase's record), or when the job
  asks for ``sync_backend="object_store"``.

An explicit ``"gloo"`` or ``"nccl"`` is honoured as asked; ``"nccl"`` where it cannot run raises
:class:`~rollmux.sync_plan.SyncPlanError` naming the endpoint and the reason.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from rollmux.sync_plan import SYNC_BACKENDS, SyncPlanError

__all__ = ["SYNC_BACKENDS", "choose_backend", "endpoint_caps"]


def endpoint_caps() -> dict:
    """What this process can use for a sync endpoint: ``{"cuda": bool, "nccl": bool, "why": str,
    "device": str | None}`` (``device``: UUID of the current CUDA device, the identity compared
    across endpoints; ``why``: why NCCL cannot run here, ``"ok"`` when it can)."""
    import torch

    from collectives.nccl_executor import available

    cuda = bool(torch.cuda.is_available())
    ok, why = available()
    device: Optional[str] = None
    if cuda:
        try:
            idx = torch.cuda.current_device()
            device = str(getattr(torch.cuda.get_device_properties(idx), "uuid", "")) or f"cuda:{idx}"
        except Exception as e:  # pragma: no cover - depends on the driver
            ok, why = False, f"CUDA device unreadable: {type(e).__name__}: {e}"
    return {"cuda": cuda, "nccl": bool(ok), "why": why, "device": device}


def choose_backend(requested: str, endpoints: Sequence[Mapping]) -> tuple[str, str]:
    """The executor backend of one job's sync endpoints, and why.

    Args:
        requested: ``"auto"`` | ``"nccl"`` | ``"gloo"`` (``"object_store"`` is decided by the
            caller and refused here).
        endpoints: one :func:`endpoint_caps` dict per endpoint (trainers then rollout workers),
            each with a ``"name"`` (e.g. the worker's node) used in the reason.
    Returns:
        ``(backend, reason)``: backend ``"nccl"`` or ``"gloo"``; reason in plain words.
    Raises:
        SyncPlanError: unknown ``requested``, no endpoints, or ``"nccl"`` asked where it cannot run.
    """
    if requested not in ("auto", "nccl", "gloo"):
        raise SyncPlanError(f"sync_backend: expected one of 'auto', 'nccl', 'gloo' here, got {requested!r}")
    if not endpoints:
        raise SyncPlanError("endpoints: a sync needs at least one training and one rollout endpoint")
    if requested == "gloo":
        return "gloo", "gloo asked for"
    problems = []
    seen: dict[str, str] = {}
    for i, ep in enumerate(endpoints):
        name = str(ep.get("name", f"endpoint {i}"))
        if not ep.get("cuda"):
            problems.append(f"{name}: no CUDA device")
        elif not ep.get("nccl"):
            problems.append(f"{name}: {ep.get('why') or 'cupy-NCCL unavailable'}")
        else:
            dev = ep.get("device")
            if dev is not None and dev in seen:
                problems.append(f"{name}: shares its GPU with {seen[dev]} (NCCL needs one GPU per rank)")
            elif dev is not None:
                seen[dev] = name
    if not problems:
        return "nccl", f"every endpoint ({len(endpoints)}) holds its own CUDA device and cupy-NCCL loads"
    why = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
    if requested == "nccl":
        raise SyncPlanError(f"sync_backend: 'nccl' cannot run on this job's workers: {why}")
    return "gloo", f"nccl not usable ({why})"
