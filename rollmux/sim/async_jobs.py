"""Asynchronous jobs in the trace replay: the staleness each job's rollouts used, tallied over its
life, and the summary per kind of job (synchronous, asynchronous ``exact``, asynchronous
``bounded``). The replay (:func:`rollmux.sim.simulator.replay`) feeds :class:`StalenessTally`
with the staleness shares of each job's current unit (:attr:`rollmux.baselines.Unit.staleness`)
weighted by the iterations it runs there; :func:`per_kind` reads the outcomes.
Source: :mod:`rollmux.staleness` (the contract); extension of RollMux §7.4-§7.5.
"""

from __future__ import annotations

from typing import Mapping, Sequence

#: the kinds of job the summary separates, in order
KINDS: tuple[str, ...] = ("sync", "async_exact", "async_bounded")


def kind_of(max_staleness: int, mode: str) -> str:
    """``"sync"`` for a synchronous job, else ``"async_<mode>"``."""
    return "sync" if max_staleness == 0 else f"async_{mode}"


class StalenessTally:
    """Per job, the rollouts run at each staleness (fractional: the replay's fluid progress).

    :meth:`set_units` takes the current units' shares once per event, :meth:`advance` adds the
    iterations each job ran between events, :meth:`pop` hands a departed job's tally over."""

    def __init__(self) -> None:
        self._now: dict[str, Mapping[int, float]] = {}
        self._acc: dict[str, dict[int, float]] = {}

    def set_units(self, units: Sequence) -> None:
        """The staleness shares of every job of ``units`` (:class:`rollmux.baselines.Unit`)."""
        self._now = {j: fr for u in units for j, fr in u.staleness.items()}

    def advance(self, iterations: Mapping[str, float]) -> None:
        """Credit each job its ``iterations`` (ran since the last call) at its current shares."""
        for j, fr in self._now.items():
            n = iterations.get(j)
            if n:
                acc = self._acc.setdefault(j, {})
                for s, f in fr.items():
                    acc[s] = acc.get(s, 0.0) + f * n

    def pop(self, job_id: str) -> dict[int, float]:
        """The job's tally ``{staleness: rollouts}`` (removed; empty for a synchronous job)."""
        return self._acc.pop(job_id, {})


def per_kind(outs: Sequence) -> dict:
    """Per kind of job (:data:`KINDS`, those present): jobs, SLO attainment, cost (each job's share
    of its units by GPUs asked, $), staleness bound (the largest ``k``), the largest staleness any
    rollout used and the distribution of the staleness over the kind's rollouts (fractions,
    ``{s: share}``), and ``staleness_over_bound``: rollouts beyond their job's bound (0 is the
    contract). ``outs``: :class:`rollmux.sim.outcomes.JobOutcome` values."""
    out: dict = {}
    for kind in KINDS:
        os_ = [o for o in outs if kind_of(o.max_staleness, o.staleness_mode) == kind]
        if not os_:
            continue
        tot: dict[int, float] = {}
        over = 0.0
        for o in os_:
            for s, n in o.staleness.items():
                tot[s] = tot.get(s, 0.0) + n
                if s > o.max_staleness:
                    over += n
        n_roll = sum(tot.values())
        out[kind] = {
            "jobs": len(os_),
            "slo_attainment": sum(o.slo_met for o in os_) / len(os_),
            "cost_usd": float(sum(o.cost_usd for o in os_)),
            "max_staleness_bound": max(o.max_staleness for o in os_),
            "staleness_max": max((s for s, n in tot.items() if n > 0), default=0),
            "staleness_distribution": {str(s): tot[s] / n_roll for s in sorted(tot)} if n_roll > 0 else {"0": 1.0},
            "staleness_over_bound": over,
        }
    return out
