"""The effects of :class:`rollmux.group_ledger.GroupLedger`: what the ``GroupController`` actor
must do for the ledger (typed values the actor carries out in ``GroupController._apply``; the
ledger itself calls nothing outside the pure package)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from rollmux.messages import ProgressReport, RuntimeEvent

__all__ = ["Report", "JobLeft", "TimelineChanged", "PhaseSwitched", "SyncBytes", "Effect"]


@dataclass(frozen=True)
class Report:
    """Send ``message`` about ``job_id`` to the GlobalScheduler (fire and forget)."""

    job_id: str
    message: Union[RuntimeEvent, ProgressReport]


@dataclass(frozen=True)
class JobLeft:
    """The job left this group: its per-job totals in the group's metrics go (it may come back)."""

    job_id: str


@dataclass(frozen=True)
class TimelineChanged:
    """The group's occupancy records changed (``metrics.group_timeline``)."""

    group_id: str
    records: list  # one per phase and node: pool, node, start_s, end_s, gpus (s since the ledger started)
    nodes: dict  # pool -> {node: GPUs}
    window: tuple[float, float]  # the group's lifetime so far, s since the ledger started


@dataclass(frozen=True)
class PhaseSwitched:
    """A phase started its state: ``kind`` warm | cold | moved, ``seconds`` its start-up time."""

    kind: str
    seconds: float


@dataclass(frozen=True)
class SyncBytes:
    """A sync of ``job_id`` sent ``nbytes`` bytes across the pool boundary."""

    job_id: str
    nbytes: int


Effect = Union[Report, JobLeft, TimelineChanged, PhaseSwitched, SyncBytes]
