"""Realised phase times of the trace replay (:class:`Realisation`): per job its iterations
(deterministic: the worst-case planning times; stochastic: seeded long-tailed samples), per group
its realised round-robin schedule and its simulator unit (price, GPUs, iteration times, busy
GPU-seconds over its lifetime). One instance is shared by every policy of a run, so the same job
gets the same samples under every policy. Source: RollMux §7.4-§7.5 (trace-driven simulation).
"""

from __future__ import annotations

import zlib
from typing import Optional

import numpy as np

from rollmux import profiler
from rollmux.admission import load_scheduler_config
from rollmux.baselines import Unit
from rollmux.intra_group import (IterationTimes, LongTailPolicy, realised_solo_s, sampled_meta_iterations, simulate_group,
                                 steady_schedule)
from rollmux.models import ClusterSpec, CoExecutionGroup, GroupMember, JobSpec, PhaseProfile, Placement

#: floor of a mean realised phase time, s (a phase is never 0 s long)
_EPS = 1e-9


class Realisation:
    """Realised phase times of jobs and groups (deterministic or stochastic), cached.

    Args:
        cluster: the simulated cluster.
        stochastic: draw long-tailed rollouts per iteration (see module docstring).
        seed: seeds each job's samples (``(seed, crc32(job_id))``).
        samples: iterations sampled per job in stochastic mode.
        long_tail: migration policy used for stochastic group schedules (default: the settings
            of ``configs/scheduler.yaml``; ``tail_migration: false`` there turns it off).
    """

    def __init__(self, cluster: ClusterSpec, *, stochastic: bool = False, seed: int = 0, samples: int = 8,
                 long_tail: Optional[LongTailPolicy] = None) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.cluster = cluster
        self.stochastic = stochastic
        self.seed = seed
        self.samples = samples
        if long_tail is None:
            cfg = load_scheduler_config()
            long_tail = cfg.long_tail_policy()
            self.migrate = cfg.tail_migration
        else:
            self.migrate = True
        self.long_tail = long_tail
        self._iters: dict[str, list[IterationTimes]] = {}
        self._units: dict[tuple, Unit] = {}
        self._schedules: dict[tuple, object] = {}
        self._curves: dict[tuple, tuple] = {}  # (unit key, job ids) -> (BusyCurve, w0, w1)
        self._keys_of: dict[str, list[tuple[dict, tuple]]] = {}  # job id -> (cache, key) holding it (forget)

    def iterations_of(self, spec: JobSpec) -> list[IterationTimes]:
        """The job's sampled iterations (stochastic) or its planning profile once (deterministic)."""
        if spec.job_id not in self._iters:
            prof = profiler.estimate(spec, self.cluster)
            if not self.stochastic:
                its = [IterationTimes(prof.t_roll_s, prof.t_train_s, prof.t_sync_s)]
            else:
                rng = np.random.default_rng([self.seed, zlib.crc32(spec.job_id.encode())])
                its = [
                    profiler.sample_iteration(spec, self.cluster, rng, trigger_fraction=self.long_tail.trigger_fraction, profile=prof)
                    for _ in range(self.samples)
                ]
            self._iters[spec.job_id] = its
        return self._iters[spec.job_id]

    def mean_profile(self, spec: JobSpec) -> PhaseProfile:
        """Mean realised phase times of ``spec`` (its own hardware), seconds."""
        its = self.iterations_of(spec)
        k = len(its)
        return PhaseProfile(
            t_roll_s=max(_EPS, sum(i.t_roll_s for i in its) / k),
            t_train_s=max(_EPS, sum(i.t_train_s for i in its) / k),
            t_sync_s=sum(i.t_sync_s for i in its) / k,
            max_staleness=spec.max_staleness,
        )

    def solo_time_s(self, spec: JobSpec) -> float:
        """Realised solo iteration time (mean over the samples), seconds; an asynchronous job's
        sampled iterations pipeline alone on its own nodes (:func:`rollmux.intra_group.realised_solo_s`)."""
        if spec.max_staleness and self.stochastic:
            pl = Placement(job_id=spec.job_id, rollout_nodes=("rollout-0",), train_nodes=("train-0",))
            mb = GroupMember(spec=spec, profile=profiler.estimate(spec, self.cluster), placement=pl)
            return realised_solo_s(mb, self.iterations_of(spec))
        return self.mean_profile(spec).t_solo_s

    @staticmethod
    def _group_key(group: CoExecutionGroup) -> tuple:
        # the planning profiles too: the round-robin schedule reads them (a migrated tail may stretch
        # into the slack its planned rollout leaves), and measured profiles replace them at run time
        return (group.rollout_nodes, group.train_nodes) + tuple(
            (m.spec.job_id, m.placement.rollout_nodes, m.placement.train_nodes, m.profile) for m in group.members
        )

    def gpus_per_node(self) -> dict[str, int]:
        """GPUs per node of each pool of the simulated cluster."""
        c = self.cluster
        return {"rollout": c.rollout_pool.node.gpus_per_node, "train": c.train_pool.node.gpus_per_node}

    def schedule(self, group: CoExecutionGroup, *, record_timeline: bool = False):
        """Realised round-robin schedule of ``group`` (:class:`rollmux.intra_group.GroupSchedule`),
        GPU-weighted (records carry the GPUs each job uses per node)."""
        key = self._group_key(group) + (record_timeline,)
        if key not in self._schedules:
            gpn = self.gpus_per_node()
            if self.stochastic:
                times = {m.spec.job_id: self.iterations_of(m.spec) for m in group.members}
                self._schedules[key] = simulate_group(
                    group, meta_iterations=sampled_meta_iterations(group, self.samples), phase_times=times,
                    long_tail=self.long_tail if self.migrate else None, record_timeline=record_timeline, gpus_per_node=gpn,
                )
            else:
                self._schedules[key] = simulate_group(group, record_timeline=record_timeline, gpus_per_node=gpn)
            self._remember(self._schedules, key, group)
        return self._schedules[key]

    def _remember(self, cache: dict, key: tuple, group: CoExecutionGroup) -> None:
        for jid in group.job_ids:
            self._keys_of.setdefault(jid, []).append((cache, key))

    def group_unit(self, group: CoExecutionGroup) -> Unit:
        """The group as a simulator unit: its price, GPUs, realised iteration times, busy GPUs."""
        key = self._group_key(group)
        if key not in self._units:
            c = self.cluster
            # deterministic: the steady state without the event simulation (the same figures,
            # bit for bit: intra_group.steady_schedule)
            s = self.schedule(group) if self.stochastic else steady_schedule(group, gpus_per_node=self.gpus_per_node())
            rg = len(group.rollout_nodes) * c.rollout_pool.node.gpus_per_node
            tg = len(group.train_nodes) * c.train_pool.node.gpus_per_node
            self._units[key] = Unit(
                key=group.group_id,
                job_ids=group.job_ids,
                cost_usd_per_h=group.cost_usd_per_h(c),
                rollout_gpus=rg,
                train_gpus=tg,
                iter_time_s=dict(s.t_coexec_s),
                rollout_busy_gpus=rg * s.busy_fraction["rollout"],
                train_busy_gpus=tg * s.busy_fraction["train"],
                staleness={j: {v: c / sum(cnt.values()) for v, c in cnt.items()} for j, cnt in s.staleness.items()},
            )
            self._curves[(group.group_id, group.job_ids)] = (s.busy_curve, *s.window_s)
            self._remember(self._curves, (group.group_id, group.job_ids), group)
            self._remember(self._units, key, group)
        return self._units[key]

    def busy_params(self, unit: Unit) -> tuple:
        """What :meth:`busy_gpu_s` reads for ``unit``, looked up once: ``(curve, w1, busy rollout
        GPU-s at w1, busy training GPU-s at w1, steady rollout GPUs, steady training GPUs)``;
        ``curve`` is None for a per-job unit (then ``w1`` is None)."""
        cur = self._curves.get((unit.key, unit.job_ids))
        if cur is None:
            return None, None, 0.0, 0.0, unit.rollout_busy_gpus, unit.train_busy_gpus
        curve, _, w1 = cur
        return (curve, w1, curve.cumulative("rollout", w1), curve.cumulative("train", w1),
                unit.rollout_busy_gpus, unit.train_busy_gpus)

    @staticmethod
    def busy_from_params(params: tuple, age0_s: float, age1_s: float) -> tuple[float, float]:
        """:meth:`busy_gpu_s` from :meth:`busy_params` (the same arithmetic, bit for bit)."""
        curve, w1, c_r, c_t, s_r, s_t = params
        if curve is None:
            d = max(0.0, age1_s - age0_s)
            return s_r * d, s_t * d
        if age0_s > w1:  # both ends past the simulated window: steady state
            return (c_r + s_r * (age1_s - w1)) - (c_r + s_r * (age0_s - w1)), (c_t + s_t * (age1_s - w1)) - (c_t + s_t * (age0_s - w1))
        cum = curve.cumulative
        r1 = cum("rollout", age1_s) if age1_s <= w1 else c_r + s_r * (age1_s - w1)
        t1 = cum("train", age1_s) if age1_s <= w1 else c_t + s_t * (age1_s - w1)
        return r1 - cum("rollout", age0_s), t1 - cum("train", age0_s)

    def busy_gpu_s(self, unit: Unit, age0_s: float, age1_s: float) -> tuple[float, float]:
        """Busy GPU-seconds (rollout, train) of ``unit`` between ages ``age0_s`` and ``age1_s``
        (seconds since the unit was formed).

        A co-execution group's busy time follows its realised timeline from an empty pipeline
        (:class:`rollmux.occupancy.BusyCurve`: GPU-weighted, union of busy intervals), so the
        warm-up after each formation counts; past the simulated window it continues at the
        steady-state rate. A per-job unit runs its phases back to back, so its busy GPU-seconds
        grow at ``*_busy_gpus`` (exact at every iteration boundary).
        """
        cur = self._curves.get((unit.key, unit.job_ids))
        if cur is None:
            d = max(0.0, age1_s - age0_s)
            return unit.rollout_busy_gpus * d, unit.train_busy_gpus * d
        curve, w0, w1 = cur

        def cum(pool: str, a: float, steady_gpus: float) -> float:
            return curve.cumulative(pool, a) if a <= w1 else curve.cumulative(pool, w1) + steady_gpus * (a - w1)

        return (cum("rollout", age1_s, unit.rollout_busy_gpus) - cum("rollout", age0_s, unit.rollout_busy_gpus),
                cum("train", age1_s, unit.train_busy_gpus) - cum("train", age0_s, unit.train_busy_gpus))

    def forget(self, job_id: str) -> None:
        """Drop cached schedules containing a departed job (bounds memory)."""
        for cache, k in self._keys_of.pop(job_id, ()):  # the units, schedules and busy curves holding it
            cache.pop(k, None)
