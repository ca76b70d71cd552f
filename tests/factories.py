"""Shared test factories: job specs, toy phase-API jobs, and :func:`wait_until`.

Every test that needs a toy job, a small job spec or a bounded wait imports it from here
instead of writing its own (tests/conftest.py puts this folder on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch

T = TypeVar("T")

#: Sleep seconds of a toy job's (rollout, training) phases.
SLEEP = {"big": (0.25, 0.25), "small": (0.08, 0.08)}

#: Scheduler settings under which jobs stay in the groups admission packed them into: planning on
#: the declared worst case (no SLO watch on the wall-clock phase times of a loaded host, which are
#: not the phase times the toy jobs declare) and no neighbourhood re-optimisation or global plan.
#: For tests that check what happens inside one co-execution group (turns, on-policy weights);
#: the moves themselves are tested by test_slo_watch_runtime, test_global_plan and test_repack.
FIXED_GROUPS = {"profile_source": "worst_case", "reopt_max_jobs": 0, "plan_max_jobs": 0}


def wait_until(probe: Callable[[], T], *, timeout_s: float = 60.0, interval_s: float = 0.1,
               what: str = "condition", ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``probe()`` until it returns a truthy value; return that value.

    Bounded: raises ``TimeoutError`` naming ``what`` (and the last value or error) after
    ``timeout_s``. Exceptions in ``ignore`` (e.g. an actor restarting) count as "not yet".
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except ignore as e:  # noqa: PERF203  (a restarting actor: try again)
            last = e
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s:g} s (last: {last!r})")
        time.sleep(interval_s)


@contextlib.contextmanager
def own_scheduler(spec, prefix: str, config: Optional[dict] = None) -> Iterator[str]:
    """A GlobalScheduler of its own (``prefix`` + a random suffix, scheduler ``config`` over the
    defaults) on the session's cluster, healthy; yields its name and kills it at exit (a module
    fixture's body)."""
    import ray

    from actors.handles import SchedulerHandle
    from actors.scheduler.global_scheduler import get_or_create_scheduler

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    h = get_or_create_scheduler(spec, name=name, **({"config": config} if config else {}))
    assert SchedulerHandle(h).health().ok
    try:
        yield name
    finally:
        ray.kill(h, no_restart=True)


def assert_coexecuted_equals_solo(res: dict, cfg, mate, iterations: int) -> dict:
    """On-policy preserved (RollMux §5): the job ``cfg`` co-executed beside ``mate`` (results
    ``res`` of :func:`examples.grpo.job.run_coexecuted`, one group) has, every iteration, the
    trainer weights and rewards of the same job run solo in this process. Returns its result."""
    from examples.grpo.job import run_job

    co = res[cfg.job.job_id]
    assert co["mode"] == "scheduled" and co["iterations"] == iterations
    assert res[mate.job.job_id]["info"]["group_id"] == co["info"]["group_id"], "the two jobs share one group"
    solo = run_job(cfg, attach=False)
    assert [m["weights_sha256"] for m in solo["history"]] == [m["weights_sha256"] for m in co["history"]]
    assert [m["reward_mean"] for m in solo["history"]] == [m["reward_mean"] for m in co["history"]]
    return co


def toy_spec(job_id: str, kind: str, slo: float = 5.0) -> dict:
    """Measured profiles that Alg. 1 packs into one group on 1 rollout + 1 training node
    (``big``: 5 s rollout + 5 s training, ``small``: 2 s + 2 s; 0.5 GB per pool)."""
    t = {"big": (5.0, 5.0), "small": (2.0, 2.0)}[kind]
    return {"job_id": job_id, "model_params_b": 0.001, "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": slo,
            "mem_roll_gb": 0.5, "mem_train_gb": 0.5,
            "measured": {"t_roll_s": t[0], "t_train_s": t[1], "t_sync_s": 0.0}}


def small_spec(job_id: str, kind: str = "small") -> dict:
    """:func:`toy_spec` with an SLO of 5."""
    return toy_spec(job_id, kind, slo=5.0)


