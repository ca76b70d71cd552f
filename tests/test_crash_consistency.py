"""Crash consistency of the GlobalScheduler's checkpoint, by fault injection.

The scheduler is "killed" (a ``BaseException`` raised from the store, like the process dying
mid-call) at every checkpoint write of admit, depart, move (a departure re-packing), fail,
expire and progress, on the memory, file and (marked ``ray``) GCS stores, and restarted from the
store. After each: the restored state is the state before or after the operation, never in
between; no ghost member; no node in two groups; DELETE and re-admission answer correctly;
the total cost is the policy's cost of the restored groups. Plus: a corrupt, truncated or
half-missing checkpoint refuses to start (naming the file), a failed write rolls back, long
keys, retries and timed-out admissions.
"""

from __future__ import annotations

import asyncio
import inspect

import json
import time

import pytest

from actors.scheduler.checkpoint import CheckpointError
from actors.scheduler.kv import FileKV, KVStore, MemoryKV, RayInternalKV
from actors.scheduler.job_store import JobStore
from rollmux.admission import InterGroupScheduler
from actors.handles import SchedulerHandle, WorkerHandle
from factories import InProcessWorker, unit_kw
from rollmux.messages import EventKind, PendingWeights, ProgressReport, RuntimeEvent
from rollmux.config import CONFIG_DIR, load_cluster

PAPER = load_cluster(CONFIG_DIR / "cluster_paper.yaml")


class Crash(BaseException):
    """The scheduler process died (not an ``Exception``: nothing in it may catch this)."""


class CrashKV(KVStore):
    """Passes through to ``inner``; raises :class:`Crash` instead of the ``at``-th write
    (put or delete) counted from :meth:`arm`."""

    def __init__(self, inner: KVStore) -> None:
        self.inner, self.at, self.n = inner, None, 0

    def arm(self, at: int) -> None:
        self.at, self.n = at, 0

    def _write(self, what: str) -> None:
        if self.at is not None:
            self.n += 1
            if self.n == self.at:
                raise Crash(what)

    def get(self, key):
        return self.inner.get(key)

    def keys(self, prefix=""):
        return self.inner.keys(prefix)

    def put(self, key, value):
        self._write(f"put {key}")
        self.inner.put(key, value)

    def delete(self, key):
        self._write(f"delete {key}")
        self.inner.delete(key)


def spec(job_id: str, t_roll: float, t_train: float, **kw) -> dict:
    return {"job_id": job_id, "model_params_b": 7, "slo": 2.0,
            "measured": {"t_roll_s": t_roll, "t_train_s": t_train, "t_sync_s": 3}, **kw}


SPECS = {"a": spec("a", 100, 40), "b": spec("b", 40, 100), "c": spec("c", 100, 40), "d": spec("d", 40, 100)}


def sched(kv, **kw):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl

    return GlobalSchedulerImpl(PAPER, kv=kv, **unit_kw(), metrics_flush_s=0,
                               config={"attach_timeout_s": 60.0}, **kw)


def scenario(kv):
    """group-0 = {a, b}, group-1 = {c}; a and b running, b with 3 iterations. Departing ``a``
    moves ``b`` into group-1 (departure re-packing)."""
    g = sched(kv)
    for j in "abc":
        assert g.admit(SPECS[j]).admitted
    for j in "ab":
        g.report(j, RuntimeEvent(EventKind.RUNNING))
    g.report("b", ProgressReport(3, t_iter_s=150.0, t_solo_s=143.0, slowdown=1.05))
    return g


OPS = {
    "admit": lambda g: g.admit(SPECS["d"]),
    "depart": lambda g: g.depart("c"),
    "move": lambda g: g.depart("a"),  # b moves to group-1
    "fail": lambda g: g.report("b", RuntimeEvent(EventKind.FAILED, error="boom")),
    "expire": lambda g: g.expire_unattached(now=time.time() + 3600),  # c never attached
    "progress": lambda g: g.report("b", ProgressReport(4, t_iter_s=150.0)),
}


def fingerprint(g) -> tuple:
    jobs = tuple(sorted((j.job_id, j.state, j.group_id, j.iterations_done, len(j.moves)) for j in g.list_jobs()))
    groups = tuple(sorted((x.group_id, x.members, x.rollout_nodes, x.train_nodes) for x in g.list_groups()))
    return jobs, groups


def check_invariants(g) -> None:
    jobs = g.list_jobs()
    active = {j.job_id for j in jobs if j.state in ("admitted", "running")}
    ran = {j.job_id for j in jobs if j.state == "running"}
    groups = g.list_groups()
    members = [m for x in groups for m in x.members]
    assert sorted(members) == sorted(active), "ghost member or lost admitted job"
    nodes = [n for x in groups for n in (*x.rollout_nodes, *x.train_nodes)]
    assert len(nodes) == len(set(nodes)), "a node in two groups"
    total = sum(x.cost_usd_per_h for x in groups)
    again = InterGroupScheduler.restore(PAPER, g.igs.snapshot()).cost_usd_per_h()
    assert total == pytest.approx(g.igs.cost_usd_per_h()) and total == pytest.approx(again)
    # retries and DELETE answer correctly on the restored scheduler
    for j in sorted(active):
        r = g.admit(SPECS[j])
        assert r.admitted and r.replayed and r.group_id == g.get_job(j).group_id
    ended = [j.job_id for j in g.list_jobs() if j.job_id not in active]
    for j in ended:
        assert g.depart(j).already_ended
    for j in sorted(active):  # a job no driver ran is withdrawn (cancelled); one that ran finishes
        assert g.depart(j).state == ("finished" if j in ran else "cancelled")
    assert g.list_groups() == [] and g.igs.cost_usd_per_h() == 0
    for j in ended:  # an ended id can be admitted again
        assert g.admit(SPECS[j]).admitted


