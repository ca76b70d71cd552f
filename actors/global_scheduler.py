"""GlobalScheduler: the single owner of RollMux's group table on a Ray cluster (RollMux §4.2, §5).

One named, detached actor (``rollmux-global-scheduler`` in namespace ``rollmux``, get-if-exists,
``max_restarts=-1``). It admits jobs by calling the policy (:class:`rollmux.admission.
InterGroupScheduler`, Alg. 1; no second copy here), creates one named GroupController per
co-execution group (lazily, when its first driver attaches: ``ensure_controller``), tracks each job's lifecycle (admitted -> running -> finished | failed) and
releases nodes on departure or failure. After a departure it calls the policy's departure
re-packing (``InterGroupScheduler.repack``) and carries out the moves it commits: the moved jobs'
records (``group_id``, ``placement``, ``controller``, ``moves``) are checkpointed, then the old
group's controller drops the job at its iteration boundary and the new one learns it; the job's
driver follows on its next permit (:meth:`actors.runtime_client.ScheduledRuntime._rehome`).

Fault tolerance (Ray Serve controller pattern, STYLE.md §3): the *target state* (job records +
``InterGroupScheduler.snapshot()`` + controller names) is checkpointed to a KV store
(:mod:`actors.kv`; Ray GCS internal KV by default, a file directory with ``checkpoint_path``)
*before* acting on controllers. A restarted actor restores the checkpoint and re-finds the named,
detached GroupControllers (re-creating and re-populating any that are gone). No admitted job is
lost when the actor dies.

Contract (docs/ARCHITECTURE.md "GlobalScheduler actor contract"): every method returns
JSON-able dicts / lists; refusals are values (``admitted: False`` with ``code``), not exceptions.
Codes besides the policy's (ok | never | retry_later): ``invalid`` (spec fails validation) and
``duplicate`` (the job id is already admitted or running).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from pydantic import ValidationError

from rollmux.models import ClusterSpec, JobSpec
from rollmux.nodes import node_index

log = logging.getLogger("rollmux.scheduler")

from actors import NAMESPACE  # noqa: E402  (re-exported)
SCHEDULER_NAME = "rollmux-global-scheduler"
CHECKPOINT_VERSION = 1
MAX_FINISHED_RECORDS = 5000
ACTIVE = ("admitted", "running")
PROGRESS_CHECKPOINT_S = 2.0  # iteration progress (soft state) is checkpointed at most this often


def _group(igs, gid: str):
    """The policy's group ``gid`` or None (no full-table copy)."""
    try:
        return igs.group(gid)
    except KeyError:
        return None


def _groups(igs) -> dict[str, Any]:
    g = igs.groups
    if isinstance(g, dict):
        return dict(g)
    return {x.group_id: x for x in g}


