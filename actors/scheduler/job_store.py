"""The GlobalScheduler's job records: the one writer of every record and of every state change.

:class:`JobStore` keeps one :class:`rollmux.records.JobRecord` per job (admission order) and is
the only code that changes a record: a job's state changes only through a transition of
:data:`rollmux.records.TRANSITIONS` (:meth:`JobStore.transition`; an illegal one raises
:class:`rollmux.records.IllegalTransition`), its progress only by the reports it receives
(:meth:`JobStore.note_progress`), its moves only by the policy's committed moves
(:meth:`JobStore.record_moves`), the drains of its preemptions and moves only by
:meth:`JobStore.note_drain` (:mod:`rollmux.drain`).

Where a job is (its group and nodes) is the policy's fact (``InterGroupScheduler``): an active
record's ``group_id`` / ``placement`` / ``controller`` are read from the policy's table for every
view (:meth:`JobStore.view`) and frozen into the record when the job ends (:meth:`JobStore.end`);
the checkpoint keeps only an ended job's frozen placement (:meth:`JobStore.stored`).

Pure bookkeeping: no Ray, no I/O (the scheduler checkpoints what changed).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Callable, Iterator, Optional

from actors.naming import controller_name
from rollmux.drain import Drain, move_drain, preemption_drain
from rollmux.drain import step as drain_step
from rollmux.admission.slo_watch import long_tail_of
from rollmux.answers import Admission
from rollmux.measured import MeasuredPhases, reported_sample
from rollmux.messages import ProgressReport
from rollmux.models import JobSpec
from rollmux.preemption import resumed_preemptions
from rollmux.records import JobRecord, JobState, MoveRecord, NodePlacement, explain_failure

__all__ = ["JobStore", "MAX_FINISHED_RECORDS", "spec_sha256"]

MAX_FINISHED_RECORDS = 5000  # ended jobs' records kept (older ones are dropped with a later write)


def spec_sha256(job: JobSpec) -> str:
    """SHA-256 of a spec's canonical JSON (a retry of the same spec is recognised by it)."""
    return hashlib.sha256(json.dumps(job.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


class JobStore:
    """Job records of one scheduler (see the module docstring).

    Args:
        scheduler_name: the scheduler's actor name (controller names derive from it).
        policy: returns the current policy (``InterGroupScheduler``; replaced on restore and rollback).
    """

    def __init__(self, scheduler_name: str, policy: Callable[[], object]):
        self.name = scheduler_name
        self._policy = policy
        self.records: dict[str, JobRecord] = {}
        self.ended_since_prune = True  # a job ended since ended records were last counted (O(jobs) scan)

    # ---- reading
    def get(self, job_id: str) -> Optional[JobRecord]:
        return self.records.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.records

    def __iter__(self) -> Iterator[str]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def active(self) -> int:
        return sum(r.state.is_active() for r in self.records.values())

    def group_id(self, rec: JobRecord) -> Optional[str]:
        """The job's group: the policy's while it is active, the frozen one once it ended."""
        if rec.state.is_active():
            g = self._policy().group_of(rec.job_id)
            return None if g is None else g.group_id
        return rec.group_id

    def view(self, rec: JobRecord, answer: bool = False) -> JobRecord:
        """The record with its placement read from the policy (active) or as frozen (ended).
        ``answer``: always a copy, without the checkpoint-only fields (what the scheduler answers
        and publishes: :meth:`rollmux.records.JobRecord.answered`)."""
        upd: dict = {"spec_sha256": None, "decision": None} if answer else {}
        m = self._policy().member(rec.job_id) if rec.state.is_active() else None
        if m is not None:
            gid = self._policy().group_of(rec.job_id).group_id
            upd.update(group_id=gid, controller=controller_name(gid, self.name),
                       placement=NodePlacement(rollout_nodes=list(m.placement.rollout_nodes),
                                               train_nodes=list(m.placement.train_nodes)))
        return rec.model_copy(update=upd) if upd else rec

    def active_by_group(self) -> dict[str, list[JobRecord]]:
        """Active records per group, in the records' admission order."""
        out: dict[str, list[JobRecord]] = {}
        for rec in self.records.values():
            gid = self.group_id(rec) if rec.state.is_active() else None
            if gid is not None:
                out.setdefault(gid, []).append(rec)
        return out

    # ---- the checkpoint's form
    @staticmethod
    def stored(rec: JobRecord) -> dict:
        """What the checkpoint keeps of a record: an active job's placement is the policy's
        (stored in its group), so only an ended job's frozen placement is written."""
        if rec.state.is_active():
            rec = rec.model_copy(update={"group_id": None, "placement": None, "controller": None})
        return rec.stored()

    def snapshot(self) -> dict[str, dict]:
        return {j: self.stored(r) for j, r in self.records.items()}

    def load(self, raw_jobs: dict) -> None:
        """Replace every record with the checkpoint's (admission order)."""
        jobs = {}
        for raw in raw_jobs.values():
            rec = JobRecord.model_validate(raw)
            jobs[rec.job_id] = rec
        self.records = dict(sorted(jobs.items(), key=lambda kv: kv[1].admitted_at or 0.0))

    def copy_active(self) -> dict[str, JobRecord]:
        """A copy to roll back to (ended records are never changed again, so they are shared)."""
        return {j: r.model_copy(deep=True) if r.state.is_active() else r for j, r in self.records.items()}

    def prune_candidates(self) -> tuple[str, ...]:
        """The oldest ended records beyond MAX_FINISHED_RECORDS (counted only after a job ended:
        an O(jobs) scan); the write that follows drops them (:meth:`drop`)."""
        if not self.ended_since_prune:
            return ()
        done = [j for j, r in self.records.items() if r.state.is_ended()]  # a preempted job is not done
        return tuple(done[: max(0, len(done) - MAX_FINISHED_RECORDS)])

    def drop(self, job_ids: tuple[str, ...]) -> None:
        """Forget ``job_ids`` (written as dropped); the ended records are counted again after the next end."""
        for j in job_ids:
            self.records.pop(j, None)
        self.ended_since_prune = False

    # ---- lifecycle: the only writer of a record's state
    def transition(self, rec: JobRecord, to: JobState) -> JobState:
        """Move ``rec`` to ``to`` (a transition of :data:`rollmux.records.TRANSITIONS`; raises
        :class:`rollmux.records.IllegalTransition` otherwise)."""
        rec.state = rec.state.to(to)
        if rec.state.is_ended():
            self.ended_since_prune = True
        return rec.state

    def advance(self, rec: JobRecord, to: JobState) -> bool:
        """An event saying ``to`` that may arrive late (:meth:`JobState.advance`); True when the
        state changed."""
        new = rec.state.advance(to)
        if new == rec.state:
            return False
        self.transition(rec, new)
        return True

    def admitted(self, job: JobSpec, decision: Admission, profile, *, sha: Optional[str] = None,
                 queued=None, now: Optional[float] = None, borrowed: bool = False) -> JobRecord:
        """The record of a committed admission (state ``admitted``; ``queued``: the queue entry it
        left, ``queued -> admitted``, with its wait). A re-admitted id goes to the end (admission order)."""
        now = time.time() if now is None else now
        old = self.records.pop(job.job_id, None)
        resumed = old is not None and old.state == JobState.PREEMPTED
        # the state it leaves (a preempted job resumes, a queued one leaves the line) or a new job's
        prior = old.state if resumed else JobState.QUEUED if queued is not None else JobState.ADMITTED
        rec = JobRecord(
            job_id=job.job_id, state=prior, slo=job.slo, admission_id=uuid.uuid4().hex,
            predicted=None if profile is None else {"t_roll_s": profile.t_roll_s, "t_train_s": profile.t_train_s,
                                                    "t_sync_s": profile.t_sync_s, "t_solo_s": profile.t_solo_s},
            predicted_slowdown=decision.predicted_slowdowns.get(job.job_id), admitted_at=now,
            spec_sha256=sha or spec_sha256(job),
            decision={k: v for k, v in decision.replace(candidates=(), pruned=()).to_dict().items()
                      if k not in ("candidates", "pruned")},
            admission=admission_summary(decision))
        if queued is not None:
            rec.queued_at, rec.waited_s = queued.enqueued_at, max(0.0, now - queued.enqueued_at)
        cfg = self._policy().config
        from rollmux.preemption import class_of, tenant_of

        rec.priority_class, rec.tenant, rec.borrowed = class_of(cfg, job), tenant_of(cfg, job), bool(borrowed)
        if resumed:  # its history and progress go on
            rec.preemptions = resumed_preemptions(old.preemptions, now)
            rec.iterations_done = old.iterations_done
            rec.measured, rec.slowdown, rec.measured_phases = old.measured, old.slowdown, old.measured_phases
        if prior != JobState.ADMITTED:
            self.transition(rec, JobState.ADMITTED)
        self.records[job.job_id] = rec
        return rec

    def preempt(self, rec: JobRecord, entry: dict) -> None:
        """The job is preempted (``admitted | running -> preempted``) and waits in the admission
        queue: ``entry`` (:class:`rollmux.preemption.PreemptionRecord` dict with ``at_s`` in Unix
        time and the group and nodes it ran on, which its drain and its old group's controller
        read) is appended to its preemptions; the record names no group, nodes or controller while
        it waits (none is its own) and says when it entered the queue (``queued_at``)."""
        rec.group_id, rec.placement, rec.controller = None, None, None
        self.transition(rec, JobState.PREEMPTED)
        rec.preemptions = [*rec.preemptions, {**entry, "iteration": rec.iterations_done}]
        rec.queued_at, rec.waited_s = entry["at_s"], None

    def last_group(self, rec: JobRecord) -> Optional[str]:
        """The group the job was last in: its current one, the frozen one of an ended job, or
        the one it was preempted from (a preempted job waiting, or one that ended waiting)."""
        gid = self.group_id(rec)
        if gid is None and not rec.state.is_active() and rec.preemptions:
            return rec.preemptions[-1].get("group_id")
        return gid

    @staticmethod
    def note_drain(rec: JobRecord, now: float, *, stopped: bool = False, drained: Optional[str] = None,
                   group_id: Optional[str] = None) -> tuple[bool, set[str]]:
        """A step of the job's drains still in progress (:mod:`rollmux.drain`: its preemptions'
        and its moves', those off group ``group_id``; None: all of them): ``stopped``, the old
        group's controller removed it at its iteration boundary (``stopped_at_s = now``, once);
        ``drained``, how its nodes there became free (``drained_at_s = now``). ``now``: Unix
        time, s. Returns (whether the record changed, the nodes freed by this call)."""
        freed: set[str] = set()

        def one(d: Drain) -> dict:
            if group_id is not None and d.group_id != group_id:
                return {}
            upd = drain_step(d, now, stopped=stopped, drained=drained)
            if "drained_at_s" in upd:
                freed.update(d.nodes)
            return upd

        changed = False
        pre = []
        for entry in rec.preemptions:
            upd = one(preemption_drain(rec.job_id, entry))
            changed |= bool(upd)
            pre.append({**entry, **upd} if upd else entry)
        mvs = []
        for m in rec.moves:
            upd = one(move_drain(rec.job_id, m))
            changed |= bool(upd)
            mvs.append(m.model_copy(update=upd) if upd else m)
        if changed:
            rec.preemptions, rec.moves = pre, mvs
        return changed, freed

    def left_queue_failed(self, job_id: str, slo: Optional[float], enqueued_at: float, reason: str,
                          now: float) -> JobRecord:
        """The record of a queued job that can never be admitted: ``queued -> failed`` (a new
        record), or ``preempted -> failed`` (its record, with its history, ends)."""
        rec = self.records.get(job_id)
        if rec is None or rec.state != JobState.PREEMPTED:
            self.records.pop(job_id, None)
            rec = self.records[job_id] = JobRecord(job_id=job_id, state=JobState.QUEUED, slo=slo)
        self.transition(rec, JobState.FAILED)
        rec.queued_at, rec.waited_s, rec.ended_at = enqueued_at, now - enqueued_at, now
        rec.error = f"left the admission queue, it can never be admitted: {reason}"
        return rec

    def left_queue_cancelled(self, job_id: str, now: float) -> JobState:
        """A queued job withdrawn: ``preempted -> cancelled`` for a preempted job waiting (its record
        ends), ``queued -> cancelled`` for one never admitted (it has no record). The new state."""
        rec = self.records.get(job_id)
        if rec is None or rec.state != JobState.PREEMPTED:  # never admitted: nothing was recorded, nothing ends
            return JobState.CANCELLED
        rec.ended_at = now
        return self.transition(rec, JobState.CANCELLED)

    def end(self, rec: JobRecord, state: JobState, error: Optional[str], final: JobRecord, now: float) -> None:
        """The job ended (``state``: finished | failed | expired): its placement ``final`` (its
        view before the policy forgot it) is frozen into the record; a failure's ``error`` is
        written for people (:func:`rollmux.records.explain_failure`), the raw one kept as ``error_detail``."""
        rec.group_id, rec.placement, rec.controller = final.group_id, final.placement, final.controller
        self.transition(rec, state)
        rec.ended_at = now
        if state == JobState.FAILED:
            pl = final.placement
            rec.error = explain_failure(error, tuple(pl.rollout_nodes + pl.train_nodes) if pl else ())
            rec.error_detail = error
        else:
            rec.error = error

    # ---- progress and moves (derived facts, from what the scheduler receives)
    def note_progress(self, rec: JobRecord, report: ProgressReport) -> None:
        """One measured iteration from the group's controller (also after the end: reports from
        the controller and the driver may cross); an admitted job is running by then."""
        self.advance(rec, JobState.RUNNING)
        rec.note_iteration(report.iterations_done, report.t_iter_s, report.t_solo_s, report.slowdown)
        # the job's measured profile (sliding window); a cold-start iteration is not a profile
        if report.t_roll_s is not None and report.t_train_s is not None and not report.cold_start:
            pol = self._policy()
            win = rec.measured_phases or MeasuredPhases(window=pol.config.measured_window)
            member = pol.member(rec.job_id)
            k = 1.0 / pol.config.wall_s_per_model_s  # wall -> the cluster's own seconds (emulated: modelled)
            roll, train, sync = report.t_roll_s * k, report.t_train_s * k, (report.t_sync_s or 0.0) * k
            trig = None if report.t_trigger_s is None else report.t_trigger_s * k
            try:  # in the simulator's terms (trigger time, tail load): the SLO watch predicts with one function
                rec.measured_phases = win.add(**reported_sample(
                    member.spec, pol.cluster, long_tail_of(pol.config), t_roll_s=roll, t_train_s=train,
                    t_sync_s=sync, t_trigger_s=trig, tail_responses=report.tail_responses,
                    tail_migrated=report.tail_migrated)) if member is not None else win.add(roll, train, sync)
            except ValueError:  # a non-finite or over-long report is dropped, never folded in
                pass

    @staticmethod
    def note_slo_action(rec: JobRecord, action: dict) -> None:
        """The SLO watch's decision about the job (:class:`rollmux.admission.slo_watch.SloAction`
        dict with ``at``), kept in its record."""
        rec.slo_action = dict(action)

    @staticmethod
    def note_final_count(rec: JobRecord, iterations_done: Optional[int]) -> None:
        """The driver's final iteration count (the owner's value, sent with its finish / failure)."""
        if iterations_done is not None:
            rec.iterations_done = max(rec.iterations_done, int(iterations_done))

    def record_moves(self, moves: list[dict], trigger: str, now: float, predicted: Callable[[str, str], Optional[float]],
                     settled: Callable[[dict], Optional[str]] = lambda mv: None) -> list[MoveRecord]:
        """Append the policy's committed moves to the moved jobs' records, with the policy's
        predicted slowdown in the new group (``predicted(group_id, job_id)``) and the move's
        drain off its old nodes (the policy's ``from_placement``; :mod:`rollmux.drain`):
        ``settled(move)`` says how it is already drained (nothing of the job ran there), or None
        (it drains at the job's iteration boundary). ``now``: Unix time, s."""
        done = []
        for mv in moves:
            r = self.records[mv["job_id"]]
            was = mv.get("from_placement") or {}
            old = list(dict.fromkeys([*was.get("rollout_nodes", ()), *was.get("train_nodes", ())]))
            how = settled(mv) if old else None
            m = MoveRecord(job_id=mv["job_id"], from_group=mv["from_group"], to_group=mv["to_group"],
                           placement=NodePlacement(rollout_nodes=list(mv["placement"]["rollout_nodes"]),
                                                   train_nodes=list(mv["placement"]["train_nodes"])),
                           move_s=mv.get("move_s"), at=now, trigger=trigger, from_nodes=old,
                           stopped_at_s=now if how else None, drained_at_s=now if how else None, drained=how)
            r.moves = [*r.moves, m]
            r.predicted_slowdown = predicted(m.to_group, m.job_id)
            done.append(m)
        return done


def admission_summary(decision: Admission, most: int = 4) -> dict:
    """The public ``admission`` of a job record: where its admission decision placed it and why
    (``JobRecord.admission``): strategy, group, reason, marginal cost, and the rejected placements
    in existing groups (``group/strategy: filter: reason``, at most ``most``), so that a job
    isolated in a group of its own says what kept it out of the others."""
    rejected = [f"{c.group_id}/{c.strategy}: {c.plugin}: {'; '.join(c.reasons)}"
                for c in decision.candidates if c.verdict != "ok" and c.group_id]
    rejected += [f"{p.group_id}: {p.plugin}: {p.reason}" for p in decision.pruned]
    chosen_only = decision.candidates_listed == "chosen"  # ?explain=chosen: the others were not explained
    return {"strategy": decision.strategy, "group_id": decision.group_id, "reason": decision.reason,
            "delta_usd_per_h": decision.delta_usd_per_h, "rejected": None if chosen_only else rejected[:most],
            "explain": "chosen" if chosen_only else "full"}