def _stores(tmp_path):
    return {"memory": lambda i: MemoryKV(), "file": lambda i: FileKV(tmp_path / f"ck{i}")}


def _kill_at_every_write(make, build, op, restart, fp, before, after, check) -> int:
    """Run ``op`` on a scheduler built by ``build`` over a store that crashes at write k = 1, 2, ...
    until the operation completes without reaching k. After each crash a scheduler restarted from
    what was written must be exactly ``before`` (killed at the first write: nothing committed) or
    ``after`` (the first write commits), and pass ``check``. Returns how many writes crashed."""
    crashes = 0
    for k in range(1, 20):
        kv = CrashKV(make(k))
        g = build(kv)
        kv.arm(k)
        try:
            op(g)
        except Crash:
            crashes += 1
            restarted = restart(kv.inner)
            assert fp(restarted) == (before if k == 1 else after), f"kill at write {k}"
            check(restarted)
            continue
        assert fp(g) == after
        return crashes
    raise AssertionError("the operation never completed within 19 writes")


@pytest.mark.parametrize("compact", [False, True], ids=["wal", "compaction"])
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("store", ["memory", "file"])
def test_scheduler_killed_at_every_checkpoint_write(store, op, compact, tmp_path):
    """Kill at write k = 1, 2, ... of the operation until it completes without reaching k."""
    make = _stores(tmp_path)[store]
    ref = scenario(make("ref"))
    before = fingerprint(ref)
    OPS[op](ref)
    after = fingerprint(ref)
    assert after != before  # the operation changes the state
    def build(kv):
        g = scenario(kv)
        if compact:
            g.store.compact_every, g.store.compact_ratio = 1, 0.0  # every write is followed by a compaction (base + deletes)
        return g

    crashes = _kill_at_every_write(make, build, OPS[op], sched, fingerprint, before, after,
                                   check=check_invariants)
    # one write commits the operation; a compaction adds the base and the deletes of covered records
    assert crashes == 1 if not compact else crashes >= 3


def test_failed_write_rolls_back():
    """A store error (not a crash) during admit / depart: the call raises, nothing changed, and
    the retry succeeds."""

    class Flaky(MemoryKV):
        fail = False

        def put(self, key, value):
            if self.fail:
                raise OSError("disk full")
            super().put(key, value)

    kv = Flaky()
    g = scenario(kv)
    before = fingerprint(g)
    kv.fail = True
    for op in ("admit", "move", "fail", "expire"):
        with pytest.raises(OSError):
            OPS[op](g)
        assert fingerprint(g) == before and fingerprint(sched(kv)) == before
    kv.fail = False
    assert g.admit(SPECS["d"]).admitted and fingerprint(sched(kv)) == fingerprint(g)


def test_long_scheduler_name_and_128_char_job_id_commit_once():
    """Keys derive from the (hashed) scheduler name, never from a job id: a 70-character name and
    a 128-character id are admitted, checkpointed and restored; the retry replays the decision."""
    kv = MemoryKV()
    g = sched(kv, name="s" * 70 + "/x")
    s = {"job_id": "y" * 128, "model_params_b": 7}
    d = g.admit(s)
    assert d.admitted and "y" * 128 in g.igs.job_ids
    assert all(len(k) <= 200 for k in kv.keys())
    r = sched(kv, name="s" * 70 + "/x")
    assert r.restored and r.get_job("y" * 128).state == "admitted"
    again = r.admit(s)
    assert again.admitted and again.replayed and again.group_id == d.group_id


def test_crash_at_departure_write_leaves_no_ghost(tmp_path):
    """A scheduler killed while writing a departure restarts either before it (the job still a
    member, departable) or after it; never a finished job that is still a member."""
    for at in (1, 2):
        kv = CrashKV(FileKV(tmp_path / f"g{at}"))
        g = sched(kv)
        g.admit(SPECS["a"]), g.admit(SPECS["b"])
        g.store.compact_every, g.store.compact_ratio = 1, 0.0
        kv.arm(at)
        with pytest.raises(Crash):
            g.depart("a")
        r = sched(FileKV(tmp_path / f"g{at}"))
        a = r.get_job("a")
        members = [m for x in r.list_groups() for m in x.members]
        # (a never ran: its departure withdraws it, ``cancelled``)
        if at == 1:  # killed before the departure was written: a is still active and departable
            assert a.state == "admitted" and "a" in members and r.depart("a").state == "cancelled"
        else:
            assert a.state == "cancelled" and "a" not in members and r.depart("a").already_ended
        assert r.admit(SPECS["a"]).admitted
        r.depart("a")
        c = r.admit(spec("c", 100, 40))  # joins b's group at no extra cost
        assert c.strategy == "direct" and c.delta_usd_per_h == 0


@pytest.mark.parametrize("damage", ["truncated", "garbled", "version", "base_missing", "gap", "not_json_header"])
def test_bad_checkpoint_refuses_to_start_naming_the_file(damage, tmp_path):
    d = tmp_path / "ck"
    g = sched(FileKV(d))
    for j in "abc":
        g.admit(SPECS[j])
    base = d / "rollmux-global-scheduler.base.json"
    wal = sorted(d.glob("rollmux-global-scheduler.w.*.json"))
    assert base.is_file() and len(wal) == 3
    if damage == "truncated":
        wal[-1].write_text(wal[-1].read_text()[:50])
        named = wal[-1]
    elif damage == "garbled":
        v = json.loads(base.read_text())
        v["body"]["state"]["header"]["next_group"] = 7
        base.write_text(json.dumps(v))
        named = base
    elif damage == "version":
        v = json.loads(wal[0].read_text())
        v["version"] = 99
        wal[0].write_text(json.dumps(v))
        named = wal[0]
    elif damage == "base_missing":
        base.unlink()
        named = base
    elif damage == "gap":
        wal[1].unlink()
        named = wal[2]
    else:
        base.write_text("{not json")
        named = base
    with pytest.raises(CheckpointError) as e:
        sched(FileKV(d))
    msg = str(e.value)
    assert str(named) in msg and "rollmux down --purge" in msg and "refusing to start" in msg