def make_toy(job, kind: str, seed: int, fail_at: Optional[int] = None):
    """Register a toy RL loop on ``job`` (a :class:`rollmux.Job`): 4-float weights, rollouts that
    report progress in 5 steps, training that can fail at iteration ``fail_at``. Returns the
    decorated ``(rollout, train, publish)``; all randomness lives in the states (seeded)."""
    roll_s, train_s = SLEEP[kind]

    @job.state("rollout")
    def build_rollout():
        return {"w": torch.zeros(4), "gen": torch.Generator().manual_seed(seed)}

    @job.state("train")
    def build_train():
        return {"w": torch.zeros(4), "gen": torch.Generator().manual_seed(seed + 1)}

    @job.phase("rollout")
    def rollout(state, iteration, hook):
        for i in range(1, 6):
            time.sleep(roll_s / 5)
            hook.progress(i, 5)
        return {"x": torch.randn(4, generator=state["gen"]) + state["w"], "it": iteration}

    @job.phase("train")
    def train(state, samples):
        time.sleep(train_s)
        if fail_at is not None and samples["it"] == fail_at:
            raise RuntimeError(f"injected failure in training, iteration {fail_at}")
        state["w"] = state["w"] * 0.5 + samples["x"] * torch.rand(4, generator=state["gen"])
        return {"w": state["w"].clone()}

    @job.phase("sync")
    def publish(state):
        return {"w": state["w"].clone()}

    @job.apply_weights
    def apply(state, weights):
        state["w"] = weights["w"].clone()

    return rollout, train, publish


def ring_quartet():
    """Four jobs of the bundled extract's stochastic replay whose round-robin order decides
    feasibility: ``(cluster, [spec, ...])`` in arrival order (job-00059, job-00095, job-00097,
    job-00075), each with measured phase times, seconds. Admitted in arrival order they form one
    group on two training nodes; job-00097 and job-00059 span both, job-00095 and job-00075 one each,
    so in arrival order a chain of trainings 00059 -> 00095 -> 00097 -> 00075 -> back to 00059
    waits within one meta-iteration (the four trainings and syncs, 1260.5 s) and every member
    runs at that cadence, over the SLOs of job-00095, job-00097 and job-00075. In the order
    (00059, 00095, 00075, 00097) that chain wraps twice and the group runs at 1041.8 s, every SLO
    kept."""
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.models import JobSpec, PhaseProfile

    def spec(jid, b, prompts, resp, turns, nr, nt, slo, roll, train, sync):
        return JobSpec(job_id=jid, model_params_b=b, num_prompts=prompts, max_response_tokens=resp, multi_turn=turns > 1,
                       turns=turns, num_rollout_gpus=nr, num_train_gpus=nt, slo=slo,
                       measured=PhaseProfile(t_roll_s=roll, t_train_s=train, t_sync_s=sync))

    return load_cluster(CONFIG_DIR / "cluster_sim.yaml"), [
        spec("job-00059", 32.0, 128, 32768, 4, 16, 16, 1.3653, 738.892, 213.788, 25.622),
        spec("job-00095", 14.0, 128, 16384, 4, 8, 8, 1.3568, 645.142, 216.949, 11.215),
        spec("job-00097", 32.0, 512, 4096, 1, 8, 16, 1.4302, 218.34, 548.621, 25.621),
        spec("job-00075", 14.0, 128, 16384, 4, 8, 8, 1.2714, 640.519, 207.47, 11.215)]


def kill_scheduler_and_controllers(h, name: str, groups: tuple[str, ...] = ("group-0", "group-1")) -> None:
    """Kill a test's GlobalScheduler ``h`` (named ``name``) and its groups' controllers, no restart."""
    import ray

    for g in groups:
        try:
            ray.kill(ray.get_actor(f"{name}-{g}", namespace="rollmux"), no_restart=True)
        except ValueError:  # that group never had a controller (or it already exited)
            pass
    ray.kill(h, no_restart=True)