class GlobalSchedulerImpl:
    """The scheduler's logic (plain class, wrapped by :func:`get_or_create_scheduler`).

    Args:
        cluster: the cluster spec (dict or :class:`ClusterSpec`).
        checkpoint_path: directory for a :class:`actors.kv.FileKV`; ``None`` uses Ray's GCS KV.
        name: this actor's name (checkpoint key and controller-name prefix).
        config: the scheduler settings (:class:`rollmux.admission.SchedulerConfig` or its dict);
            default ``configs/scheduler.yaml`` (tie-break, long-tail migration, departure
            re-packing, ...). Raises :class:`rollmux.config.ConfigError` for a bad file.
        policy / max_group_size / seed: override the config's values when given.
        kv: an explicit :class:`actors.kv.KVStore` (unit tests: ``MemoryKV``).
        create_controllers: False for unit tests without Ray (no GroupControllers).
        controller_kw: keyword arguments of new GroupControllers (e.g. ``lease_s``, ``migrate``).
        repack_on_departure: overrides ``SchedulerConfig.repack_on_departure`` when given. The
            whole config is kept in the checkpoint (a restored scheduler keeps its settings).
    """

    def __init__(self, cluster: dict | ClusterSpec, checkpoint_path: Optional[str] = None, *,
                 name: str = SCHEDULER_NAME, policy: Optional[str] = None, max_group_size: Optional[int] = None,
                 seed: Optional[int] = None, kv=None, create_controllers: bool = True, metrics_flush_s: float = 1.0,
                 controller_kw: Optional[dict] = None, repack_on_departure: Optional[bool] = None,
                 config: Optional[dict] = None):
        from actors.kv import make_kv
        from actors.metrics import RollmuxMetrics
        from rollmux.admission import InterGroupScheduler

        self.cluster = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.model_validate(cluster)
        self.name = name
        self.kv = kv if kv is not None else make_kv(checkpoint_path, namespace=NAMESPACE)
        self.key = f"{name}.meta"  # header; groups under <name>.g.<gid>, jobs under <name>.j.<job_id>
        self.create_controllers = create_controllers
        self.controller_kw = dict(controller_kw or {})
        self.metrics = RollmuxMetrics(flush_interval_s=metrics_flush_s, enabled=create_controllers)
        overrides = {k: v for k, v in {"policy": policy, "max_group_size": max_group_size, "seed": seed,
                                       "repack_on_departure": repack_on_departure}.items() if v is not None}
        self.jobs: dict[str, dict] = {}
        self.controllers: dict[str, str] = {}  # group_id -> actor name
        self._handles: dict[str, Any] = {}
        self.restored = False
        self._last_checkpoint = 0.0
        meta = self.kv.get(self.key)
        if meta and meta.get("version") == CHECKPOINT_VERSION:
            self._restore(meta)
            self._refind_controllers()
        else:
            from rollmux.admission import SchedulerConfig, load_scheduler_config

            base = load_scheduler_config() if config is None else SchedulerConfig.model_validate(config)
            cfg = SchedulerConfig.model_validate({**base.model_dump(), **overrides})
            self.igs = InterGroupScheduler(self.cluster, policy=cfg.policy, max_group_size=cfg.max_group_size,
                                           seed=cfg.seed, config=cfg)
            snap = self.igs.snapshot()
            self._header = {k: v for k, v in snap.items() if k != "groups"}
            self._checkpoint()
        # new GroupControllers carry the config's long-tail settings; explicit controller_kw wins
        self.controller_kw = {**self.igs.config.controller_settings(), **self.controller_kw}

    # ---- checkpoint (incremental: only the changed job records and groups are rewritten)
    def _gkey(self, gid: str) -> str:
        return f"{self.name}.g.{gid}"

    def _jkey(self, job_id: str) -> str:
        return f"{self.name}.j.{job_id}"

    def _group_entry(self, gid: str) -> Optional[dict]:
        """One group in ``InterGroupScheduler.snapshot()``'s format (None once dissolved)."""
        g = _group(self.igs, gid)
        if g is None:
            return None
        return {"group_id": gid, "rollout_nodes": list(g.rollout_nodes), "train_nodes": list(g.train_nodes),
                "members": [m.model_dump(mode="json") for m in g.members]}

    def _checkpoint(self, jobs: tuple = (), groups: tuple = ()) -> None:
        """Write the target state: the given job records and groups, then the header (group ids,
        next group number, controllers). Records of finished jobs beyond MAX_FINISHED_RECORDS are
        dropped. Crash between writes: see :meth:`_restore` (an uncommitted job is marked failed)."""
        self._last_checkpoint = time.time()
        done = [j for j, r in self.jobs.items() if r["state"] not in ACTIVE]
        for j in done[: max(0, len(done) - MAX_FINISHED_RECORDS)]:
            del self.jobs[j]
            self.kv.delete(self._jkey(j))
        for j in jobs:
            if j in self.jobs:
                self.kv.put(self._jkey(j), self.jobs[j])
        for gid in groups:
            entry = self._group_entry(gid)
            if entry is None:
                self.kv.delete(self._gkey(gid))
            else:
                self.kv.put(self._gkey(gid), entry)
        nxt = getattr(self.igs, "_next_group", None)  # the policy's group counter (ids never reused)
        if nxt is not None:
            self._header["next_group"] = int(nxt)
        self.kv.put(self.key, {"version": CHECKPOINT_VERSION, "snapshot": self._header,
                               "group_ids": [g.group_id for g in self.igs.groups], "controllers": self.controllers,
                               "t": time.time()})

    def _restore(self, meta: dict) -> None:
        """Rebuild the group table and job records from the checkpoint (RollMux fault tolerance).

        Jobs whose admission was not committed to the table before a crash are marked failed."""
        from rollmux.admission import InterGroupScheduler

        self._header = dict(meta["snapshot"])
        groups = [g for g in (self.kv.get(self._gkey(gid)) for gid in meta["group_ids"]) if g]
        self.igs = InterGroupScheduler.restore(self.cluster, {**self._header, "groups": groups})
        self.controllers = dict(meta.get("controllers", {}))
        prefix = f"{self.name}.j."
        for key in self.kv.keys(prefix):
            rec = self.kv.get(key)
            if rec:
                self.jobs[rec["job_id"]] = rec
        members = {m["spec"]["job_id"] for g in groups for m in g["members"]}
        for jid, rec in self.jobs.items():
            if rec["state"] in ACTIVE and jid not in members:
                rec.update(state="failed", error="lost: admission not committed before a scheduler restart",
                           ended_at=time.time())
                self.kv.put(self._jkey(jid), rec)
        self.jobs = dict(sorted(self.jobs.items(), key=lambda kv: kv[1].get("admitted_at") or 0.0))
        self.restored = True

    # ---- controllers (every Ray call to a controller goes through here)
    def _controller(self, group_id: str, create: bool = True):
        if not self.create_controllers:
            return None
        import ray

        from actors.group_controller import controller_name, create_controller

        name = self.controllers.get(group_id) or controller_name(group_id, self.name)
        h = self._handles.get(group_id)
        if h is None:
            try:
                h = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                if not create:
                    return None
                h = create_controller(group_id, self.name, **self.controller_kw)
            self._handles[group_id] = h
        self.controllers[group_id] = name
        return h

    def _refind_controllers(self) -> None:
        """After a restart: re-find each active group's controller; re-add members it lacks.
        Moves are replayed (idempotent): the last move of each active job is carried out again,
        so a crash between the checkpoint and the controllers' update loses no move."""
        import ray

        for rec in [r for r in self.jobs.values() if r["state"] in ACTIVE and r.get("moves")]:
            last = rec["moves"][-1]
            self._carry_out_move(rec["job_id"], last["from_group"], last["to_group"])
        for g in [g for g in self._handles if _group(self.igs, g) is None]:
            self._handles.pop(g, None)
        for gid, members in self._active_by_group().items():
            h = self._controller(gid, create=False)  # created lazily when a driver attaches
            if h is None:
                continue
            for rec in members:
                pl = rec["placement"]
                ray.get(h.add_job.remote(rec["job_id"], pl["rollout_nodes"], pl["train_nodes"], slo=rec["slo"]))

    def group_members(self, group_id: str) -> list[dict]:
        """Active members of a group: ``job_id, rollout_nodes, train_nodes, slo`` (admission order)."""
        return [{"job_id": r["job_id"], "rollout_nodes": r["placement"]["rollout_nodes"],
                 "train_nodes": r["placement"]["train_nodes"], "slo": r["slo"]}
                for r in self._active_by_group().get(group_id, [])]

    def ensure_controller(self, group_id: str) -> str:
        """Create (if needed) the group's GroupController with every active member; its name.

        Controllers are created lazily, when a job's driver attaches, so admissions that never run
        (HTTP what-if traffic, benchmarks) start no actors. Raises KeyError for an unknown group."""
        import ray

        members = self._active_by_group().get(group_id)
        if not members:
            raise KeyError(f"no active job in group {group_id!r}")
        h = self._controller(group_id)
        ray.get([h.add_job.remote(r["job_id"], r["placement"]["rollout_nodes"], r["placement"]["train_nodes"],
                                  slo=r["slo"]) for r in members])
        self._checkpoint()  # header: controller names
        return self.controllers[group_id]

    def _active_by_group(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for rec in self.jobs.values():
            if rec["state"] in ACTIVE and rec.get("group_id"):
                out.setdefault(rec["group_id"], []).append(rec)
        return out

    # ---- admission
    def admit(self, spec: dict, dry_run: bool = False) -> dict:
        """Admit (or, with ``dry_run``, only evaluate) a job: ``AdmissionDecision.to_dict()``.

        On admission the job record is checkpointed, then its group's controller is created (if
        new) and the job is added to the controller's queues. Source: RollMux §4.2, Alg. 1.
        """
        t0 = time.perf_counter()
        try:
            job = JobSpec.model_validate(spec)
        except ValidationError as e:
            jid = spec.get("job_id") if isinstance(spec, dict) else None
            return self._refusal(jid, "invalid", f"invalid job spec: {e}", t0, dry_run)
        old = self.jobs.get(job.job_id)
        if old is not None and old["state"] in ACTIVE:
            return self._refusal(job.job_id, "duplicate", f"job {job.job_id!r} is already {old['state']}", t0, dry_run)
        decision = self.igs.decide(job)
        out = decision.to_dict()
        if dry_run or not out.get("admitted"):
            if not dry_run:
                self.metrics.admission(out.get("code", "refused"), out.get("latency_ms", 0.0))
            return out
        grp = self.igs.commit(decision)
        gid = out["group_id"] = grp.group_id if grp is not None else out["group_id"]
        member = self._member(gid, job.job_id)
        prof = member.profile if member is not None else None
        self.jobs[job.job_id] = {
            "job_id": job.job_id, "state": "admitted", "group_id": gid,
            "placement": {"rollout_nodes": list(out["placement"]["rollout_nodes"]),
                          "train_nodes": list(out["placement"]["train_nodes"])},
            "slo": job.slo, "iterations_done": 0,
            "predicted": None if prof is None else {"t_roll_s": prof.t_roll_s, "t_train_s": prof.t_train_s,
                                                    "t_sync_s": prof.t_sync_s, "t_solo_s": prof.t_solo_s},
            "predicted_slowdown": (out.get("predicted_slowdowns") or {}).get(job.job_id),
            "measured": None, "slowdown": None, "error": None,
            "admitted_at": time.time(), "ended_at": None,
            "controller": self._controller_name(gid),
        }
        self.controllers[gid] = self._controller_name(gid)
        self._checkpoint(jobs=(job.job_id,), groups=(gid,))  # target state first, then act
        h = self._handles.get(gid)  # an existing group's controller learns the newcomer (no lookup)
        if h is not None:
            import ray

            pl = self.jobs[job.job_id]["placement"]
            ray.get(h.add_job.remote(job.job_id, pl["rollout_nodes"], pl["train_nodes"], slo=job.slo))
        self.metrics.admission("admitted", out.get("latency_ms", (time.perf_counter() - t0) * 1e3))
        self.metrics.job(job.job_id, slo=job.slo, iterations=0)
        self._cost_metrics(gid)
        out["latency_ms"] = out.get("latency_ms", (time.perf_counter() - t0) * 1e3)
        return out

    def _controller_name(self, gid: str) -> str:
        from actors.group_controller import controller_name

        return self.controllers.get(gid) or controller_name(gid, self.name)

    def _member(self, gid: str, job_id: str):
        g = _group(self.igs, gid)
        for m in getattr(g, "members", ()):
            if m.spec.job_id == job_id:
                return m
        return None

    def _refusal(self, job_id, code: str, reason: str, t0: float, dry_run: bool) -> dict:
        ms = (time.perf_counter() - t0) * 1e3
        if not dry_run:
            self.metrics.admission(code, ms)
        return {"job_id": job_id, "admitted": False, "code": code, "reason": reason, "group_id": None,
                "strategy": None, "placement": None, "delta_usd_per_h": None, "predicted_slowdowns": {},
                "candidates": [], "pruned": [], "latency_ms": ms}

    def _cost_metrics(self, gid: str) -> None:
        g = _group(self.igs, gid)
        if g is not None:
            self.metrics.group_cost(gid, g.cost_usd_per_h(self.cluster))

    # ---- departure / lifecycle
    def depart(self, job_id: str) -> Optional[dict]:
        """The job leaves its group (finished, or removed by an operator): nodes are released.

        Returns ``{job_id, released_nodes, group_dissolved, moves}`` (``moves``: the departure
        re-packing moves carried out, ``{job_id, from_group, to_group, placement, move_s}``);
        None for an unknown job id.
        """
        return self._end(job_id, "finished", None)

    def _end(self, job_id: str, state: str, error: Optional[str]) -> Optional[dict]:
        """Departure or failure of ``job_id``: the policy releases its nodes, then re-packs
        (:meth:`rollmux.admission.InterGroupScheduler.repack`, departure re-packing) and the moves
        it committed are carried out: records and checkpoint first (target state), then the
        controllers (:meth:`_carry_out_move`). ``released_nodes`` is the net set of nodes the
        cluster no longer uses (the departed job's and those of groups dissolved by moves);
        ``dissolved_groups`` every group that ceased to exist (``group_dissolved``: the job's own).
        A job that already ended gets ``already_ended: True`` and its ``state`` (nothing changes)."""
        rec = self.jobs.get(job_id)
        if rec is None:
            return None
        if rec["state"] not in ACTIVE:
            return {"job_id": job_id, "state": rec["state"], "already_ended": True, "released_nodes": [],
                    "group_dissolved": False, "dissolved_groups": [], "moves": []}
        gid = rec["group_id"]
        before = self._nodes_in_use()
        self.igs.depart(job_id)
        try:
            moves = list(self.igs.repack(gid))
        except Exception:  # the policy rolls a failed attempt back; the departure itself stands
            log.exception("departure re-packing after %s failed; no job moved", job_id)
            moves = []
        released = sorted(before - self._nodes_in_use(), key=lambda n: (n.split("-")[0], node_index(n)))
        dissolved = _group(self.igs, gid) is None
        now = time.time()
        rec.update(state=state, error=error, ended_at=now)
        self.metrics.job_ended(job_id)
        for mv in moves:  # target state: the moved jobs' records follow the policy's table
            r = self.jobs[mv["job_id"]]
            to = mv["to_group"]
            r.update(group_id=to, placement={"rollout_nodes": list(mv["placement"]["rollout_nodes"]),
                                             "train_nodes": list(mv["placement"]["train_nodes"])},
                     controller=self._controller_name(to))
            self.controllers[to] = r["controller"]
            try:  # the policy's prediction in the new group (cached by the commit)
                r["predicted_slowdown"] = self.igs.group_stats(to)["predicted_slowdowns"].get(mv["job_id"])
            except (AttributeError, KeyError):
                pass
            r.setdefault("moves", []).append({"from_group": mv["from_group"], "to_group": to, "at": now,
                                              "move_s": mv.get("move_s"), "trigger": job_id})
        touched = list(dict.fromkeys([gid] + [g for mv in moves for g in (mv["from_group"], mv["to_group"])]))
        self._checkpoint(jobs=(job_id, *[mv["job_id"] for mv in moves]), groups=tuple(touched))
        h = self._handles.get(gid)
        if h is not None:
            import ray

            try:
                ray.get(h.remove_job.remote(job_id, "failed" if state == "failed" else "departed"), timeout=30)
            except Exception as e:  # the controller is soft state
                log.warning("controller of %s: remove_job(%s) failed: %s", gid, job_id, e)
        for mv in moves:
            self._carry_out_move(mv["job_id"], mv["from_group"], mv["to_group"])
        self.metrics.job_moves(len(moves))
        for g in touched:
            if _group(self.igs, g) is None:
                self.metrics.group_dissolved(g)
                self._handles.pop(g, None)
            else:
                self._cost_metrics(g)
        return {"job_id": job_id, "state": state, "released_nodes": released, "group_dissolved": dissolved,
                "dissolved_groups": [g for g in touched if _group(self.igs, g) is None],
                "moves": [{"job_id": mv["job_id"], "from_group": mv["from_group"], "to_group": mv["to_group"],
                           "placement": mv["placement"], "move_s": mv.get("move_s"), "at": now, "trigger": job_id}
                          for mv in moves]}

    def _nodes_in_use(self) -> set[str]:
        return {n for g in _groups(self.igs).values() for n in (*g.rollout_nodes, *g.train_nodes)}

    def _carry_out_move(self, job_id: str, from_group: str, to_group: str) -> None:
        """Tell the controllers about a committed move (their state is soft; the checkpointed
        records are the truth). The old group's controller drops the job with reason
        ``"moved to <group>"``, effective at the job's iteration boundary (a running iteration
        finishes there, see ``GroupController.remove_job``); the new group's controller, if it
        exists, learns the member (pending until the driver re-attaches; otherwise
        ``ensure_controller`` creates it then). Idempotent (also used after a restart)."""
        if not self.create_controllers:
            return
        import ray

        rec = self.jobs[job_id]
        old = self._controller(from_group, create=False)  # the cached handle, else a lookup by name
        if old is not None:
            try:
                ray.get(old.remove_job.remote(job_id, f"moved to {to_group}"), timeout=30)
            except Exception as e:
                log.warning("controller of %s: remove_job(%s, moved) failed: %s", from_group, job_id, e)
        new = self._controller(to_group, create=False)
        if new is not None:
            pl = rec["placement"]
            try:
                ray.get(new.add_job.remote(job_id, pl["rollout_nodes"], pl["train_nodes"], slo=rec["slo"]), timeout=30)
            except Exception as e:
                log.warning("controller of %s: add_job(%s) failed: %s", to_group, job_id, e)

    def report(self, job_id: str, event: dict) -> Optional[dict]:
        """Runtime events: ``running``, ``iteration`` (iterations_done, t_iter_s, t_solo_s,
        slowdown), ``finished`` (departure), ``failed`` (error; departure). Returns the job record."""
        rec = self.jobs.get(job_id)
        if rec is None:
            return None
        kind = event.get("event")
        if kind == "running" and rec["state"] == "admitted":
            rec["state"] = "running"
            self._checkpoint(jobs=(job_id,))
        elif kind == "iteration":  # also after the end: events from controller and driver may cross
            if rec["state"] == "admitted":
                rec["state"] = "running"
            rec["iterations_done"] = max(rec["iterations_done"], int(event.get("iterations_done", 0)))
            n = rec["iterations_done"]
            m = rec["measured"] or {"t_iter_s": 0.0, "t_solo_s": 0.0}
            for k in ("t_iter_s", "t_solo_s"):  # running means over iterations
                if event.get(k) is not None:
                    m[k] = m[k] + (float(event[k]) - m[k]) / max(1, n)
            rec["measured"] = m
            rec["slowdown"] = event.get("slowdown")
            self.metrics.job(job_id, iterations=n, slowdown=rec["slowdown"])
            if time.time() - self._last_checkpoint > PROGRESS_CHECKPOINT_S:
                self._checkpoint(jobs=(job_id,))
        elif kind in ("finished", "failed"):
            if event.get("iterations_done") is not None:
                rec["iterations_done"] = max(rec["iterations_done"], int(event["iterations_done"]))
            self._end(job_id, kind, None if kind == "finished" else (event.get("error") or "failed"))
        return self._public(rec)

    # ---- queries
    @staticmethod
    def _public(rec: dict) -> dict:
        return dict(rec)

    def list_jobs(self) -> list[dict]:
        return [self._public(r) for r in self.jobs.values()]

    def get_job(self, job_id: str) -> Optional[dict]:
        r = self.jobs.get(job_id)
        return None if r is None else self._public(r)

    def list_groups(self) -> list[dict]:
        """Groups: members, nodes, Cost(G) USD/h, T_cycle, T_load and slack (T_cycle - T_load)."""
        from rollmux.intra_group import t_cycle, t_load

        out = []
        for gid, g in _groups(self.igs).items():
            tc, tl = t_cycle(g), t_load(g)
            out.append({"group_id": gid, "members": list(g.job_ids), "rollout_nodes": list(g.rollout_nodes),
                        "train_nodes": list(g.train_nodes), "cost_usd_per_h": g.cost_usd_per_h(self.cluster),
                        "t_cycle_s": tc, "t_load_s": tl, "slack_s": tc - tl,
                        "controller": self._controller_name(gid)})
        return out

    def health(self) -> dict:
        return {"ok": True, "jobs": sum(r["state"] in ACTIVE for r in self.jobs.values()),
                "groups": len(_groups(self.igs)), "restored": self.restored, "name": self.name}

    def group_timeline(self, group_id: str) -> list[dict]:
        """The timeline recorded by a group's controller (also after the group dissolved)."""
        import ray

        h = self._controller(group_id, create=False)
        return [] if h is None else ray.get(h.get_timeline.remote())

    def cluster_spec(self) -> dict:
        return self.cluster.model_dump(mode="json")


def get_or_create_scheduler(cluster: Optional[ClusterSpec | dict] = None, *, checkpoint_path: Optional[str] = None,
                            name: str = SCHEDULER_NAME, **kw):
    """The named, detached GlobalScheduler (created if absent; ``max_restarts=-1``).

    ``cluster`` defaults to ``configs/cluster_local.yaml``. Connects to Ray (``RAY_ADDRESS`` or
    ``auto``) if this process is not connected. Extra ``kw`` (policy, max_group_size, seed) go to
    the constructor. Returns the actor handle.
    """
    import ray

    from actors.runtime_client import control_plane_resources, ensure_ray

    ensure_ray()
    if cluster is None:
        from rollmux.config import CONFIG_DIR, load_cluster

        cluster = load_cluster(CONFIG_DIR / "cluster_local.yaml")
    spec = cluster.model_dump(mode="json") if isinstance(cluster, ClusterSpec) else cluster
    cls = ray.remote(GlobalSchedulerImpl)
    return cls.options(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
                       resources=control_plane_resources(), max_restarts=-1, max_task_retries=0).remote(spec, checkpoint_path, name=name, **kw)


def get_scheduler(name: Optional[str] = None):
    """Handle of the running GlobalScheduler. Raises ValueError when it does not exist."""
    import ray

    from actors.runtime_client import ensure_ray

    ensure_ray()
    return ray.get_actor(name or SCHEDULER_NAME, namespace=NAMESPACE)


# The actor class under its contract name (wrap with ray.remote, or use get_or_create_scheduler).
GlobalScheduler = GlobalSchedulerImpl