def test_empty_store_starts_fresh_and_old_layout_is_migrated(tmp_path):
    g = sched(FileKV(tmp_path / "new"))
    assert not g.restored and g.list_jobs() == []
    # the previous layout (<name>.meta + .g.<group> + .j.<job>) is read once and rewritten
    kv = MemoryKV()
    ref = scenario(MemoryKV())
    name = "rollmux-global-scheduler"
    kv.put(f"{name}.meta", {"version": 1, "snapshot": ref.igs.snapshot_header(),
                            "group_ids": [x.group_id for x in ref.igs.groups], "t": 0})
    for x in ref.igs.groups:
        kv.put(f"{name}.g.{x.group_id}", ref.igs.group_snapshot(x.group_id))
    for j, rec in ref.jobs.items():
        kv.put(f"{name}.j.{j}", JobStore.stored(rec))
    r = sched(kv)
    assert r.restored and fingerprint(r) == fingerprint(ref)
    assert not kv.keys(f"{name}.meta") and not kv.keys(f"{name}.j.") and kv.keys(f"{name}.base")
    assert fingerprint(sched(kv)) == fingerprint(ref)


def test_expired_job_releases_its_nodes():
    g = scenario(MemoryKV())
    assert g.expire_unattached(now=time.time() + 30) == []
    assert g.expire_unattached(now=time.time() + 3600) == ["c"]  # a and b reported running
    c = g.get_job("c")
    assert c.state == "expired" and "no driver attached within 60 s" in c.error
    assert "c" not in [m for x in g.list_groups() for m in x.members]
    assert g.admit(SPECS["c"]).admitted


def test_timed_out_admission_answers_504_and_a_retry_gets_the_decision():
    """The HTTP face: a scheduler slower than the request timeout gives 504 "outcome unknown";
    the job is admitted afterwards, and posting the same spec again answers 200 with the
    original decision (a different spec under the live id: 409)."""
    import concurrent.futures

    from fastapi.testclient import TestClient

    from serve_app import AppSettings, SchedulerClient, _sha256, create_app

    g = sched(MemoryKV())
    pool = concurrent.futures.ThreadPoolExecutor(1)
    delay = {"s": 1.0}

    class Ref:
        def __init__(self, f):
            self.f = f

        def future(self):
            return self.f

    class Method:
        def __init__(self, n):
            self.n = n

        def remote(self, *a):
            if self.n == "snapshot_since":  # no snapshot follower here: reads fall back to the scheduler
                raise RuntimeError("no snapshot in this test")

            def run():
                time.sleep(delay["s"])
                out = getattr(g, self.n)(*a)
                return asyncio.run(out) if inspect.iscoroutine(out) else out  # admit_batched is async

            return Ref(pool.submit(run))

    class Handle:
        def __getattr__(self, n):
            return Method(n)

    cl = SchedulerClient(timeout_s=0.3, actor=Handle())
    c = TestClient(create_app(AppSettings(token_sha256=_sha256("t" * 32)), client=cl))
    auth = {"Authorization": "Bearer " + "t" * 32}
    body = {"job_id": "j1", "model_params_b": 7}
    r = c.post("/v1/jobs", json=body, headers=auth)
    assert r.status_code == 504 and r.json()["error"] == "outcome_unknown"
    assert "outcome unknown, GET /v1/jobs/j1" in r.json()["detail"]
    pool.shutdown(wait=True)
    assert g.get_job("j1").state == "admitted"
    pool = concurrent.futures.ThreadPoolExecutor(1)
    delay["s"] = 0.0
    r2 = c.post("/v1/jobs", json=body, headers=auth)
    assert r2.status_code == 200 and r2.json()["group_id"] == g.get_job("j1").group_id
    r3 = c.post("/v1/jobs", json={**body, "slo": 3.0}, headers=auth)
    assert r3.status_code == 409 and r3.json()["error"] == "duplicate_job_id"


@pytest.mark.ray
@pytest.mark.parametrize("op", sorted(OPS))
def test_scheduler_killed_at_every_write_gcs_store(ray_cluster, op):
    """The same on Ray's GCS internal KV (a scheduler name of its own per run)."""
    import uuid

    ref = scenario(MemoryKV())
    before = fingerprint(ref)
    OPS[op](ref)
    after = fingerprint(ref)
    for k in (1, 2, 3):
        name = f"crash-{uuid.uuid4().hex[:8]}"
        kv = CrashKV(RayInternalKV())
        g = sched(kv, name=name)
        for j in "abc":
            g.admit(SPECS[j])
        for j in "ab":
            g.report(j, RuntimeEvent(EventKind.RUNNING))
        g.report("b", ProgressReport(3, t_iter_s=150.0, t_solo_s=143.0, slowdown=1.05))
        g.store.compact_every, g.store.compact_ratio = 1, 0.0
        kv.arm(k)
        with pytest.raises(Crash):
            OPS[op](g)
        r = sched(RayInternalKV(), name=name)
        assert fingerprint(r) == (before if k == 1 else after)
        check_invariants(r)
        for key in r.store.keys():
            RayInternalKV().delete(key)


