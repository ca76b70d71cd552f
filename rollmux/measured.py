"""Measured profiles: the phase times a job's runtime reports, kept per job over a sliding window,
and the profile admission and the SLO watch plan with under each ``profile_source``.

A job declares (or the roofline estimates) a *worst-case* profile: every response at the cap
(RollMux §4.2 "conservative planning"). Once it runs, each iteration reports its rollout, training
and sync times (:meth:`MeasuredPhases.add`); the window keeps the last ``window`` of them.

Statistics (robust: one outlying report never decides on its own):

* :meth:`MeasuredPhases.high` -- per phase the ``q`` quantile of the window, taken as an order
  statistic that is never the single largest sample once two or more are held (index
  ``min(ceil(q n) - 1, n - 2)`` of the sorted window). A single slow (or corrupt) report therefore
  moves no statistic, two in a window of ``n >= 2`` can.
* :meth:`MeasuredPhases.mean` -- the mean per phase: the job's realised solo iteration time
  (the denominator of the slowdown a user reads) is ``mean().t_solo_s``.
* :meth:`MeasuredPhases.rollout_distribution` -- p50 / p90 / max / mean of the rollout length.
* :meth:`MeasuredPhases.iterations` -- the window as :class:`rollmux.intra_group.IterationTimes`,
  to sample realisations through the round-robin simulation (:mod:`rollmux.admission.slo_watch`).

:func:`planning_profile` chooses the profile a decision uses: ``worst_case`` (the declared profile,
always), ``measured`` (the high quantile times ``margin`` once ``min_iterations`` reports are held;
before that the prior of the job's kind when one exists, else the worst case) or ``blended`` (per
phase ``w`` x measured + ``(1 - w)`` x worst case, ``w = n / (n + prior_iterations)``). Every time is
floored at :data:`rollmux.models.MIN_PHASE_S`. Source: extension of RollMux §4.2 (the paper plans on
worst-case profiles only); rollmux/admission/README.md "SLO guarantee" states what each source guarantees.
"""

from __future__ import annotations

import math
from typing import Iterable, Literal, Mapping, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rollmux.intra_group import IterationTimes
from rollmux.models import MAX_PHASE_S, MIN_PHASE_S, JobSpec, PhaseProfile

ProfileSource = Literal["worst_case", "measured", "blended"]
PROFILE_SOURCES: tuple[str, ...] = ("worst_case", "measured", "blended")
_PHASES = ("t_roll_s", "t_train_s", "t_sync_s")