# ---- the scheduler without Ray: fake handles (actors.scheduler.reconciler.HandleFactory) and an in-process client
class FakeAck:
    """A push's answer: done at once (``pending=True``: not yet; ``error``: the controller raised)."""

    def __init__(self, value: Any = None, error: Optional[BaseException] = None, pending: bool = False):
        self.value, self.error, self.pending = value, error, pending

    def done(self) -> bool:
        return not self.pending

    def result(self, timeout_s: Optional[float] = None) -> Any:
        if self.pending:
            raise TimeoutError("not answered yet")
        if self.error is not None:
            raise self.error
        return self.value

    def __await__(self):
        async def get():
            return self.result()

        return get().__await__()


class FakeController:
    """A group's controller as the scheduler sees it (:class:`actors.scheduler.reconciler.ControllerLike`):
    records every push (job ids, gone, seq, dissolved); each push is answered as ``answer()`` says."""

    def __init__(self, log: Optional[list] = None, answer: Optional[Callable[[Any], FakeAck]] = None):
        self.log = [] if log is None else log
        self.pushes: list = []
        self.answer = answer or (lambda push: FakeAck({"added": [], "removed": [], "stale": False}))
        self.timeline: list[dict] = []

    def push(self, push):
        self.pushes.append(push)
        self.log.append(([m.job_id for m in push.members], dict(push.gone), push.seq))
        return self.answer(push)

    async def timeline_async(self, timeout_s: float) -> list[dict]:
        return list(self.timeline)


class InProcessWorker:
    """A worker object called in-process (:class:`actors.scheduler.reconciler.WorkerLike`)."""

    def __init__(self, worker):
        self.worker = worker
        self.calls: list = []

    def unregister_job_nowait(self, key: str, admission: Optional[str] = None):
        self.calls.append((key, admission))
        return self.worker.unregister_job(key, admission)


class FakeHandles:
    """The scheduler's handle factory without Ray: ``controllers`` (group -> fake) exist, others
    are created on demand (``created``); ``workers`` (node -> worker-like) exist."""

    def __init__(self, controllers: Optional[dict] = None, workers: Optional[dict] = None, leftovers=()):
        self.controllers = dict(controllers or {})
        self.workers = dict(workers or {})
        self.leftovers = set(leftovers)
        self.created: list[str] = []

    def controller(self, group_id: str):
        return self.controllers.get(group_id)

    def create_controller(self, group_id: str):
        self.created.append(group_id)
        return self.controllers.setdefault(group_id, FakeController())

    def leftover_groups(self) -> set[str]:
        return set(self.leftovers) | set(self.controllers)

    def worker(self, node: str):
        return self.workers.get(node)


def unit_kw(handles: Optional[FakeHandles] = None) -> dict:
    """Keyword arguments of a GlobalSchedulerImpl in a unit test: fake handles (no Ray), metrics
    recorded as totals only, no reconcile thread (the test runs the passes)."""
    from actors.ops.metrics import RollmuxMetrics

    return {"handles": handles if handles is not None else FakeHandles(),
            "metrics": RollmuxMetrics(flush_interval_s=0, enabled=False), "reconcile_s": None}


class InProcessScheduler:
    """The HTTP app's scheduler client (:class:`serve_api.client.SchedulerApi`) calling a
    GlobalSchedulerImpl in this process; every call goes through :meth:`invoke` (override it to
    record or delay calls). Its answers are pickled and unpickled, as an actor call's are (typed,
    no lazy parts)."""

    def __init__(self, sched):
        self.s = sched

    async def invoke(self, name: str, fn, *args):
        import inspect
        import pickle

        out = fn(*args)
        return pickle.loads(pickle.dumps(await out if inspect.isawaitable(out) else out))

    async def health(self):
        return await self.invoke("health", self.s.health)

    async def admit_batched(self, spec, dry_run, queue, explain):
        return await self.invoke("admit_batched", self.s.admit_batched, spec, dry_run, queue, explain)

    async def admit_many(self, calls):
        return await self.invoke("admit_many", self.s.admit_many, calls)

    async def depart_batched(self, job_id):
        return await self.invoke("depart_batched", self.s.depart_batched, job_id)

    async def list_jobs(self):
        return await self.invoke("list_jobs", self.s.list_jobs)

    async def get_job(self, job_id):
        return await self.invoke("get_job", self.s.get_job, job_id)

    async def list_groups(self):
        return await self.invoke("list_groups", self.s.list_groups)

    async def snapshot_since(self, epoch, version, wait_s, policy):
        return await self.invoke("snapshot_since", self.s.snapshot_since, epoch, version, wait_s, policy)