def test_failure_reasons_are_for_people_and_keep_the_raw_error():
    from rollmux.records import explain_failure

    raw = ("\x1b[36mray::RolloutWorker.run()\x1b[39m (pid=4242, ip=10.0.0.7, actor_id=8f3e2a1b0c) "
           "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
           "  class_name: RolloutWorker\n  actor_id: 8f3e2a1b0c")
    why = explain_failure(f"worker died: {raw}", ("rollout-0", "train-0"))
    assert why == "the worker on rollout-0, train-0 was lost; the job's state went with it. " \
                  "Submit the job again to start it from step 1."
    assert explain_failure("phase failed on rollout-1: RayActorError: actor_id=ab12") .startswith(
        "the worker on rollout-1 was lost")
    lease = explain_failure("driver lost: no heartbeat for 31.0s (lease 30.0s)")
    assert "longer than its 30.0 s lease" in lease and "evicted" in lease
    other = explain_failure("\x1b[31mRuntimeError: injected failure (pid=7)\x1b[0m")
    assert other.startswith("the job failed: RuntimeError: injected failure") and "\x1b" not in other
    assert "pid" not in other
    for restarted in ("ActorUnavailableError: The actor 046c60e329d44df6eff4859702000000 is unavailable: The actor "
                      "is temporarily unavailable: IOError: The actor is restarting..",
                      "RayTaskError(KeyError): ray::RolloutWorkerImpl.receive_weights() repr=<actors.worker.workers."
                      "RolloutWorkerImpl object at 0x7f7d4c7c9e90>)"):
        assert explain_failure(restarted, ("rollout-0", "train-0")) == (
            "the worker on rollout-0, train-0 was lost; the job's state went with it. Submit the job again to "
            "start it from step 1.")
    g = scenario(MemoryKV())
    rec = g.report("b", RuntimeEvent(EventKind.FAILED, error=f"worker died: {raw}"))
    assert rec.state == "failed" and rec.error.startswith("the worker on rollout-0")
    assert rec.error_detail == f"worker died: {raw}"
    assert sched(g.kv).get_job("b") == g.get_job("b")


# ---- GroupController restarts: the ledger is rebuilt from the target membership, positions from the drivers

def _drive_with_restarts(kills: set[int], iterations: int = 3) -> dict:
    """Three drivers (two share a rollout node, all share the training node) run ``iterations``
    meta-iterations against a GroupLedger that is replaced by a fresh one (a restarted
    controller: members pushed again in admission order, no grants, no positions) at the steps
    in ``kills``. Drivers keep their own position and report it on their next permit request.
    Returns {job: completed iterations}; raises PermitError when a job would fail."""
    from rollmux.group_ledger import GroupLedger
    from rollmux.messages import PhaseRecord

    members = {"a": (["rollout-0"], ["train-0"]), "b": (["rollout-0"], ["train-0"]), "c": (["rollout-1"], ["train-0"])}
    phases = ["rollout", "train", "sync"]

    def fresh():
        led = GroupLedger("group-0", lease_s=0)
        for j, (r, t) in members.items():
            if it[j] < iterations:  # a finished job departed: the target membership lacks it
                led.add(j, r, t, has_sync=True)
        return led

    pos = {j: 0 for j in members}
    it = {j: 0 for j in members}
    led = fresh()
    flight: dict[str, tuple] = {}  # job -> (phase, the ledger that granted it)
    step = 0
    while any(it[j] < iterations for j in members) and step < 500:
        step += 1
        if step in kills:
            led = fresh()
        for j in members:
            if it[j] >= iterations:
                continue
            ph = phases[pos[j]]
            if j in flight:
                led.release(flight[j][2], PhaseRecord(ok=True, node=members[j][0][0]))
                del flight[j]
                pos[j] = (pos[j] + 1) % 3
                it[j] += pos[j] == 0
                if it[j] >= iterations:
                    led.remove(j, "departed")
                continue
            g = led.try_grant(j, ph, it[j], 0.0)
            if g is not None:
                led.phase_started(j, ph)
                # no node held by two phases granted by the same ledger
                for k, (kph, kled, _) in flight.items():
                    if kled is led:
                        kn = members[k][0] if kph == "rollout" else members[k][1]
                        assert not set(kn) & set(g.nodes), (j, ph, k, kph)
                flight[j] = (ph, led, g)
    return it


@pytest.mark.parametrize("kills", [set(), {3}, {4, 9}, {2, 5, 7, 11, 13}, set(range(2, 40, 3))],
                         ids=["none", "mid-phase", "twice", "mid-sync", "every-third-step"])
def test_group_ledger_restarted_any_number_of_times_fails_no_job(kills):
    assert _drive_with_restarts(kills) == {"a": 3, "b": 3, "c": 3}


def test_round_robin_resume_puts_a_training_job_at_the_head_only_when_free():
    from rollmux.round_robin import RoundRobinQueues

    q = RoundRobinQueues()
    q.add_job("a", ["r0"], ["t0"])
    q.add_job("b", ["r1"], ["t0"])
    assert q.resume("b", "train", iteration=4)  # a's next phase is rollout: b takes the training head
    assert q.next_phase("b") == "train" and q.iteration("b") == 4 and q.head("t0") == "b"
    assert [(r.job_id, r.phase) for r in q.ready()] == [("a", "rollout"), ("b", "train")]
    q.grant("b", "train")
    with pytest.raises(ValueError, match="running"):
        q.resume("b", "sync")
    # b's training holds the node: a's resume is refused for now (nothing changes; it asks again)
    assert q.resume("a", "sync") is False and q.next_phase("a") == "rollout" and q.head("t0") == "b"
    q.on_phase_done("b", "train")
    q.grant("b", "sync")
    assert q.resume("a", "sync") is False  # b's sync is the tail of its training slot
    q.on_phase_done("b", "sync")
    assert q.resume("a", "sync") and q.head("t0") == "a"
    assert [(r.job_id, r.phase, r.iteration) for r in q.ready()] == [("a", "sync", 0), ("b", "rollout", 5)]


def test_failed_compaction_keeps_the_committed_change():
    class NoBase(MemoryKV):
        def put(self, key, value):
            if key.endswith(".base"):
                raise OSError("disk full")
            super().put(key, value)

    kv = MemoryKV()
    g = sched(kv)
    g.kv = g.store.kv = NoBase()
    g.kv._d = kv._d
    g.store.compact_every, g.store.compact_ratio = 1, 0.0
    assert g.admit(SPECS["a"]).admitted  # the record is written; the base is not, and that is fine
    assert sched(kv).get_job("a").state == "admitted" and g.get_job("a").state == "admitted"