class PhaseSample(BaseModel):
    """One reported iteration, seconds (``t_trigger_s``: when the long-tail trigger fraction of the
    rollout was done, relative to its start; ``tail_load``: see
    :class:`rollmux.intra_group.IterationTimes`; both optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    t_roll_s: float = Field(ge=0, le=MAX_PHASE_S)
    t_train_s: float = Field(ge=0, le=MAX_PHASE_S)
    t_sync_s: float = Field(default=0.0, ge=0, le=MAX_PHASE_S)
    t_trigger_s: Optional[float] = Field(default=None, ge=0, le=MAX_PHASE_S)
    tail_load: Optional[float] = Field(default=None, ge=0, le=1e6)


class MeasuredPhases(BaseModel):
    """A job's measured phase times: the last ``window`` reported iterations (a sliding window)
    and the count of all reports. JSON-able (checkpointed with the job record). Immutable: each
    :meth:`add` returns a new value (the job record's one writer replaces it)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    window: int = Field(default=16, ge=1, le=1024)
    samples: tuple[PhaseSample, ...] = ()
    reports: int = Field(default=0, ge=0, le=2**62)

    @property
    def n(self) -> int:
        """Iterations held in the window."""
        return len(self.samples)

    def add(self, t_roll_s: float, t_train_s: float, t_sync_s: float = 0.0, *, t_trigger_s: Optional[float] = None,
            tail_load: Optional[float] = None) -> "MeasuredPhases":
        """The window with one more iteration (the oldest dropped beyond ``window``).

        Raises pydantic.ValidationError for a negative, non-finite or over-long (> 7 days) time.
        """
        s = PhaseSample(t_roll_s=t_roll_s, t_train_s=t_train_s, t_sync_s=t_sync_s, t_trigger_s=t_trigger_s,
                        tail_load=tail_load)
        if s.t_trigger_s is not None and s.t_trigger_s > s.t_roll_s:
            s = s.model_copy(update={"t_trigger_s": s.t_roll_s})
        return self.model_copy(update={"samples": (self.samples + (s,))[-self.window:], "reports": self.reports + 1})

    def extend(self, its: Iterable[IterationTimes]) -> "MeasuredPhases":
        """:meth:`add` of each iteration of ``its`` in order."""
        out = self
        for it in its:
            out = out.add(it.t_roll_s, it.t_train_s, it.t_sync_s, t_trigger_s=it.t_trigger_s, tail_load=it.tail_load)
        return out

    def _column(self, name: str) -> np.ndarray:
        return np.asarray([getattr(s, name) for s in self.samples], dtype=float)

    def high(self, q: float = 0.9) -> PhaseProfile:
        """Per phase the robust ``q`` quantile of the window (module docstring), floored at
        :data:`MIN_PHASE_S` (sync: 0 stays 0). Raises ValueError on an empty window or q outside (0, 1]."""
        if not 0.0 < q <= 1.0:
            raise ValueError(f"quantile q must lie in (0, 1], got {q}")
        if not self.samples:
            raise ValueError("no measured iterations")
        return _profile({p: robust_quantile(self._column(p), q) for p in _PHASES})

    def mean(self) -> PhaseProfile:
        """Mean per phase of the window (floored as :meth:`high`): ``mean().t_solo_s`` is the
        realised solo iteration time. Raises ValueError on an empty window."""
        if not self.samples:
            raise ValueError("no measured iterations")
        return _profile({p: float(self._column(p).mean()) for p in _PHASES})

    def rollout_distribution(self) -> dict[str, float]:
        """The rollout length over the window: ``{n, mean_s, p50_s, p90_s, max_s}`` (empty: ``{n: 0}``)."""
        if not self.samples:
            return {"n": 0}
        r = self._column("t_roll_s")
        return {"n": int(r.size), "mean_s": float(r.mean()), "p50_s": float(np.percentile(r, 50)),
                "p90_s": float(np.percentile(r, 90)), "max_s": float(r.max())}

    def iterations(self) -> list[IterationTimes]:
        """The window as :class:`IterationTimes` (phase times floored as :meth:`high`), oldest first."""
        out = []
        for s in self.samples:
            tr = max(MIN_PHASE_S, s.t_roll_s)
            trig = None if s.t_trigger_s is None else min(s.t_trigger_s, tr)
            out.append(IterationTimes(tr, max(MIN_PHASE_S, s.t_train_s), s.t_sync_s if s.t_sync_s == 0 else max(MIN_PHASE_S, s.t_sync_s),
                                      trig, s.tail_load))
        return out


def reported_sample(spec: JobSpec, cluster, long_tail, *, t_roll_s: float, t_train_s: float, t_sync_s: float = 0.0,
                    t_trigger_s: Optional[float] = None, tail_responses: Optional[int] = None,
                    tail_migrated: Optional[bool] = None) -> dict:
    """The keyword arguments of :meth:`MeasuredPhases.add` for one iteration a job's runtime
    reported (seconds; the fields of :class:`rollmux.messages.ProgressReport`), in the terms of the
    simulator's :class:`rollmux.intra_group.IterationTimes`, so that the SLO watch predicts from
    either with one function:

    * ``tail_load`` = ``tail_responses`` / the job's concurrent decode slots
      (:func:`rollmux.profiler.rollout_model`: replicas x concurrency), as
      :func:`rollmux.profiler.iteration_times` defines it;
    * a rollout on which long-tail migration acted (``tail_migrated``) ran its rest stretched on
      ``long_tail.tail_gpus`` GPUs after ``migration_overhead_s``: its solo length (what the
      window holds, the denominator of the slowdown users read) is ``t_trigger_s + rest / stretch``
      with ``stretch`` = :meth:`rollmux.intra_group.LongTailPolicy.tail_stretch`.

    ``long_tail``: the :class:`rollmux.intra_group.LongTailPolicy` of the scheduler's settings.
    Without a trigger (``t_trigger_s`` None) the sample carries none."""
    out: dict = {"t_roll_s": t_roll_s, "t_train_s": t_train_s, "t_sync_s": t_sync_s or 0.0}
    if t_trigger_s is None or not (t_trigger_s >= 0 and math.isfinite(t_trigger_s)) or not (t_roll_s >= 0):
        return out
    trig = min(float(t_trigger_s), float(t_roll_s))
    load = None
    if tail_responses is not None and tail_responses >= 0:
        from rollmux import profiler

        m = profiler.rollout_model(spec, cluster.rollout_pool.node.gpu, spec.num_rollout_gpus, spec.max_response_tokens)
        load = float(tail_responses) / max(1, m.replicas * m.concurrency)
    if tail_migrated and long_tail is not None:
        stretch = long_tail.tail_stretch(spec.num_rollout_gpus, load)
        rest = max(0.0, t_roll_s - trig - long_tail.migration_overhead_s)
        out["t_roll_s"] = trig + rest / stretch
    out["t_trigger_s"], out["tail_load"] = trig, load
    return out


def robust_quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` as an order statistic that never takes the largest value
    of two or more (one outlier never decides alone): index ``min(ceil(q n) - 1, n - 2)`` of the
    sorted values, at least 0. Raises IndexError on no values."""
    n = len(values)
    k = min(max(0, math.ceil(q * n) - 1), max(0, n - 2))
    return float(sorted(values)[k])


def _profile(times: Mapping[str, float]) -> PhaseProfile:
    return PhaseProfile(t_roll_s=min(MAX_PHASE_S, max(MIN_PHASE_S, times["t_roll_s"])),
                        t_train_s=min(MAX_PHASE_S, max(MIN_PHASE_S, times["t_train_s"])),
                        t_sync_s=0.0 if times["t_sync_s"] <= 0 else min(MAX_PHASE_S, max(MIN_PHASE_S, times["t_sync_s"])))


def scaled(p: PhaseProfile, f: float) -> PhaseProfile:
    """``p`` with every phase time multiplied by ``f`` (> 0), floored at :data:`MIN_PHASE_S`."""
    if not (f > 0 and math.isfinite(f)):
        raise ValueError(f"scale factor must be a finite number > 0, got {f}")
    return _profile({k: getattr(p, k) * f for k in _PHASES})


def differs(a: PhaseProfile, b: PhaseProfile, rel: float = 0.05) -> bool:
    """Whether any phase time of ``b`` differs from ``a``'s by more than ``rel`` of the iteration
    (the larger of the two solo times): a planning profile is replaced only then, so a window
    that drifts by a few percent per report does not rewrite the group table on every iteration,
    and a short phase (a sync of seconds) whose measurement carries the runtime's own overhead
    per phase (tens of milliseconds) does not replace a profile its iteration does not notice."""
    scale = max(a.t_solo_s, b.t_solo_s)
    return any(abs(getattr(a, p) - getattr(b, p)) > rel * scale for p in _PHASES)


def kind_of(spec: JobSpec) -> tuple:
    """The kind of a job for priors: the same model size and task (single- or multi-turn, turns,
    response cap) -- jobs of one kind have about the same measured/worst-case ratio per phase."""
    return (spec.model_params_b, spec.multi_turn, spec.turns, spec.max_response_tokens)


def ratio_prior(declared: PhaseProfile, ratios: Sequence[Mapping[str, float]], q: float = 0.9) -> Optional[PhaseProfile]:
    """A prior for a job that has not run: ``declared`` times, per phase, the robust ``q`` quantile
    (as :meth:`MeasuredPhases.high`) of the measured/declared ratios of jobs of its kind
    (``ratios``: ``{t_roll_s, t_train_s, t_sync_s}`` each). None without any ratio."""
    if not ratios:
        return None
    return _profile({p: getattr(declared, p) * robust_quantile([r[p] for r in ratios], q) for p in _PHASES})


def ratios_of(declared: PhaseProfile, measured: PhaseProfile) -> dict[str, float]:
    """Per phase measured / declared (a declared sync of 0: ratio 1)."""
    return {p: (getattr(measured, p) / getattr(declared, p)) if getattr(declared, p) > 0 else 1.0 for p in _PHASES}


def planning_profile(source: str, declared: PhaseProfile, measured: Optional[MeasuredPhases] = None, *,
                     min_iterations: int = 3, quantile: float = 0.9, margin: float = 1.0,
                     prior: Optional[PhaseProfile] = None, prior_iterations: int = 8) -> PhaseProfile:
    """The profile a decision plans a job with (module docstring).

    Args:
        source: ``"worst_case"`` | ``"measured"`` | ``"blended"``.
        declared: the job's worst-case (declared or estimated) profile, seconds.
        measured: its window of reported iterations (None: it has not run).
        min_iterations: reports needed before the window is used.
        quantile / margin: the measured profile is ``margin x high(quantile)``.
        prior: the prior of the job's kind (:func:`ratio_prior`) used by ``measured`` before
            ``min_iterations``; None: the worst case.
        prior_iterations: weight of the worst case in ``blended``, in iterations.
    The result pipelines as ``declared`` does (its ``max_staleness``, the job's bound).

    Raises:
        ValueError: an unknown source.
    """
    return _planning(source, declared, measured, min_iterations, quantile, margin, prior,
                     prior_iterations).with_staleness(declared.max_staleness)


def _planning(source: str, declared: PhaseProfile, measured: Optional[MeasuredPhases], min_iterations: int,
              quantile: float, margin: float, prior: Optional[PhaseProfile], prior_iterations: int) -> PhaseProfile:
    if source not in PROFILE_SOURCES:
        raise ValueError(f"profile_source must be one of {', '.join(PROFILE_SOURCES)}, got {source!r}")
    if source == "worst_case":
        return declared
    n = 0 if measured is None else measured.n
    if n < max(1, min_iterations):
        return prior if (source == "measured" and prior is not None) else declared
    m = scaled(measured.high(quantile), margin)  # type: ignore[union-attr]
    if source == "measured":
        return m
    w = n / (n + prior_iterations)
    return _profile({p: w * getattr(m, p) + (1 - w) * getattr(declared, p) for p in _PHASES})
