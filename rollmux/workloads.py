"""RL workload mixes for the simulator: seeded job profiles attached to trace arrivals.

Job types follow the paper's production workloads (RollMux §2 Fig. 2, §7.1 Table 3): Qwen 7B–32B,
single-turn RLVR and multi-turn agentic rollouts, 4k–32k max response tokens, phases from about
50 s to over 900 s, multi-turn rollouts 3–4x longer than their training. As in the paper's
simulation (RollMux §7.5, Appendix Table 6: "each job is defined by its T_roll and T_train, drawn
from uniform distributions"), each type carries uniform ranges for its worst-case rollout and
training times; a drawn job carries them as ``JobSpec.measured`` so the policy plans with exactly
these times. The weight-sync time comes from :func:`rollmux.profiler.estimate` (cross-cluster
bandwidth model). NR/NT are whole 8-GPU nodes fixed by the type.

Mixes weight three categories by the ratio T_roll / T_train: ``balanced`` (0.67..1.5),
``rollout`` (> 1.5) and ``training`` (< 0.67).

Source: RollMux §2, §7.1, §7.5 and Appendix (Table 6).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Literal, Sequence

from rollmux.models import ClusterSpec, JobSpec, PhaseProfile
from rollmux.traces import TraceJob

Category = Literal["balanced", "rollout", "training"]


@dataclass(frozen=True)
class JobType:
    """A representative RL post-training job type.

    Attributes:
        name: short id, e.g. ``"qwen7b-math-s4k"``.
        model_params_b: Qwen model size, billions of parameters.
        multi_turn / turns: agentic multi-turn rollout with ``turns`` generation rounds.
        max_response_tokens: generation cap, tokens (4k–32k).
        num_prompts / responses_per_prompt: rollout batch.
        rollout_gpus / train_gpus: NR / NT, GPUs (multiples of 8).
        t_roll_s / t_train_s: (low, high) of the uniform worst-case phase-time draw, seconds.
        category: ``balanced`` | ``rollout`` | ``training`` (by the ranges' mid-point ratio).
    """

    name: str
    model_params_b: float
    multi_turn: bool
    turns: int
    max_response_tokens: int
    num_prompts: int
    responses_per_prompt: int
    rollout_gpus: int
    train_gpus: int
    t_roll_s: tuple[float, float]
    t_train_s: tuple[float, float]
    category: Category


#: The job-type catalogue (ranges chosen to span the paper's 50–900+ s phases).
JOB_TYPES: tuple[JobType, ...] = (
    JobType("qwen7b-math-s4k", 7, False, 1, 4096, 256, 8, 8, 8, (60, 140), (70, 150), "balanced"),
    JobType("qwen14b-math-s8k", 14, False, 1, 8192, 256, 8, 8, 8, (150, 320), (150, 300), "balanced"),
    JobType("qwen32b-math-s8k", 32, False, 1, 8192, 256, 8, 16, 16, (250, 450), (250, 450), "balanced"),
    JobType("qwen7b-math-s16k", 7, False, 1, 16384, 256, 8, 8, 8, (220, 420), (80, 150), "rollout"),
    JobType("qwen14b-agent-m16k", 14, True, 4, 16384, 128, 8, 8, 8, (450, 750), (120, 220), "rollout"),
    JobType("qwen32b-agent-m32k", 32, True, 4, 32768, 128, 8, 16, 16, (700, 1000), (200, 320), "rollout"),
    JobType("qwen7b-math-s4k-bigbatch", 7, False, 1, 4096, 1024, 8, 8, 16, (60, 120), (200, 380), "training"),
    JobType("qwen14b-math-s4k-bigbatch", 14, False, 1, 4096, 512, 16, 8, 16, (90, 160), (300, 520), "training"),
    JobType("qwen32b-math-s4k", 32, False, 1, 4096, 512, 8, 8, 16, (120, 220), (500, 900), "training"),
)

#: Category weights (balanced, rollout, training) of each mix.
MIXES: dict[str, dict[Category, float]] = {
    "balanced": {"balanced": 0.6, "rollout": 0.2, "training": 0.2},
    "rollout-heavy": {"balanced": 0.2, "rollout": 0.6, "training": 0.2},
    "training-heavy": {"balanced": 0.2, "rollout": 0.2, "training": 0.6},
    "mixed": {"balanced": 1 / 3, "rollout": 1 / 3, "training": 1 / 3},
}


@dataclass(frozen=True)
class SimJob:
    """A trace job with an RL profile: what the simulator replays.

    Attributes:
        spec: the job spec (``spec.measured`` = worst-case phase times used for planning).
        job_type: name of the :class:`JobType` drawn.
        category: its category.
        arrival_s: arrival, seconds from the replay start.
        duration_s: trace duration = the job's work at solo speed, seconds.
    """

    spec: JobSpec
    job_type: str
    category: Category
    arrival_s: float
    duration_s: float

    @property
    def profile(self) -> PhaseProfile:
        """The planning profile (``spec.measured``, pipelined as the job's staleness bound says)."""
        assert self.spec.measured is not None
        return self.spec.measured.with_staleness(self.spec.max_staleness)

    @property
    def iterations(self) -> float:
        """Work in RL iterations: trace duration / solo iteration time (fractional)."""
        return self.duration_s / self.profile.t_solo_s


def mix_names() -> list[str]:
    return sorted(MIXES)


def _sync_s(spec: JobSpec, cluster: ClusterSpec) -> float:
    from rollmux import profiler

    return float(profiler.estimate(spec, cluster).t_sync_s)


def draw_jobs(
    trace: Sequence[TraceJob],
    cluster: ClusterSpec,
    *,
    mix: str = "mixed",
    seed: int = 0,
    slo_range: tuple[float, float] = (1.0, 2.0),
    id_prefix: str = "job",
) -> list[SimJob]:
    """Attach a seeded RL profile to every trace job.

    Args:
        trace: jobs in arrival order (see :func:`rollmux.traces.load_trace`).
        cluster: used for the weight-sync time (profiler's cross-cluster model).
        mix: one of :data:`MIXES`.
        seed: the same seed, trace and mix give the same jobs.
        slo_range: SLO ~ U(low, high) (default U(1, 2), RollMux §7.5).
        id_prefix: job ids are ``f"{id_prefix}-{index:05d}"``.

    Returns:
        One :class:`SimJob` per trace job, same order.

    Raises:
        ValueError: unknown mix, or a bad SLO range (must satisfy 1 <= low <= high).
    """
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}; known mixes: {mix_names()}")
    lo, hi = slo_range
    if not (1.0 <= lo <= hi):
        raise ValueError(f"slo_range must satisfy 1 <= low <= high, got {slo_range}")
    rng = random.Random(seed)
    weights = MIXES[mix]
    cats = [c for c in weights if weights[c] > 0]
    by_cat = {c: [t for t in JOB_TYPES if t.category == c] for c in cats}
    out: list[SimJob] = []
    sync_cache: dict[str, float] = {}
    for tj in trace:
        cat = rng.choices(cats, weights=[weights[c] for c in cats])[0]
        jt = rng.choice(by_cat[cat])
        t_roll = rng.uniform(*jt.t_roll_s)
        t_train = rng.uniform(*jt.t_train_s)
        slo = round(rng.uniform(lo, hi), 4)
        base = JobSpec(
            job_id=f"{id_prefix}-{tj.index:05d}",
            model_params_b=jt.model_params_b,
            num_prompts=jt.num_prompts,
            responses_per_prompt=jt.responses_per_prompt,
            max_response_tokens=jt.max_response_tokens,
            multi_turn=jt.multi_turn,
            turns=jt.turns,
            num_rollout_gpus=jt.rollout_gpus,
            num_train_gpus=jt.train_gpus,
            slo=slo,
        )
        if jt.name not in sync_cache:
            sync_cache[jt.name] = _sync_s(base, cluster)
        measured = PhaseProfile(t_roll_s=round(t_roll, 3), t_train_s=round(t_train, 3), t_sync_s=sync_cache[jt.name])
        spec = base.model_copy(update={"measured": measured})
        out.append(SimJob(spec=spec, job_type=jt.name, category=jt.category, arrival_s=tj.arrival_s, duration_s=tj.duration_s))
    return out


def assign_async(jobs: Sequence[SimJob], share: float, *, max_staleness: int = 1, mode: str = "mixed",
                 seed: int = 0) -> list[SimJob]:
    """The jobs with a seeded ``share`` of them made asynchronous (off-policy): those get
    ``max_staleness`` and a staleness mode (``"exact"``, ``"bounded"``, or ``"mixed"``: each drawn
    with probability 1/2). The same seed, jobs and arguments give the same draw; the draw does
    not touch the jobs' other fields, so every policy replays the same jobs.

    Raises ValueError for a share outside [0, 1], a bound below 1 or an unknown mode."""
    from rollmux.staleness import MAX_STALENESS, STALENESS_MODES

    if not 0.0 <= share <= 1.0:
        raise ValueError(f"async share must lie in [0, 1], got {share}")
    if not 1 <= max_staleness <= MAX_STALENESS:
        raise ValueError(f"max_staleness of an asynchronous job must lie in [1, {MAX_STALENESS}], got {max_staleness}")
    if mode not in (*STALENESS_MODES, "mixed"):
        raise ValueError(f"unknown staleness mode {mode!r} (known: {', '.join(STALENESS_MODES)}, mixed)")
    rng = random.Random(f"async-{seed}")
    out = []
    for sj in jobs:
        is_async, coin = rng.random() < share, rng.random()
        if not is_async:
            out.append(sj)
            continue
        m = mode if mode != "mixed" else ("exact" if coin < 0.5 else "bounded")
        out.append(replace(sj, spec=sj.spec.model_copy(update={"max_staleness": int(max_staleness), "staleness_mode": m})))
    return out


def parse_class_shares(text: str, classes: Sequence[str]) -> dict[str, float]:
    """``"production=0.2,research=0.5,best-effort=0.3"`` -> ``{class: share}`` (shares >= 0,
    summing to 1 within 1e-6). Raises ValueError naming the bad part (an unknown class lists
    ``classes``)."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, val = part.partition("=")
        name = name.strip()
        if not eq:
            raise ValueError(f"{part!r}: give class=share")
        if name not in classes:
            raise ValueError(f"{name!r} is not a priority class (known: {', '.join(classes)})")
        if name in out:
            raise ValueError(f"{name!r} given twice")
        try:
            share = float(val)
        except ValueError:
            raise ValueError(f"{part!r}: the share must be a number") from None
        if not (share >= 0 and share == share and share != float("inf")):
            raise ValueError(f"{part!r}: the share must be a finite number >= 0")
        out[name] = share
    if not out or abs(sum(out.values()) - 1.0) > 1e-6:
        raise ValueError(f"the shares must sum to 1, got {sum(out.values()):g}")
    return out


def assign_priorities(jobs: Sequence[SimJob], shares: dict[str, float], *, seed: int = 0,
                      tenants_from_trace: Sequence[TraceJob] = ()) -> list[SimJob]:
    """The jobs with a priority class drawn with ``shares`` (seeded; the same seed and jobs give
    the same classes) and, where ``tenants_from_trace`` is given (same order), the trace job's
    virtual cluster as tenant (Philly's ``cluster`` column; empty: no tenant)."""
    rng = random.Random(f"priorities-{seed}")
    names = [c for c, w in shares.items() if w > 0]
    ws = [shares[c] for c in names]
    vcs = [t.cluster for t in tenants_from_trace] if tenants_from_trace else [""] * len(jobs)
    out = []
    for sj, vc in zip(jobs, vcs):
        upd = {"priority_class": rng.choices(names, weights=ws)[0]}
        if vc:
            upd["tenant"] = vc if vc[:1].isalpha() else f"vc-{vc}"
        out.append(replace(sj, spec=sj.spec.model_copy(update=upd)))
    return out