def test_readmitted_job_id_starts_fresh_on_a_worker_that_hosted_the_dead_run(tmp_path):
    """The scheduler gives every admission its own token; a worker that still hosts a job id
    from a previous admission (its driver was killed) drops that run's state when the new
    admission registers, so the new run starts from step 1 (no warm start from the dead run)."""
    from actors.worker.workers import RolloutWorkerImpl

    g = sched(MemoryKV())
    t1 = g.admit(SPECS["a"]) and g.get_job("a").admission_id
    g.report("a", RuntimeEvent(EventKind.FAILED, error="driver lost: no heartbeat for 31.0s (lease 30.0s)"))
    t2 = g.admit(SPECS["a"]) and g.get_job("a").admission_id
    assert t1 and t2 and t1 != t2
    w = RolloutWorkerImpl("rollout-0")
    cfg = {"builder": dict, "checkpoint_dir": str(tmp_path)}
    assert w.register_job("a", {**cfg, "admission": t1})
    h = w.jobs["a"]
    h.ref, h.sync.pending = "state-of-step-14", PendingWeights(tensors={"w": 1})
    h.ckpt.write_bytes(b"step 14")
    assert not w.register_job("a", {**cfg, "admission": t1})  # the same admission: idempotent
    assert w.jobs["a"] is h
    assert w.register_job("a", {**cfg, "admission": t2})  # a new admission: fresh state
    new = w.jobs["a"]
    assert new is not h and new.ref is None and new.pending_weights is None and not h.ckpt.exists()
    assert new.ckpt != h.ckpt and t2[:16] in new.ckpt.name


def test_ended_jobs_state_is_released_on_every_worker(tmp_path):
    """A job that fails (e.g. its driver was killed and it was evicted) or expires has its state
    dropped on each of its workers by the scheduler, not only by a driver that says goodbye; a
    late release of an earlier admission never drops a re-admitted run."""
    from actors.worker.workers import RolloutWorkerImpl, TrainWorkerImpl

    g = sched(MemoryKV())
    g.admit(SPECS["a"])
    rec = g.get_job("a")
    workers = {f"rollmux-worker-{n}": (RolloutWorkerImpl if n.startswith("rollout") else TrainWorkerImpl)(n)
               for n in (*rec.placement.rollout_nodes, *rec.placement.train_nodes)}
    cfg = {"builder": dict, "checkpoint_dir": str(tmp_path), "admission": rec.admission_id}
    for w in workers.values():
        w.register_job("a", cfg)
        w.jobs["a"].ckpt.write_bytes(b"state")
        w.jobs["a"].sync.pending = PendingWeights(tensors={})
    files = [w.jobs["a"].ckpt for w in workers.values()]
    g.reconciler.handles.workers = {w.node: InProcessWorker(w) for w in workers.values()}  # called in-process

    g.report("a", RuntimeEvent(EventKind.FAILED, error="driver lost: no heartbeat for 31.0s (lease 30.0s)"))
    assert sorted(n for _, n in g.release_workers_once()) == sorted(w.node for w in workers.values())
    assert all("a" not in w.jobs for w in workers.values()) and not any(f.exists() for f in files)
    # re-admitted: a late release carrying the old token leaves the new run alone
    g.admit(SPECS["a"])
    new = g.get_job("a").admission_id
    for w in workers.values():
        assert w.register_job("a", {**cfg, "admission": new})
        assert not w.unregister_job("a", rec.admission_id) and "a" in w.jobs
    g.expire_unattached(now=time.time() + 3600)
    assert g.get_job("a").state == "expired" and g.release_workers_once()
    assert all("a" not in w.jobs for w in workers.values())


def test_two_schedulers_on_one_host_never_see_each_others_job_state(tmp_path):
    """Workers host a job under its scheduler's key (job id @ scheduler name): the same job id
    admitted by two schedulers sharing the host's workers is two hosted jobs with their own
    files; registering or releasing one never touches the other."""
    from actors.naming import SCHEDULER_NAME, hosted_key
    from actors.worker.workers import RolloutWorkerImpl

    assert hosted_key("a", None) == hosted_key("a", SCHEDULER_NAME) == "a"
    k1, k2 = hosted_key("a", "sched-1"), hosted_key("a", "sched-2")
    assert len({k1, k2, "a"}) == 3
    w = RolloutWorkerImpl("rollout-0")
    cfg = {"builder": dict, "checkpoint_dir": str(tmp_path), "job_id": "a"}
    assert w.register_job(k1, {**cfg, "admission": "1" * 32}) and w.register_job(k2, {**cfg, "admission": "2" * 32})
    h1, h2 = w.jobs[k1], w.jobs[k2]
    h1.ckpt.write_bytes(b"run of sched-1")
    h2.ckpt.write_bytes(b"run of sched-2")
    assert h1.ckpt != h2.ckpt and h1.commit_prefix != h2.commit_prefix
    assert {v.job_id for v in w.hosted()} == {"a"} and sorted(v.key for v in w.hosted()) == sorted([k1, k2])
    # sched-1's job ends: its release (its own key and admission) drops only its run
    g = sched(MemoryKV(), name="sched-1")
    worker = g.reconciler.handles.workers["rollout-0"] = InProcessWorker(w)
    g.reconciler.release("a", "1" * 32, ["rollout-0"])
    g.release_workers_once()
    assert worker.calls == [(k1, "1" * 32)] and k1 not in w.jobs and w.jobs[k2] is h2
    assert not h1.ckpt.exists() and h2.ckpt.read_bytes() == b"run of sched-2"


