"""The records of an intra-group schedule (RollMux §4.3): realised iteration times, one phase on
one node, and the schedule's figures; shared by the event simulation (:mod:`rollmux.intra_group`)
and the steady-state recurrence (:mod:`rollmux.steady_state`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Union

from rollmux.models import CoExecutionGroup, GroupMember
from rollmux.occupancy import BusyCurve
from rollmux.staleness import version_for


@dataclass(frozen=True)
class IterationTimes:
    """One iteration's realised phase times, seconds.

    ``t_trigger_s`` (optional, relative to the rollout's start): when the trigger fraction of
    the rollout's responses is done, i.e. when long-tail migration may fire.
    ``tail_load`` (optional, >= 0): the unfinished responses at the trigger as a fraction of the
    job's concurrent decode slots over all its rollout GPUs (``None``: ``1 - trigger_fraction``,
    i.e. a rollout that started with every slot full). It sets how much the tail stretches
    when its stragglers are packed onto fewer GPUs (:meth:`LongTailPolicy.tail_stretch`).
    """

    t_roll_s: float
    t_train_s: float
    t_sync_s: float = 0.0
    t_trigger_s: Optional[float] = None
    tail_load: Optional[float] = None

    def __post_init__(self) -> None:
        for name in ("t_roll_s", "t_train_s", "t_sync_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if self.t_trigger_s is not None and not (0 <= self.t_trigger_s <= self.t_roll_s):
            raise ValueError(f"t_trigger_s must lie in [0, t_roll_s={self.t_roll_s}], got {self.t_trigger_s}")
        if self.tail_load is not None and not (self.tail_load >= 0 and math.isfinite(self.tail_load)):
            raise ValueError(f"tail_load must be a finite number >= 0, got {self.tail_load}")

    @property
    def t_solo_s(self) -> float:
        """This iteration of a synchronous job run alone, s: ``t_roll_s + t_train_s + t_sync_s``
        (as :attr:`PhaseProfile.t_solo_s`; an asynchronous job's realised solo time is
        :func:`realised_solo_s`)."""
        return self.t_roll_s + self.t_train_s + self.t_sync_s


@dataclass(frozen=True)
class PhaseRecord:
    """One phase of one job on one node: ``[start_s, end_s)`` of meta-iteration ``iteration``.

    ``gpus``: GPUs of ``node`` the phase uses (``None``: the whole node); after long-tail
    migration the tail's record holds only the tail GPUs. Busy / bubble ratios are computed from
    these records by :func:`rollmux.occupancy.occupancy`.
    """

    job_id: str
    phase: str
    pool: str
    node: str
    iteration: int
    start_s: float
    end_s: float
    gpus: Optional[float] = None



@dataclass
class GroupSchedule:
    """Result of :func:`simulate_group`.

    Attributes:
        timeline: phase records (empty when ``record_timeline=False``).
        t_coexec_s: per job, mean iteration time over the steady-state window (seconds).
        t_coexec_max_s: per job, the longest single iteration in that window.
        t_solo_s: per job, solo iteration time of its planning profile.
        t_meta_s: meta-iteration time = max_j t_coexec_s (every member iterates once per meta-iteration).
        busy_fraction / bubble_fraction: per pool (``"rollout"``, ``"train"``), GPU-time fraction
            busy / idle over the steady-state window ``window_s`` (:func:`rollmux.occupancy.occupancy`
            on the records: GPU-weighted, union of busy intervals).
        lifetime_busy_fraction: the same over the whole simulated run ``[0, horizon_s]``
            (warm-up and drain included).
        busy_curve: :class:`rollmux.occupancy.BusyCurve` of the run (cumulative busy GPU-seconds).
        iterations: completed iterations per job; horizon_s: end of the simulation.
        staleness: per asynchronous member (``max_staleness >= 1``), how many of its rollouts of
            the steady-state iterations (indices ``m // 2 .. m - 1``) used a policy ``s`` versions
            behind their own index, ``{s: count}`` (``exact``: always ``k``; ``bounded``: the newest version
            published when the rollout starts, a version counting as published from the instant
            its sync ends). Every ``s`` is at most the job's bound (:mod:`rollmux.staleness`).
    """

    timeline: list[PhaseRecord]
    t_coexec_s: dict[str, float]
    t_coexec_max_s: dict[str, float]
    t_solo_s: dict[str, float]
    t_meta_s: float
    busy_fraction: dict[str, float]
    bubble_fraction: dict[str, float]
    iterations: dict[str, int]
    horizon_s: float
    window_s: tuple[float, float] = (0.0, 0.0)
    migrations: int = 0
    lifetime_busy_fraction: dict[str, float] = field(default_factory=dict)
    busy_curve: Optional[BusyCurve] = None
    staleness: dict[str, dict[int, int]] = field(default_factory=dict)

    def slowdown(self, job_id: str) -> float:
        """``t_coexec / t_solo`` of ``job_id`` (KeyError if unknown)."""
        return self.t_coexec_s[job_id] / self.t_solo_s[job_id]

    @property
    def slowdowns(self) -> dict[str, float]:
        return {j: self.slowdown(j) for j in self.t_coexec_s}


def members_of(g: Union[CoExecutionGroup, Sequence[GroupMember]]) -> Sequence[GroupMember]:
    return g.members if isinstance(g, CoExecutionGroup) else g


def staleness_counts(members: Sequence[GroupMember], starts: Mapping[str, Sequence[float]],
                      sync_ends: Mapping[str, Sequence[float]], first: int, last: int) -> dict[str, dict[int, int]]:
    """Per asynchronous member, the staleness of its rollouts ``first .. last - 1`` (module
    :class:`GroupSchedule`): rollout ``r`` started at ``starts[j][r]``; ``sync_ends[j][i]`` is the
    end of its sync ``i`` (increasing). A version counts as published from its sync's end on."""
    out: dict[str, dict[int, int]] = {}
    for mb in members:
        k = mb.profile.max_staleness
        if k == 0:
            continue
        j = mb.spec.job_id
        ends, cnt = sync_ends[j], {}
        for r in range(first, min(last, len(starts[j]))):
            v = version_for(r, k, mb.spec.staleness_mode, bisect.bisect_right(ends, starts[j][r], 0, r))
            cnt[r - v] = cnt.get(r - v, 0) + 1
        out[j] = dict(sorted(cnt.items()))
    return out