def tiny_stack_spec(name: str) -> str:
    """A ``rollmux up`` cluster spec (YAML) of one CPU rollout node and one CPU training node."""
    return f"""name: {name}
rollout_pool:
  node: {{gpu: CPU, gpus_per_node: 1, host_mem_gb: 4}}
  num_nodes: 1
train_pool:
  node: {{gpu: CPU, gpus_per_node: 1, host_mem_gb: 4}}
  num_nodes: 1
cross_cluster_gbps: 1
intra_cluster_gbps: 20
"""


class QueueDriver:
    """Drives :class:`rollmux.round_robin.RoundRobinQueues` as a GroupController would: grants
    every ready phase and completes running ones when told. ``exclusive_nodes``: also check, at
    every pump, that no node runs two unreleased phases at once. Every grant is checked against
    its job's staleness bound (a rollout never runs more than ``k`` ahead of the last sync)."""

    def __init__(self, exclusive_nodes: bool = False) -> None:
        from rollmux.round_robin import RoundRobinQueues

        self.q = RoundRobinQueues()
        self.running: list[tuple[str, str]] = []
        self.n_new = 0
        self.exclusive_nodes = exclusive_nodes

    def add(self, rollout_nodes: list[str], train_nodes: list[str], max_staleness: int = 0) -> None:
        self.q.add_job(f"j{self.n_new}", rollout_nodes, train_nodes, max_staleness=max_staleness)
        self.n_new += 1

    def remove(self, k: int) -> None:
        if self.q.job_ids:
            victim = self.q.job_ids[k % len(self.q.job_ids)]
            self.q.remove_job(victim)
            self.running[:] = [x for x in self.running if x[0] != victim]

    def release_one(self) -> None:
        """Long-tail migration of the first running rollout not released yet."""
        for j, ph in self.running:
            if ph == "rollout" and not self.q._jobs[j].released:
                self.q.release(j)
                return

    def pump(self) -> None:
        q = self.q
        for rp in q.ready():
            if rp.phase == "rollout":
                assert rp.iteration == q.rollouts(rp.job_id)
                assert rp.iteration - q.iteration(rp.job_id) <= q.max_staleness(rp.job_id)
            q.grant(rp.job_id, rp.phase)
            self.running.append((rp.job_id, rp.phase))
        if not self.exclusive_nodes:
            return
        held: dict[str, str] = {}  # node -> the job and phase running unreleased on it
        for j, ph in self.running:
            if ph == "sync" or (ph == "rollout" and q._jobs[j].released):
                continue
            for n in q.nodes_of(j)[0 if ph == "rollout" else 1]:
                assert held.setdefault(n, f"{j}:{ph}") == f"{j}:{ph}", (n, held[n], j, ph)

    def drain(self, rounds: int, pick) -> None:
        """Every job left completes two more iterations within a bounded number of steps;
        ``pick(i)``: which running phase completes at step ``i``."""
        target = {j: self.q.iteration(j) + 2 for j in self.q.job_ids}
        for i in range(rounds * (len(target) + 1) * 3):
            self.pump()
            if all(self.q.iteration(j) >= t for j, t in target.items()) or not self.running:
                break
            self.q.on_phase_done(*self.running.pop(pick(i)))
        assert all(self.q.iteration(j) >= t for j, t in target.items())