@pytest.mark.ray
def test_driver_killed_with_sigkill_then_readmitted_starts_from_step_1(ray_cluster, local_cluster_spec, tmp_path):
    """A GRPO driver process killed with SIGKILL mid-run is evicted within seconds (its Ray
    driver is seen dead; the 30 s driver lease is only the last resort) and its record says failed; the same job id admitted again runs fresh: its
    first training step is 1, not the dead run's next step (the worker dropped the old run's
    state when the new admission's token registered). Meanwhile the same job id admitted by a
    second scheduler on the same host (same workers) runs from step 1 beside it: each is hosted
    under its own scheduler's key, neither drops nor reads the other's state."""
    import os
    import signal
    import subprocess
    import sys
    import uuid
    from pathlib import Path


    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from factories import kill_scheduler_and_controllers, wait_until
    from rollmux.admission import load_scheduler_config

    root = Path(__file__).resolve().parent.parent
    from actors.naming import hosted_key, worker_name

    uid = uuid.uuid4().hex[:6]
    name, jid = f"test-kill9-{uid}", f"kill9-{uid}"
    h = get_or_create_scheduler(local_cluster_spec, name=name,
                                config={**load_scheduler_config().model_dump(), "driver_lease_s": 30.0})
    name2 = f"test-kill9b-{uid}"
    h2 = get_or_create_scheduler(local_cluster_spec, name=name2)
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.address, "ROLLMUX_SCHEDULER_NAME": name,
           "ROLLMUX_CKPT_DIR": str(tmp_path / "ckpt"), "PYTHONPATH": str(root)}

    def cmd(n, out=None):
        c = [sys.executable, str(root / "scripts" / "grpo_job.py"), "--config",
             str(root / "configs" / "jobs" / "grpo_train_heavy.yaml"), "--iterations", str(n), "--job-id", jid,
             "--attach", "--quiet"]
        return c + (["--out", str(out)] if out else [])

    try:
        p = subprocess.Popen(cmd(500), cwd=str(root), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: getattr(SchedulerHandle(h).get_job(jid), "iterations_done", 0) >= 2 or p.poll() is not None,
                       timeout_s=240, interval_s=0.2, what="two iterations of the first run")
            assert p.poll() is None, "the first run ended before it was killed"
            # the same job id under a second scheduler on the same workers, beside the running one
            out2 = tmp_path / "other-scheduler.json"
            p2 = subprocess.Popen(cmd(1, out2), cwd=str(root), env={**env, "ROLLMUX_SCHEDULER_NAME": name2},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            node = SchedulerHandle(h).get_job(jid).placement.rollout_nodes[0]
            both = {hosted_key(jid, name), hosted_key(jid, name2)}
            seen = wait_until(lambda: (lambda k: "both" if both <= k else "ended" if p2.poll() is not None else None)(
                {x.key for x in WorkerHandle.of_node(node).hosted()}),
                timeout_s=240, interval_s=0.1, what="both schedulers' runs hosted")
            assert seen == "both" and p2.wait(timeout=240) == 0
            assert [m["step"] for m in json.loads(out2.read_text())["history"]] == [1]
            before = SchedulerHandle(h).get_job(jid).iterations_done
            wait_until(lambda: SchedulerHandle(h).get_job(jid).iterations_done > before, timeout_s=120,
                       interval_s=0.2, what="the first scheduler's run going on")
            assert p.poll() is None and SchedulerHandle(h).get_job(jid).state == "running"
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
            killed_at = time.monotonic()
        rec = wait_until(lambda: (lambda r: r if r.state == "failed" else None)(SchedulerHandle(h).get_job(jid)),
                         timeout_s=60, interval_s=0.2, what="the killed driver evicted")
        # seen dead through the cluster's driver table within seconds, not after the 30 s lease
        assert time.monotonic() - killed_at < 15.0 and "process exited" in rec.error_detail, rec
        assert rec.iterations_done >= 2 and "driver" in rec.error_detail
        out = tmp_path / "again.json"
        r = subprocess.run(cmd(1, out), cwd=str(root), env=env, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        res = json.loads(out.read_text())
        assert [m["step"] for m in res["history"]] == [1]
        again = SchedulerHandle(h).get_job(jid)
        assert again.state == "finished" and again.iterations_done == 1
    finally:
        kill_scheduler_and_controllers(h, name)
        kill_scheduler_and_controllers(h2, name2)


def test_lost_worker_resumes_from_the_commit_before_the_interrupted_phase(tmp_path):
    """Each phase commits the state it left (and its result) before it counts as done; a worker
    restarted after a loss re-hosts the job and the interrupted phase starts from the commit
    before it (never from a half-applied state), a phase released before the loss replays its
    committed result, the rollout side re-applies weights received after its last commit, and a
    missing commit says in plain words that the state cannot be recovered."""
    import torch

    from actors.worker.workers import KEEP_COMMITS, RolloutWorkerImpl, TrainWorkerImpl, WorkerLost, _commit_files

    cfg = {"builder": lambda: {"w": torch.zeros(2), "step": 0}, "switch": "cold",
           "checkpoint_dir": str(tmp_path), "admission": "token-of-run-1"}
    w = TrainWorkerImpl("train-0")
    assert w.register_job("j", cfg)
    h = w.jobs["j"]
    for seq, phase in enumerate(["train", "sync", "train", "sync", "train"], 1):
        s, kind, _ = w._switch.materialise(h, seq)
        assert kind == "cold"
        if phase == "train":
            s["w"] += 1.0
            s["step"] += 1
        _, storable = w._switch.offload(h, s)
        h.commits.write(seq, phase, storable, h.resident, {"step": s["step"], "phase": phase}, h.admission)
        h.seq = seq
    assert sorted(f.name for f in _commit_files(h.commit_prefix)) == \
        sorted(f"{h.commit_prefix.rsplit('/', 1)[-1]}.commit{k}.pt" for k in range(6 - KEEP_COMMITS, 6))

    def restarted(seq):  # a fresh worker process on the node (Ray restarted it); the driver re-registers
        w2 = TrainWorkerImpl("train-0")
        assert w2.register_job("j", cfg, recover=True)
        return w2, w2.jobs["j"], w2._switch.materialise(w2.jobs["j"], seq)

    _, _, (s, kind, _) = restarted(6)  # lost during phase 6: it starts from commit 5 (3 training steps)
    assert kind == "recovered" and s["step"] == 3 and torch.equal(s["w"], torch.full((2,), 3.0))
    w2, h2, (s, kind, _) = restarted(5)  # phase 5 redone (its answer was lost): from commit 4 (a sync)
    assert kind == "recovered" and s["step"] == 2 and torch.equal(s["w"], torch.full((2,), 2.0))
    assert h2.commits.load(5)["result"] == {"step": 3, "phase": "train"}  # replay of a released phase
    assert h2.commits.load(4)["result"] == {"step": 2, "phase": "sync"}
    with pytest.raises(WorkerLost, match="worker on train-0 was lost .* cannot be recovered"):
        restarted(3)  # commit 2 was pruned
    # the same worker re-hosting (another worker of the job was lost): its own copy is dropped
    assert w.register_job("j", cfg, recover=True) and w.jobs["j"] is not h and w.jobs["j"].seq is None
    assert w.unregister_job("j") and _commit_files(h.commit_prefix) == []

    # rollout side: weights received after commit k are re-applied when rollout k+1 is redone
    r = RolloutWorkerImpl("rollout-0")
    rcfg = {**cfg, "builder": lambda: {"w": torch.zeros(2), "version": 0}}
    r.register_job("j", rcfg)
    hr = r.jobs["j"]
    s, _, _ = r._switch.materialise(hr, 1)
    _, storable = r._switch.offload(hr, s)
    hr.commits.write(1, "rollout", storable, hr.resident, {"samples": 1}, hr.admission)
    hr.seq = 1
    r._switch.keep_weights(hr, {"w": torch.full((2,), 7.0)})
    r2 = RolloutWorkerImpl("rollout-0")
    r2.register_job("j", rcfg, recover=True)
    s, kind, _ = r2._switch.materialise(r2.jobs["j"], 2)
    assert kind == "recovered" and torch.equal(r2.jobs["j"].pending_weights.tensors["w"], torch.full((2,), 7.0))
    r3 = RolloutWorkerImpl("rollout-0")
    r3.register_job("j", rcfg, recover=True)
    r3._switch.keep_weights(r3.jobs["j"], {"w": torch.full((2,), 8.0)})  # nothing in memory: follows the last commit
    s, kind, _ = r3._switch.materialise(r3.jobs["j"], 2)
    assert torch.equal(r3.jobs["j"].pending_weights.tensors["w"], torch.full((2,), 8.0))
    assert r3.unregister_job("j") and _commit_files(hr.commit_prefix) == []

    # a resident engine without state_dict (e.g. DeepSpeed) keeps state outside the commits: a
    # recovery says so in plain words instead of silently restarting it from its builder
    class Engine:
        rollmux_resident = True

    ecfg = {**cfg, "builder": lambda: {"engine": Engine(), "step": 0}, "switch": "warm"}
    e = TrainWorkerImpl("train-0")
    e.register_job("j", ecfg)
    he = e.jobs["j"]
    from rollmux.phase_state import split_state

    storable, he.resident = split_state({"engine": Engine(), "step": 1})
    he.commits.write(1, "train", storable, he.resident, {}, he.admission)
    e2 = TrainWorkerImpl("train-0")
    e2.register_job("j", ecfg, recover=True)
    with pytest.raises(WorkerLost, match=r"cannot be recovered: its resident engine \(Engine\)"):
        e2._switch.materialise(e2.jobs["j"], 2)
    assert e2.unregister_job("j") and _commit_files(he.commit_prefix) == []


class _ExitDuringRollout:
    """Runtime hook: the rollout worker's process exits (as if it crashed) at the first progress
    event of rollout ``iteration``, once (a marker file remembers it across the restart)."""

    def __init__(self, marker: str, iteration: int):
        self.marker, self.iteration = marker, iteration

    def __call__(self, event: dict) -> None:
        import os

        if event.get("event") == "progress" and event.get("iteration") == self.iteration \
                and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)


@pytest.mark.ray
@pytest.mark.timeout(420)
def test_worker_killed_mid_run_the_job_finishes_bit_identical_to_solo(ray_cluster, local_cluster_spec, tmp_path):
    """The rollout worker's process dies in the middle of iteration 1's rollout and the training
    worker is killed between iterations 1 and 2: the job is re-hosted from its last commits each
    time, the interrupted phases are redone, and it finishes all its iterations with trainer
    weights bit-identical (SHA-256) to the same job run solo; nothing is left on disk."""
    import sys
    import uuid

    import ray

    import rollmux
    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.naming import NAMESPACE, worker_name
    from factories import kill_scheduler_and_controllers
    from examples.grpo.config import ModelConfig, load_job_config
    from examples.grpo.job import run_job
    from rollmux.config import CONFIG_DIR

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the hook above, for the worker
    uid = uuid.uuid4().hex[:6]
    name, jid = f"test-wkill-{uid}", f"wkill-{uid}"
    cfg = load_job_config(CONFIG_DIR / "jobs" / "grpo_train_heavy.yaml", iterations=4)
    cfg = cfg.model_copy(update={
        "job": cfg.job.model_copy(update={"job_id": jid, "slo": 8.0}),
        "run": cfg.run.model_copy(update={"max_new_tokens": 12, "min_new_tokens": 6, "num_prompts": 4,
                                          "group_size": 4, "ppo_epochs": 1, "minibatch_size": 8}),
        "model": ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                             max_position_embeddings=48)})
    solo = run_job(cfg, attach=False)
    h = get_or_create_scheduler(local_cluster_spec, name=name)
    ckpt = tmp_path / "ckpt"
    killed = []

    def kill_train_worker(m: dict) -> None:
        if m["iteration"] == 1:  # between iterations 1 and 2
            node = SchedulerHandle(h).get_job(jid).placement.train_nodes[0]
            ray.kill(ray.get_actor(worker_name(node), namespace=NAMESPACE), no_restart=False)
            killed.append(node)

    rollmux.runtime_hook(_ExitDuringRollout(str(tmp_path / "rollout-exited"), 1))
    try:
        res = run_job(cfg, attach=True, scheduler_name=name, checkpoint_dir=str(ckpt), on_iteration=kill_train_worker)
        assert (tmp_path / "rollout-exited").exists() and killed
        assert [m["step"] for m in res["history"]] == [1, 2, 3, 4]
        assert res["weights_sha256"] == solo["weights_sha256"]
        assert [m["reward_mean"] for m in res["history"]] == [m["reward_mean"] for m in solo["history"]]
        tl = res["timeline"]
        assert any(r["phase"] == "rollout" and r["iteration"] == 1 and r["switch"] == "recovered" for r in tl), tl
        assert any(r["phase"] == "train" and r["iteration"] == 2 and r["switch"] == "recovered" for r in tl), tl
        rec = SchedulerHandle(h).get_job(jid)
        assert rec.state == "finished" and rec.iterations_done == 4 and not rec.error, rec
        assert ckpt.is_dir() and not any(ckpt.iterdir())  # the commits were written there, all removed at the end
    finally:
        kill_scheduler_and_controllers(h, name)


