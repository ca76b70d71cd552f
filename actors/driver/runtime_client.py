"""What the phase-API shim (:mod:`rollmux.phase_api`) calls in scheduled mode (RollMux §5.1).

:class:`ScheduledRuntime` attaches a :class:`rollmux.Job` to the GlobalScheduler: it admits the
job (or attaches to an already admitted job id), registers the job's builders and phase
functions on the RolloutWorker / TrainWorker of its placement's nodes, and runs each phase as
``acquire`` (GroupController permit, a :class:`rollmux.messages.Grant`) -> ``worker.run`` (a
:class:`rollmux.messages.PhaseCall`: warm start, run, offload, commit; the leader worker, the
grant's releaser, releases the permit).

A job script submitted with ``ray job submit --working-dir . -- python scripts/grpo_job.py ...``
attaches when env ``ROLLMUX_ATTACH=1`` (admit its own spec) or ``ROLLMUX_JOB_ID=<id>`` (attach to
a job admitted earlier, e.g. through the HTTP API) is set; ``RAY_ADDRESS`` (set by Ray for
submitted jobs) selects the cluster.

Departure re-packing (``GlobalScheduler._end``) may move a job to another group between two of its
meta-iterations. The driver learns it when a permit is refused (no extra round trip per phase):
it then reads its record, moves its stored state to the new nodes' workers, attaches to the new
group's controller and retries the permit once (:meth:`ScheduledRuntime._rehome`).

Multi-node phases: a job placed on k rollout nodes and m training nodes runs every phase on all
of them as one SPMD step (:meth:`actors.worker.workers._PoolWorker.run`): the driver calls the pool's
rank-0 worker, which starts the other ranks, and gets the rank results in rank order; the job's
``@job.gather(phase)`` function combines them (see :func:`rollmux.phase_state.parallel` for what
a rank sees). Each pool's workers share a rendezvous store hosted by their rank 0 and a gloo
process group built at first use (the job's resident control plane). The sync weights travel
N -> M through collectives/ (RollMux §5.2 plan over the job's actual training and rollout workers;
``Job(sync_backend="auto")``, the default, takes cupy-NCCL where every worker holds its own GPU,
else gloo), or through the object store (the fallback; every rollout worker pulls a full copy).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Optional

from actors.handles import REGISTER_TIMEOUT_S, REPORT_TIMEOUT_S, ActorLost, ControllerHandle, SchedulerHandle, gather
from actors.naming import (  # noqa: F401  (ensure_ray, control_plane_resources re-exported)
    NAMESPACE, control_plane_resources, ensure_ray, get_scheduler, hosted_key, worker_name,
)
from actors.worker.workers import JobNotHosted, WorkerLost, worker_handle
from rollmux.group_ledger import HEARTBEAT_S, PermitError
from rollmux.messages import (
    AbortOutcome, AttachTicket, EventKind, Grant, JobHosting, MovedState, ParallelPlace, PhaseCall, RuntimeEvent,
)
from rollmux.models import pool_of_phase
from rollmux.phase_state import AdmissionRefused, PhaseFailed
from rollmux.records import JobState

log = logging.getLogger("rollmux.runtime")
CONTROLLER_RETRIES = 60  # x 1 s: how long a driver waits for a restarting GroupController
MAX_REHOMES = 4  # moves one permit request follows (re-packing may move a job again before it re-attaches)
WORKER_RECOVERIES = 3  # how many lost workers one phase survives (each: re-host the job, redo the phase)
WORKER_RESTART_S = 120.0  # how long a driver waits for a lost worker to be restarted by Ray
PREEMPT_WAIT_S = 7 * 24 * 3600.0  # how long a preempted job's driver waits to be re-admitted (env ROLLMUX_PREEMPT_WAIT_S)
PREEMPT_POLL_S = 0.5  # how often it asks the scheduler meanwhile


def scheduler_reachable(name: Optional[str] = None) -> bool:
    """True when a Ray cluster is reachable and the GlobalScheduler actor ``name`` exists there."""
    try:
        get_scheduler(name)
        return True
    except Exception:
        return False


_RUNTIME_PACKAGES = {"__main__", "builtins", "rollmux", "actors", "collectives", "serve_app"}


def ship_by_value(objs) -> list[str]:
    """Make cloudpickle ship the user's code (the modules defining ``objs``) by value.

    The per-node workers are shared by jobs submitted with different working directories, so a
    worker may not be able to import a job's own modules (e.g. ``examples.grpo``). Used as a
    fallback when registration fails with an ImportError (by-value pickling does not suit
    every module, e.g. pydantic models defined there, so it is not the default); modules
    outside site-packages / the standard library / RollMux itself are registered with
    ``cloudpickle.register_pickle_by_value``. Returns the registered top-level module names.
    Disabled by env ``ROLLMUX_SHIP_BY_VALUE=0``.
    """
    import inspect
    import sys
    import sysconfig

    from ray import cloudpickle

    if os.environ.get("ROLLMUX_SHIP_BY_VALUE", "1") == "0":
        return []
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"])}
    found: set[str] = set()
    for o in objs:
        if o is None:
            continue
        parts = [o, getattr(o, "func", None)] + [v for v in getattr(o, "__dict__", {}).values() if callable(v)]
        for c in parts:
            if c is None:
                continue
            name = c.__module__ if (inspect.isfunction(c) or inspect.isclass(c)) else type(c).__module__
            top = (name or "").split(".")[0]
            mod = sys.modules.get(top)
            if not top or top in _RUNTIME_PACKAGES or mod is None:
                continue
            path = getattr(mod, "__file__", None) or next(iter(getattr(mod, "__path__", []) or []), None)
            if path is None:
                continue
            path = os.path.realpath(path)
            if "site-packages" in path or "dist-packages" in path or any(path.startswith(r + os.sep) for r in roots):
                continue
            found.add(top)
    for top in sorted(found):
        try:
            cloudpickle.register_pickle_by_value(sys.modules[top])
        except ValueError:
            pass
    return sorted(found)


class ScheduledRuntime:
    """Scheduled mode of a :class:`rollmux.Job` (see module docstring). Reads the job's
    :class:`rollmux.phase_api.JobProgram` (``job.program``); every Ray call goes through
    :mod:`actors.handles`.

    Raises (constructor): AdmissionRefused (refused), PhaseFailed (attach to an unknown job id),
    ValueError (no GlobalScheduler reachable).
    """

    mode = "scheduled"

    def __init__(self, job):
        import ray

        ensure_ray()
        self.job = job
        self.program = job.program
        try:
            self.sched = SchedulerHandle.connect(job.scheduler_name)
        except ActorLost as e:
            raise ValueError(f"scheduled mode: no RollMux GlobalScheduler reachable ({e})") from e
        jid = job.job_id
        self.key = hosted_key(jid, job.scheduler_name)  # what the workers host the job under
        self.driver = ray.get_runtime_context().get_job_id()  # this process's Ray job: its death is seen
        if not job.attach_job_id:
            dec = self.sched.admit(job.spec)
            if not dec.admitted:
                raise AdmissionRefused(dec.to_dict())  # the driver's error: the decision's JSON form
        # one call: the job's record and its group's controller, which already holds its membership
        ticket = self.sched.attach(jid)
        if ticket is None:
            raise PhaseFailed(f"cannot attach: job {jid!r} is not admitted by the RollMux scheduler")
        if ticket.record.state.is_ended():
            raise PhaseFailed(f"cannot attach: job {jid!r} is already {ticket.record.state}")
        self.timeline: list[dict] = []
        self.moves: list[dict] = []  # departure re-packing moves this driver carried out
        self.recoveries: list[dict] = []  # lost workers this driver recovered from
        self.preemptions: list[dict] = []  # preemptions this driver waited out (rollmux.preemption)
        self._seq = {"rollout": 0, "train": 0}  # phases of each pool done (their commits' numbers)
        self._registered = False
        self._register_lock = threading.RLock()
        try:
            self._home(ticket)
            self.attach_info = self.controller.attach(jid, driver=self.driver)  # joins its queues now
        except (PermitError, KeyError):  # moved between reading the record and attaching
            if not self._attach_after_moves():
                raise
        self._stop = threading.Event()
        self._preempted = threading.Event()  # set while preempted: no controller to heartbeat
        self._said_preempted: Optional[float] = None  # at_s of the preemption the log already told
        self._hb = threading.Thread(target=self._heartbeat, name=f"rollmux-heartbeat-{jid}", daemon=True)
        self._hb.start()

    def _attach_after_moves(self) -> bool:
        """Re-packing moved the job before its driver attached (nothing of it is hosted yet, so
        nothing moves with it): re-read its record and attach to the controller it names, waiting
        a reconcile pass when the record and the controllers have not caught up with each other
        (at most :data:`MAX_REHOMES` tries, 0.5 s apart). True once attached."""
        jid = self.job.job_id
        for _ in range(MAX_REHOMES):
            time.sleep(0.5)
            ticket = self.sched.attach(jid)
            if ticket is None or not ticket.record.state.is_active():
                return False
            try:
                self._home(ticket)
                self.attach_info = self.controller.attach(jid, driver=self.driver)
                return True
            except (PermitError, KeyError, ActorLost):  # moved again meanwhile: follow the newer record
                continue
        return False

    def _home(self, ticket: AttachTicket) -> None:
        """Point this driver at the group, controller and node workers of ``ticket``'s record."""
        rec = ticket.record.public()
        if ticket.controller is None:
            raise KeyError(f"job {self.job.job_id!r} has no active group ({rec.get('state')})")
        self.info = rec
        pl = rec["placement"]
        self.rollout_nodes, self.train_nodes = list(pl["rollout_nodes"]), list(pl["train_nodes"])
        self.rollout_workers = [worker_handle(n) for n in self.rollout_nodes]  # rank order
        self.train_workers = [worker_handle(n) for n in self.train_nodes]
        self.rollout_worker, self.train_worker = self.rollout_workers[0], self.train_workers[0]  # the leaders
        self._rollout_worker_names = [worker_name(n) for n in self.rollout_nodes]
        self.controller = ControllerHandle(name=ticket.controller)

    def _rehome(self) -> bool:
        """Departure re-packing moved this job (its permit was refused): follow it.

        Asks the GlobalScheduler for the job's ticket (one round trip, only after a refused
        permit); if its group changed, moves the job's stored state from the old node workers to
        the new ones (``export_job`` -> ``register_job(moved=...)``; resident state stays behind;
        after the export it tells the scheduler ``drained`` with the old group: other groups' jobs
        may now run on the old nodes, :mod:`rollmux.drain`),
        attaches to the new group's controller (created and told first) and returns True. False
        when the job did not move (the refusal stands: failed, departed, out of order).
        """
        jid = self.job.job_id
        ticket = self.sched.attach(jid)
        rec = None if ticket is None else ticket.record.public()
        if rec is not None and JobState(rec["state"]) == JobState.PREEMPTED:
            return self._resume_after_preemption(rec)
        if rec is None or not JobState(rec["state"]).is_active() or rec["group_id"] == self.info["group_id"]:
            return False
        t0 = time.perf_counter()
        old = {"group_id": self.info["group_id"], "rollout_nodes": self.rollout_nodes, "train_nodes": self.train_nodes}
        payload: Optional[dict[str, list[Optional[MovedState]]]] = None
        if self._registered:  # every rank's shard moves: rank i's state goes to the new rank i
            k = len(self.rollout_workers)
            got = gather([w.export_job_nowait(self.key) for w in self.rollout_workers + self.train_workers])
            payload = {"rollout": got[:k], "train": got[k:]}
        # the old workers no longer host it and its old controller refused it (no phase of it runs
        # there): other groups' jobs may now run phases on its old nodes (rollmux.drain)
        try:
            self.sched.report(jid, RuntimeEvent(EventKind.DRAINED, group_id=old["group_id"]), timeout_s=REPORT_TIMEOUT_S)
        except Exception as e:  # the scheduler drains it anyway once overdue (rollmux.drain.drain_overdue)
            log.warning("job %s: could not report its state exported from %s after its move: %s", jid,
                        old["group_id"], e)
        self._home(ticket)
        for k in range(MAX_REHOMES):  # re-packing may move the job on before it attaches: follow it
            try:
                self.attach_info = self.controller.attach(jid, has_sync=self.program.has_sync, driver=self.driver)
                break
            except (PermitError, KeyError, ActorLost):  # moved on, or that group already dissolved
                if k == MAX_REHOMES - 1:
                    raise
                time.sleep(0.2)
                ticket = self.sched.attach(jid)
                if ticket is None or not ticket.record.state.is_active():
                    raise
                rec = ticket.record.public()
                self._home(ticket)  # the exported state (payload) goes to the newest home
        if self._registered:
            self._registered = False
            self._register(moved=payload)
        mv = {"from_group": old["group_id"], "to_group": rec["group_id"], "iteration": self.job.iteration,
              "from_nodes": old["rollout_nodes"] + old["train_nodes"],
              "to_nodes": self.rollout_nodes + self.train_nodes, "handover_s": time.perf_counter() - t0,
              "state_bytes": {p: [None if x is None else x.bytes for x in xs] for p, xs in (payload or {}).items()}}
        self.moves.append(mv)
        self.program.emit({"event": "moved", "job_id": jid, **mv})
        log.info("job %s moved %s -> %s at iteration %d", jid, mv["from_group"], mv["to_group"], mv["iteration"])
        return True

    def _resume_after_preemption(self, rec: dict) -> bool:
        """The job was preempted for a higher class (its group's controller removed it at its
        iteration boundary, so no phase of the next iteration has run): export its state from
        its workers (they are freed: ``export_job`` unregisters it there), tell the scheduler
        (``drained``: the job that preempted it may now run phases on its nodes), wait until the
        scheduler's queue re-admits it (polling its record every ``PREEMPT_POLL_S``, at most
        ``PREEMPT_WAIT_S``), then register the state on the new placement's workers and go on
        where it stopped (as a move: :meth:`_rehome`). False when the job ended meanwhile
        (cancelled); raises PhaseFailed when it is not re-admitted in time."""
        jid = self.job.job_id
        t0 = time.monotonic()
        payload: Optional[dict[str, list[Optional[MovedState]]]] = None
        if self._registered:
            k = len(self.rollout_workers)
            got = gather([w.export_job_nowait(self.key) for w in self.rollout_workers + self.train_workers])
            payload = {"rollout": got[:k], "train": got[k:]}
            self._registered = False
        # its workers no longer host it: the job that preempted it may now run on its nodes
        try:
            self.sched.report(jid, RuntimeEvent(EventKind.DRAINED), timeout_s=REPORT_TIMEOUT_S)
        except Exception as e:  # the scheduler drains it anyway once overdue (rollmux.drain.drain_overdue)
            log.warning("job %s: could not report its state exported after its preemption: %s", jid, e)
        last = (rec.get("preemptions") or [{}])[-1]
        ev = {"iteration": self.job.iteration, "by_job": last.get("by_job"),
              "from_group": getattr(self, "info", {}).get("group_id")}  # (no info: preempted before it attached)
        self.program.emit({"event": "preempted", "job_id": jid, **ev})
        self._preempted.set()  # no controller holds it until it is re-admitted: no heartbeats meanwhile
        self._say_preempted(last)
        wait_s = float(os.environ.get("ROLLMUX_PREEMPT_WAIT_S", PREEMPT_WAIT_S))
        while True:
            ticket = self.sched.attach(jid)
            rec = None if ticket is None else ticket.record.public()
            state = None if rec is None else JobState(rec["state"])
            if state is None or state.is_ended():
                return False
            if state.is_active() and ticket.controller is not None:
                break
            if time.monotonic() - t0 > wait_s:
                raise PhaseFailed(f"job {jid!r} was preempted and not re-admitted within {wait_s:.0f} s "
                                  "(ROLLMUX_PREEMPT_WAIT_S); its state is dropped")
            time.sleep(PREEMPT_POLL_S)
        self._home(ticket)
        self.attach_info = self.controller.attach(jid, has_sync=self.program.has_sync, driver=self.driver)
        self._preempted.clear()  # its new controller's lease from now on
        self._register(moved=payload)
        ev.update(to_group=rec["group_id"], waited_s=time.monotonic() - t0,
                  to_nodes=self.rollout_nodes + self.train_nodes)
        self.preemptions.append(ev)
        self.program.emit({"event": "resumed", "job_id": jid, **ev})
        log.warning("job %s resumed on %s after waiting %.0f s", jid, ev["to_group"], ev["waited_s"])
        return True

    def _say_preempted(self, last: dict) -> None:
        """Log, once per preemption, that the job was preempted and waits (the operator's line;
        ``last``: the record's latest preemption)."""
        if self._said_preempted is not None and self._said_preempted == last.get("at_s"):
            return
        self._said_preempted = last.get("at_s")
        it = last.get("iteration")
        log.warning("job %s preempted by %s at iteration %d; waiting to resume", self.job.job_id,
                    last.get("by_job") or "a higher-class job", self.job.iteration if it is None else it)

    def _preempted_now(self) -> bool:
        """After a refused or failed heartbeat: whether the job was preempted (its record says
        so; one scheduler call). Tells the log once when it was."""
        try:
            ticket = self.sched.attach(self.job.job_id)
        except Exception:  # the scheduler restarting: the heartbeat failure is logged as such
            return False
        if ticket is None or ticket.record.state != JobState.PREEMPTED:
            return False
        self._say_preempted((ticket.record.preemptions or [{}])[-1])
        return True

    def _heartbeat(self) -> None:
        """Driver lease: tell the current GroupController this driver is alive (every HEARTBEAT_S).
        ``self.controller`` changes when the job moves; a refused heartbeat (the job left this
        controller, e.g. moved) does not stop the thread (``finish`` does). A preempted job has no
        controller until it is re-admitted: a refused or failed heartbeat asks its record once,
        and when it was preempted the log says so ("preempted by <job> at iteration i; waiting to
        resume", :meth:`_say_preempted`), not that heartbeats fail."""
        failures, asked, preempted = 0, False, False  # asked: the record was read since the last accepted beat
        while not self._stop.wait(HEARTBEAT_S):
            if self._preempted.is_set():  # waiting to be re-admitted (the main thread sets and clears it)
                continue
            try:
                member = self.controller.heartbeat(self.job.job_id, self.driver)
                failures = 0
                if member is not False:
                    asked = preempted = False
                elif not asked:  # removed by its controller: preempted (or moved)?
                    asked, preempted = True, self._preempted_now()
            except Exception as e:  # controller restarting; keep trying until finish (logged, never silent)
                failures += 1
                if not asked:  # its group may have dissolved with its preemption
                    asked, preempted = True, self._preempted_now()
                if not preempted and (failures in (1, 10) or failures % 100 == 0):
                    log.warning("job %s: heartbeat to its controller failed %d time(s): %s",
                                self.job.job_id, failures, e)

    def _register(self, moved: Optional[dict] = None, recover: bool = False) -> None:
        """Register the job's program on its node workers (one :class:`rollmux.messages.JobHosting`
        per worker; ``moved``: the state each pool's old worker exported, see :meth:`_rehome`;
        ``recover``: a worker was lost, every worker of the job drops what it holds and resumes
        from the job's commits)."""
        with self._register_lock:  # an asynchronous job's two streams may both be first
            self._register_locked(moved, recover)

    def _register_locked(self, moved: Optional[dict], recover: bool) -> None:
        if self._registered:
            return
        j, prog = self.job, self.program
        for pool in ("rollout", "train"):
            prog.builder(pool, j.job_id)  # raises PhaseFailed naming the missing builder

        def register() -> None:
            from ray import cloudpickle  # pickled here, unpickled under the worker's lock

            par = self._parallel_cfgs()
            common = dict(job_id=j.job_id, switch=j.switch, checkpoint_dir=j.checkpoint_dir,
                          admission=self.info.get("admission_id"), sync_backend=j.sync_backend, durable=j.durable,
                          rebuild_resident=j.rebuild_resident, hooks=tuple(prog.hooks), apply=prog.apply,
                          max_staleness=j.spec.max_staleness, staleness_mode=j.spec.staleness_mode)
            calls = [self.controller.configure_job_nowait(j.job_id, has_sync=prog.has_sync)]
            for pool, workers in (("rollout", self.rollout_workers), ("train", self.train_workers)):
                mv = (moved or {}).get(pool) or [None] * len(workers)
                for i, w in enumerate(workers):
                    hosting = JobHosting(builder=prog.builders[pool], phases=prog.phases_of(pool), parallel=par[pool][i],
                                         rollout_workers=tuple(self._rollout_worker_names) if pool == "train" else (),
                                         **common)
                    calls.append(w.register_job_nowait(self.key, cloudpickle.dumps(hosting),
                                                       mv[i] if i < len(mv) else None, recover))
            gather(calls, timeout_s=REGISTER_TIMEOUT_S)

        self.shipped: list[str] = []
        try:
            for attempt in range(MAX_REHOMES + 1):
                try:
                    register()
                    break
                except (ActorLost, PermitError):
                    # re-packing moved the job and its group dissolved before its first registration
                    # (nothing of it is hosted yet): follow its record, register there
                    if moved is not None or recover or attempt == MAX_REHOMES or not self._attach_after_moves():
                        raise
        except Exception as e:  # a shared worker cannot import this job's code: ship it by value
            if not isinstance(e, ImportError) and not isinstance(getattr(e, "cause", None), ImportError):
                raise  # (a RayTaskError that could not take its cause's class keeps it as ``cause``)
            self.shipped = ship_by_value(prog.callables())
            if not self.shipped:
                raise
            log.warning("job %s: workers cannot import %s; shipping it by value", j.job_id, self.shipped)
            register()
        if not recover:
            self.sched.report_nowait(j.job_id, RuntimeEvent(EventKind.RUNNING))
        self._registered = True

    def _parallel_cfgs(self) -> dict[str, list[ParallelPlace]]:
        """Per pool, each worker's SPMD place: rank, world size, the pool's worker names and nodes
        in rank order, the host its gloo groups bind to (127.0.0.1 when every worker of the job is
        on one machine, else each node's IP; env ROLLMUX_SYNC_HOST overrides) and, for a pool with
        several workers, the rendezvous store its rank 0 hosts (the kernel picks its port when it binds;
        none for a job whose sync is ``"counted"``: emulated accelerators move no data)."""
        wh = gather([w.where_nowait() for w in self.rollout_workers + self.train_workers], timeout_s=120)
        one_host = len({x.ip for x in wh}) == 1
        forced = os.environ.get("ROLLMUX_SYNC_HOST")
        k = len(self.rollout_workers)
        out: dict[str, list[ParallelPlace]] = {}
        for pool, nodes, workers, where in (("rollout", self.rollout_nodes, self.rollout_workers, wh[:k]),
                                            ("train", self.train_nodes, self.train_workers, wh[k:])):
            hosts = [forced or ("127.0.0.1" if one_host else x.ip) for x in where]
            # a job on emulated accelerators (sync "counted") has no data plane: no rendezvous store
            rdv = len(workers) > 1 and self.job.sync_backend != "counted"
            addr = workers[0].reserve_store(self.key, hosts[0]) if rdv else None
            out[pool] = [ParallelPlace(rank=i, world_size=len(workers), peers=tuple(worker_name(n) for n in nodes),
                                       nodes=tuple(nodes), addr=addr, host=hosts[i]) for i in range(len(workers))]
        return out

    def _acquire(self, phase: str, index: Optional[int] = None) -> Grant:
        """The controller's permit for ``phase`` of iteration ``index`` (a rollout's own index;
        default the job's iteration; follows a move once; waits for a restarting controller).
        Raises PhaseFailed when it cannot be granted."""
        j = self.job
        it = j.iteration if index is None else index
        rehomes = 0  # moves followed for this permit: re-packing may move the job again meanwhile
        for attempt in range(CONTROLLER_RETRIES + MAX_REHOMES):  # bounded: a restarting controller comes back
            try:
                return self.controller.acquire(j.job_id, phase, iteration=it, has_sync=self.program.has_sync)
            except ActorLost:
                # the controller is gone: the job moved and its old group's controller exited
                # (follow the record), or it is restarting (ask again)
                if rehomes < MAX_REHOMES and self._rehome():
                    rehomes += 1
                    continue
                if attempt >= CONTROLLER_RETRIES - 1:
                    raise PhaseFailed(f"job {j.job_id!r}: the group controller is unavailable") from None
                time.sleep(1.0)
            except PermitError as err:
                if rehomes < MAX_REHOMES and self._rehome():
                    rehomes += 1  # moved by re-packing: retry on the new group (which may move it again)
                    continue
                raise PhaseFailed(str(err)) from None
            except Exception as err:  # the controller refused otherwise (e.g. no permit in time)
                raise PhaseFailed(str(err)) from None
        raise PhaseFailed(f"job {j.job_id!r}: the group controller is unavailable")  # pragma: no cover

    def _wait_workers(self, deadline: float) -> None:
        """Until every worker of the job answers (Ray restarts a lost one: ``max_restarts=-1``).
        Raises PhaseFailed naming the node whose worker did not come back."""
        for node, w in zip(self.rollout_nodes + self.train_nodes, self.rollout_workers + self.train_workers):
            while True:
                try:
                    w.where(timeout_s=max(1.0, min(10.0, deadline - time.monotonic())))
                    break
                except Exception as e:
                    if time.monotonic() > deadline:
                        raise PhaseFailed(f"worker on {node} was lost and did not come back within "
                                          f"{WORKER_RESTART_S:.0f} s ({type(e).__name__}); the job's committed "
                                          "state is kept on disk but the job cannot go on without that node") from None
                    time.sleep(0.5)

    def _recover(self, phase: str, reason: str) -> AbortOutcome:
        """A worker of the job was lost during ``phase``: wait for Ray to restart it, re-host the
        job on every one of its workers from its last commits and withdraw the interrupted
        permit. Returns the controller's answer (``aborted`` / ``none``: redo the phase;
        ``done``: it was released before the loss, replay its committed result)."""
        t0 = time.monotonic()
        self._wait_workers(t0 + WORKER_RESTART_S)
        self._registered = False
        self._register(recover=True)
        status = AbortOutcome.NONE
        for attempt in range(CONTROLLER_RETRIES):
            try:
                status = self.controller.abort_phase(self.job.job_id, phase, reason)
                break
            except Exception as e:
                if isinstance(e, PermitError) or attempt == CONTROLLER_RETRIES - 1:
                    raise PhaseFailed(f"{reason}; the job could not resume: {e}") from None
                time.sleep(1.0)
        self.recoveries.append({"phase": phase, "iteration": self.job.iteration, "reason": reason,
                                "controller": str(status), "recovery_s": time.monotonic() - t0})
        self.program.emit({"event": "recovered", "job_id": self.job.job_id, "phase": phase, **self.recoveries[-1]})
        log.warning("job %s: %s; re-hosted from its last commit (%s) in %.1f s", self.job.job_id, reason, status,
                    time.monotonic() - t0)
        return status

    def run(self, phase: str, args: tuple, kwargs: dict, index: Optional[int] = None) -> Any:
        """acquire -> worker.run (the leader worker, the grant's releaser, releases the permit)
        -> the phase's result. ``index``: the phase's iteration index (a rollout's own; default
        the job's iteration).

        A lost worker (it died, or restarted without the job) does not fail the job: the job is
        re-hosted from its last commit on every one of its workers and the phase is redone from
        its start (:meth:`_recover`; at most ``WORKER_RECOVERIES`` times per phase), so the
        iteration either completes or is redone, never half-applied.

        Raises the phase's own exception, PhaseFailed when the permit cannot be granted or a
        lost worker's job cannot be recovered (saying which worker and why).
        """
        self._register()
        j = self.job
        pool = pool_of_phase(phase)
        leader_node = (self.rollout_nodes if pool == "rollout" else self.train_nodes)[0]
        seq = self._seq[pool] + 1
        replay = False
        grant: Optional[Grant] = None
        for attempt in range(WORKER_RECOVERIES + 1):
            if not replay:  # a replay uses the grant of the run that was released before the loss
                grant = self._acquire(phase, index)
                j.core.granted(phase, grant.iteration, nodes=list(grant.nodes), waited_s=grant.waited_s)
            worker = self.rollout_worker if pool == "rollout" else self.train_worker
            try:
                out = worker.run(self.key, PhaseCall(grant, seq, replay, args=tuple(args), kwargs=dict(kwargs)))
                break
            except (WorkerLost, JobNotHosted) as err:
                if isinstance(err, WorkerLost) and not err.recoverable:
                    raise
                reason = f"worker on {leader_node} was lost during {phase}" if isinstance(err, JobNotHosted) else str(err)
            except ActorLost as e:
                reason = f"worker on {leader_node} was lost during {phase} ({e.kind})"
            if not j.durable:
                raise PhaseFailed(f"{reason}; the job keeps no committed state (durable=False), so its state "
                                  "went with the worker") from None
            if attempt == WORKER_RECOVERIES:
                raise PhaseFailed(f"{reason}; gave up after {WORKER_RECOVERIES} recoveries in one phase") from None
            replay = self._recover(phase, reason) == AbortOutcome.DONE
        self._seq[pool] = seq
        # granted_at -> start: the phase's dispatch; waited_s: how long the driver waited for the permit
        rec = dict(out.record.to_dict(), job_id=j.job_id, phase=phase, pool=pool, iteration=grant.iteration,
                   granted_at=None if replay else grant.granted_at, waited_s=0.0 if replay else grant.waited_s)
        self.timeline.append(rec)
        if phase == "sync":
            return None
        res = out.result
        ranks = len(self.rollout_workers if pool == "rollout" else self.train_workers)
        if ranks > 1:  # the ranks' results in rank order: combined by the job's gather function
            return self.program.gather(phase, res)
        return res

    def finish(self, ok: bool, error: Optional[str]) -> None:
        """Report finished / failed to the scheduler (departure releases the job's nodes), with the
        driver's final iteration count (the owner's value: the ended record is exact even when
        the controller's last progress report is still on its way)."""
        self._stop.set()
        event = RuntimeEvent(EventKind.FINISHED if ok else EventKind.FAILED, error=error,
                             iterations_done=self.job.iteration)
        try:
            self.sched.report(self.job.job_id, event, timeout_s=REPORT_TIMEOUT_S)
        except Exception as e:  # the scheduler restarts: it will see the departure from the controller
            log.warning("could not report %s of %s: %s", "finish" if ok else "failure", self.job.job_id, e)
        try:  # waited for: the job's control plane (process groups, engines) is gone when this returns
            sent = [w.unregister_job_nowait(self.key) for w in self.rollout_workers + self.train_workers]
            gather([p for p in sent if p is not None], timeout_s=60)
        except Exception as e:
            log.warning("could not unregister %s from its workers: %s", self.job.job_id, e)

    def permit_backend(self):
        """Driver-side permits (framework integrations, ``Job.permit``) through this job's
        GroupController: :class:`actors.driver.permits.DriverPermits`."""
        from actors.driver.permits import DriverPermits

        return DriverPermits(self)

    def group_timeline(self) -> list[dict]:
        """The whole group's timeline (every member's phases) from its GroupController, as
        :meth:`rollmux.messages.TimelineEntry.to_dict` rows (the driver's own timeline's form)."""
        return [e.to_dict() for e in self.controller.timeline(timeout_s=None)]


def group_timeline(job) -> list[dict]:
    """The co-execution group's timeline of a scheduled :class:`rollmux.Job` (its own in plain mode)."""
    rt = job.runtime
    return rt.group_timeline() if isinstance(rt, ScheduledRuntime) else job.timeline
