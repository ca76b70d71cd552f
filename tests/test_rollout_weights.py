"""Weights into the rollout service: pause modes, bad uploads, a replica killed mid-update, the
sync plan and the checkpoint directory, through the service's handle (a service of its own, two
CPU engine replicas, small upload chunks).

Every token's version is checked exactly: a request's tokens are recomputed in this process with
the same engine, seed and weights, switching weights after the same number of time slices
(``keep``), from scratch on the new weights (``abort``), or on the old weights only (``wait``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid

import pytest
import torch

from rollmux.rollout_sched.api import Refusal, RolloutIn, Status, SubmitBatch
from rollmux.rollout_sched.weights import DiskUpdateBody, PauseMode, UploadStartBody

pytestmark = pytest.mark.ray

CHUNK = 64 * 1024
MAX_BYTES = 1 << 20
SLICE = 8  # cpu_engine slice_tokens


def model_sd(seed: int, **kw) -> dict:
    from actors.rollout.engine import tiny_llama

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return tiny_llama(**kw).state_dict()


@pytest.fixture(scope="module")
def svc(ray_cluster, tmp_path_factory):
    from actors.rollout.service import ensure_rollout_service

    root = tmp_path_factory.mktemp("weights_root")
    h = ensure_rollout_service(f"rollmux-rollouts-weights-{uuid.uuid4().hex[:6]}", timeout_s=120,
                               overrides={"weights_chunk_bytes": CHUNK, "max_weights_bytes": MAX_BYTES,
                                          "weights_root": str(root), "update_timeout_s": 60})
    assert h.ready_sync(timeout_s=300).num_replicas == 2
    h.root = root
    yield h
    h.shutdown_sync()


async def upload(h, data: bytes, version: int, mode: PauseMode = PauseMode.KEEP, sha: str | None = None,
                 skip: tuple[int, ...] = (), short_last: bool = False):
    up = await h.start_upload(UploadStartBody(weight_version=version, size_bytes=len(data), pause_mode=mode,
                                              sha256=sha or hashlib.sha256(data).hexdigest()))
    if isinstance(up, Refusal):
        return up
    for i in range(up.chunks):
        if i in skip:
            continue
        part = data[i * up.chunk_bytes:(i + 1) * up.chunk_bytes]
        if short_last and i == up.chunks - 1:
            part = part[:-1]
        r = await h.put_chunk(up.upload_id, i, part)
        if isinstance(r, Refusal):
            return r
    return await h.commit_upload(up.upload_id, 60)


def push(h, sd: dict, version: int, mode: PauseMode = PauseMode.KEEP):
    from actors.rollout.weights import encode

    out = asyncio.run(upload(h, encode(sd), version, mode))
    assert not isinstance(out, Refusal), out
    return out


def latest(h) -> int:
    v = asyncio.run(h.weights_view()).weight_version
    return -1 if v is None else v


def reference(prompt: str, seed: int, n: int, before: dict, after: dict | None = None, windows: int = 0) -> list[int]:
    """The tokens of one request on the replicas' engine in this process: ``before`` weights, and
    ``after`` loaded once ``windows`` time slices ran (None: never)."""
    from actors.rollout.engine import CPUEngine
    from actors.rollout.weights import decode, encode
    from rollmux.rollout_sched import Request

    e = CPUEngine(slice_tokens=SLICE, seed=0)
    e.load_weights(decode(encode(before)))
    e.admit([Request(request_id="ref", prompt_token_ids=tuple(prompt.encode()), max_tokens=n, seed=seed,
                     ignore_eos=True)], {})
    done, w = [], 0
    while not done:
        if after is not None and w == windows:
            e.load_weights(decode(encode(after)))
        done = e.step()
        w += 1
    return list(done[0].output_token_ids)


def run_across_update(h, mode: PauseMode, before: dict, after: dict, n: int = 160, k: int = 6):
    """``k`` long requests; once they run, update to ``after`` with ``mode`` -> (views, update view, version)."""
    v0 = latest(h) + 1
    push(h, before, v0)
    v1 = v0 + 1

    async def go():
        reqs = [RolloutIn(prompt=f"question {i} of the {mode.value} test", max_tokens=n, seed=100 + i, ignore_eos=True,
                          critical=True) for i in range(k)]
        acc = (await h.submit(SubmitBatch(requests=reqs))).requests
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            views = [await h.get(a.id) for a in acc]
            if sum(v.status is Status.RUNNING for v in views) >= 2:
                break
            await asyncio.sleep(0.01)
        from actors.rollout.weights import encode

        upd = await upload(h, encode(after), v1, mode)
        assert not isinstance(upd, Refusal), upd
        return reqs, [await h.wait_result(a.id, 120) for a in acc], upd

    reqs, views, upd = asyncio.run(go())
    return reqs, views, upd, v0, v1


def test_keep_mode_running_requests_go_on_and_each_token_has_its_version(svc):
    from actors.rollout.weights import state_digest

    a, b = model_sd(1), model_sd(2)
    reqs, views, upd, v0, v1 = run_across_update(svc, PauseMode.KEEP, a, b)
    assert upd.weights_sha256 == state_digest(b) and {r.weights_sha256 for r in upd.replicas} == {state_digest(b)}
    spanning = 0
    for r, v in zip(reqs, views):
        assert v.status is Status.FINISHED and len(v.token_versions) == len(v.output_token_ids) == 160
        c0 = v.token_versions.count(v0)
        assert v.token_versions == [v0] * c0 + [v1] * (160 - c0)  # a prefix of the old version, then the new
        assert v.version_span == [min(v.token_versions), max(v.token_versions)]
        if 0 < c0 < 160:
            spanning += 1
            assert (c0 - 1) % SLICE == 0  # switched at a time-slice boundary
            assert v.output_token_ids == reference(r.prompt, r.seed, 160, a, b, windows=(c0 - 1) // SLICE)
        else:
            assert v.output_token_ids == reference(r.prompt, r.seed, 160, a if c0 else b)
    assert spanning >= 1, "a request ran across the update"


def test_abort_mode_requeues_running_requests_onto_the_new_version(svc):
    a, b = model_sd(3), model_sd(4)
    reqs, views, upd, v0, v1 = run_across_update(svc, PauseMode.ABORT, a, b)
    assert upd.requeued >= 1
    for r, v in zip(reqs, views):
        assert v.status is Status.FINISHED
        assert len(set(v.token_versions)) == 1  # one version per result: restarted, or finished before
        want = b if v.token_versions[0] == v1 else a
        assert v.output_token_ids == reference(r.prompt, r.seed, 160, want)
    assert sum(v.requeued for v in views) == upd.requeued and any(v.token_versions[0] == v1 and v.requeued for v in views)


def test_wait_mode_update_waits_for_the_running_requests(svc):
    a, b = model_sd(5), model_sd(6)
    reqs, views, upd, v0, v1 = run_across_update(svc, PauseMode.WAIT, a, b)
    ran_old = [v for v in views if v.token_versions[0] == v0]
    assert ran_old, "requests that were running when the update came finished on the old version"
    for r, v in zip(reqs, views):
        assert len(set(v.token_versions)) == 1 and v.requeued == 0
        assert v.output_token_ids == reference(r.prompt, r.seed, 160, a if v.token_versions[0] == v0 else b)
    h = asyncio.run(svc.weights_view()).history[-1]
    assert h["weight_version"] == v1 and h["at_s"] + h["load_s"] >= max(v.timings.finished_s for v in ran_old)


BAD = [  # (what, how to break the upload, HTTP status, field named)
    ("truncated", dict(skip=(1,)), 422, "size_bytes"),
    ("short chunk", dict(short_last=True), 422, "body"),
    ("hash mismatch", dict(sha="0" * 64), 422, "sha256"),
    ("wrong shape", dict(sd=lambda: model_sd(7, vocab_size=300)), 422, "tensors.lm_head.weight.shape"),
    ("wrong dtype", dict(sd=lambda: {k: (v.half() if k == "lm_head.weight" else v) for k, v in model_sd(7).items()}),
     422, "tensors.lm_head.weight.dtype"),
    ("missing tensor", dict(sd=lambda: {k: v for k, v in model_sd(7).items() if k != "lm_head.weight"}), 422,
     "tensors.lm_head.weight"),
    ("not safetensors", dict(raw=b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\0" * 64), 422, "body"),
    ("oversize", dict(raw=b"\0" * (MAX_BYTES + 1)), 413, "size_bytes"),
    ("stale version", dict(version=0), 409, "weight_version"),
]


@pytest.mark.parametrize("what,how,status,field", BAD, ids=[b[0] for b in BAD])
def test_bad_upload_is_refused_naming_the_field_and_the_engines_keep_serving(svc, what, how, status, field):
    from actors.rollout.weights import encode

    good = model_sd(8)
    if latest(svc) < 1:
        push(svc, good, latest(svc) + 1)
    view0 = asyncio.run(svc.weights_view())
    before = asyncio.run(svc.replica_digests())
    how = dict(how)
    data = how.pop("raw", None) or encode(how.pop("sd", lambda: good)())
    version = how.pop("version", view0.weight_version + 1)
    out = asyncio.run(upload(svc, data, version, **how))
    assert isinstance(out, Refusal) and out.status == status, out
    assert field in out.detail and (not out.errors or out.errors[0].field == field), out
    assert asyncio.run(svc.replica_digests()) == before == [view0.weights_sha256] * 2  # still the previous version
    assert asyncio.run(svc.weights_view()).weight_version == view0.weight_version

    async def serves() -> Status:
        acc = (await svc.submit(SubmitBatch(requests=[RolloutIn(prompt="still serving?", max_tokens=4)]))).requests[0]
        return (await svc.wait_result(acc.id, 60)).status

    assert asyncio.run(serves()) is Status.FINISHED


def test_checkpoint_from_disk_is_checked_against_the_allowed_root(svc, tmp_path):
    from actors.rollout.weights import encode, state_digest

    sd = model_sd(9)
    inside = svc.root / "step-9"
    inside.mkdir()
    (inside / "model.safetensors").write_bytes(encode(sd))
    outside = tmp_path / "model.safetensors"
    outside.write_bytes(encode(sd))
    v = latest(svc) + 1
    r = asyncio.run(svc.update_from_disk(DiskUpdateBody(model_path=str(outside), weight_version=v), 60))
    assert isinstance(r, Refusal) and r.status == 403 and "model_path" in r.detail
    r = asyncio.run(svc.update_from_disk(DiskUpdateBody(model_path="step-9/../../etc", weight_version=v), 60))
    assert isinstance(r, Refusal) and r.status == 403
    r = asyncio.run(svc.update_from_disk(DiskUpdateBody(model_path="step-9", weight_version=v, sha256="1" * 64), 60))
    assert isinstance(r, Refusal) and r.status == 422 and r.errors[0].field == "sha256"
    ok = asyncio.run(svc.update_from_disk(DiskUpdateBody(model_path="step-9", weight_version=v,
                                                         sha256=state_digest(sd)), 60))
    assert not isinstance(ok, Refusal) and ok.weights_sha256 == state_digest(sd) and ok.source == "disk"
    assert asyncio.run(svc.replica_digests()) == [state_digest(sd)] * 2


def test_sync_plan_moves_one_copy_across_then_broadcasts(svc):
    from actors.rollout.sync_in import push_over_sync_plan
    from actors.rollout.weights import state_digest

    sd = model_sd(10)
    v = latest(svc) + 1
    out = asyncio.run(push_over_sync_plan(svc, sd, v, timeout_s=60))
    upd = out["update"]
    assert not isinstance(upd, Refusal), upd
    assert upd.weights_sha256 == state_digest(sd) and upd.source == "sync"
    assert asyncio.run(svc.replica_digests()) == [state_digest(sd)] * 2
    model_bytes = sum(t.numel() * t.element_size() for t in sd.values())
    assert out["cross_bytes"] == model_bytes and out["intra_bytes"] == model_bytes  # one copy across, one broadcast


def test_chained_reward_runs_on_the_server_when_the_sample_ends(svc):
    from rollmux.rollout_sched.api import ChainIn

    async def go():
        r = RolloutIn(prompt="2+2=", max_tokens=12, seed=7, critical=True,
                      then=ChainIn(prompt="score: ", include_prompt=True, output_tail_tokens=6, max_tokens=1))
        acc = (await svc.submit(SubmitBatch(requests=[r]))).requests[0]
        assert acc.chained_id
        gen = await svc.wait_result(acc.id, 60)
        rew = await svc.wait_result(acc.chained_id, 60)
        return gen, rew

    gen, rew = asyncio.run(go())
    assert gen.status is Status.FINISHED and gen.chained_id == rew.id
    assert rew.status is Status.FINISHED and rew.score is not None and rew.chained_from == gen.id
    assert rew.timings.submitted_s >= gen.timings.finished_s  # queued when the sample ended, by the service


def test_replica_killed_mid_update_comes_back_on_the_latest_version_and_nothing_queued_is_lost(svc):
    from actors.handles import RolloutReplicaHandle
    from actors.rollout.weights import encode, state_digest

    a, b = model_sd(11), model_sd(12)
    v0 = latest(svc) + 1
    push(svc, a, v0)
    names = svc.replica_names_sync()

    async def go():
        reqs = [RolloutIn(prompt=f"long {i}", max_tokens=200, ignore_eos=True, critical=True, seed=i) for i in range(8)]
        acc = (await svc.submit(SubmitBatch(requests=reqs))).requests
        while not any([(await svc.get(x.id)).status is Status.RUNNING for x in acc]):
            await asyncio.sleep(0.01)
        upd = asyncio.ensure_future(upload(svc, encode(b), v0 + 1, PauseMode.WAIT))  # waits for the running ones
        running = [x.replica for x in acc if (await svc.get(x.id)).status is Status.RUNNING]
        victim = running[0]
        await asyncio.sleep(0.05)
        RolloutReplicaHandle(name=names[victim]).kill()
        more = (await svc.submit(SubmitBatch(requests=[RolloutIn(prompt=f"q{i}", max_tokens=8) for i in range(6)]))).requests
        return victim, await upd, [await svc.wait_result(x.id, 120) for x in acc + more]

    victim, upd, views = asyncio.run(go())
    assert not isinstance(upd, Refusal), upd
    assert upd.weights_sha256 == state_digest(b)
    assert asyncio.run(svc.replica_digests()) == [state_digest(b)] * 2  # the replacement serves the latest version
    assert svc.replica_names_sync()[victim] != names[victim]
    assert all(v.status is Status.FINISHED for v in views), [v.status for v in views]  # retried / rerouted, none lost
    s = svc.stats_sync()
    assert s.replicas[victim].weights_version == v0 + 1 and s.queued == 0 and s.running == 0