# ---- the admission queue: enqueue, cancel and a drain are each one atomic write-ahead record
LOCAL = load_cluster(CONFIG_DIR / "cluster_local.yaml")  # 2 rollout + 2 training nodes of 1 GPU


def qspec(job_id: str, gpus: int = 1) -> dict:
    return {"job_id": job_id, "model_params_b": 0.001, "num_rollout_gpus": gpus, "num_train_gpus": gpus, "slo": 1.0,
            "mem_roll_gb": 0.5, "mem_train_gb": 0.5, "measured": {"t_roll_s": 5.0, "t_train_s": 5.0, "t_sync_s": 0.0}}


def qsched(kv):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl

    return GlobalSchedulerImpl(LOCAL, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=1,
                               config={"attach_timeout_s": 0.0})


def queue_scenario(kv):
    """a and b hold both node pairs (no sharing); big (2 + 2 GPUs) and w (1 + 1) are queued."""
    g = qsched(kv)
    assert g.admit(qspec("a")).admitted and g.admit(qspec("b")).admitted
    assert g.admit(qspec("big", gpus=2), queue=True).code == "queued"
    assert g.admit(qspec("w"), queue=True).code == "queued"
    return g


QUEUE_OPS = {
    "enqueue": lambda g: g.admit(qspec("x"), queue=True),
    "cancel": lambda g: g.depart("w"),
    "drain": lambda g: g.depart("a"),  # a's pair is freed: w (behind the blocked big) is admitted from the line
}


def qfingerprint(g) -> tuple:
    return fingerprint(g), tuple((q.job_id, q.seq) for q in g.queue.jobs())


@pytest.mark.parametrize("op", sorted(QUEUE_OPS))
@pytest.mark.parametrize("store", ["memory", "file"])
def test_scheduler_killed_at_every_queue_write(store, op, tmp_path):
    """The line travels in the write-ahead record of the commit that changes it: a kill at any
    write leaves it (and the admissions it gave up or took in) before or after, never a queued
    job lost, nor one both queued and admitted."""
    make = _stores(tmp_path)[store]
    ref = queue_scenario(make("ref"))
    before = qfingerprint(ref)
    out = QUEUE_OPS[op](ref)
    after = qfingerprint(ref)
    assert after != before
    if op == "drain":
        assert out.admitted_from_queue == ("w",) and [q.job_id for q in ref.queue.jobs()] == ["big"]
    def never_queued_and_admitted(restarted):
        queued = {q.job_id for q in restarted.queue.jobs()}
        active = {j.job_id for j in restarted.list_jobs() if j.state in ("admitted", "running")}
        assert not queued & active, "a job both queued and admitted"

    crashes = _kill_at_every_write(make, queue_scenario, QUEUE_OPS[op], qsched, qfingerprint, before, after,
                                   check=never_queued_and_admitted)
    assert crashes == 1  # ONE write commits the operation, the line with it
    assert not any(k.endswith(".queue") for k in ref.store.keys())  # no separate queue key


def test_queue_key_of_the_previous_layout_moves_into_the_base():
    """A checkpoint whose line sits under its own ``<prefix>.queue`` key (previous layout) is
    read once, written into a base and the old key deleted; a kill between the two keeps it."""
    from actors.scheduler.global_scheduler import legacy_queue_key

    kv = MemoryKV()
    g = queue_scenario(kv)
    line = g.queue.snapshot()
    # the previous layout: a base without the line, the line under its own key
    old = g.commit.full_state()
    del old["queue"]
    g.store.compact(old)
    kv.put(legacy_queue_key(g.store), line)
    again = qsched(CrashKV(kv))
    assert [q.job_id for q in again.queue.jobs()] == ["big", "w"] and kv.get(legacy_queue_key(again.store)) is None
    assert kv.get(again.store.base_key)["body"]["state"]["queue"]["jobs"][0]["spec"]["job_id"] == "big"
    # killed after the base was written but before the old key was deleted: the base wins
    kv.put(legacy_queue_key(again.store), {"seq": 0, "jobs": []})
    third = qsched(kv)
    assert [q.job_id for q in third.queue.jobs()] == ["big", "w"] and kv.get(legacy_queue_key(third.store)) is None
