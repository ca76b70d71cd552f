"""Pure sync-plan tests (RollMux §5.2): shards, traffic accounting, prediction. No I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.sync_plan import (
    LinkModel,
    ParallelLayout,
    SyncPlanError,
    TensorMeta,
    build_plan,
    compare_metas,
    max_imbalance,
    shard_bound_bytes,
)


def metas(sizes: list[int]) -> list[TensorMeta]:
    return [TensorMeta(f"t{i}", (n // 4,), "float32", (n // 4) * 4) for i, n in enumerate(sizes)]


def coverage(plan) -> dict[str, list[tuple[int, int]]]:
    cov: dict[str, list[tuple[int, int]]] = {}
    for s in plan.shards:
        for seg in s.segments:
            cov.setdefault(seg.tensor, []).append((seg.start, seg.stop))
    return cov


def assert_disjoint_cover(plan) -> None:
    cov = coverage(plan)
    for t in plan.tensors:
        ivs = sorted(cov.get(t.name, []))
        pos = 0
        for a, b in ivs:
            assert a == pos, f"{t.name}: gap or overlap at byte {pos} (next segment starts at {a})"
            pos = b
        assert pos == t.nbytes
    # buckets re-cover each shard exactly, each within the bucket size
    for s in plan.shards:
        assert sum(b.nbytes for b in s.buckets) == s.nbytes
        assert all(0 < b.nbytes <= plan.bucket_bytes for b in s.buckets)
    tags = [b.tag for s in plan.shards for b in s.buckets]
    assert len(tags) == len(set(tags))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=12),
       n=st.integers(1, 9), m=st.integers(1, 9), bucket=st.integers(1, 3000), split=st.booleans())
def test_shards_are_disjoint_and_cover_the_model(sizes, n, m, bucket, split):
    plan = build_plan(metas(sizes), n, m, bucket_bytes=bucket, split_tensors=split)
    assert len(plan.shards) == n
    assert_disjoint_cover(plan)
    if split:  # balanced: every shard within one byte of model_bytes / N
        assert max(s.nbytes for s in plan.shards) <= shard_bound_bytes(plan)
        assert min(s.nbytes for s in plan.shards) >= plan.model_bytes // n
    # every rollout worker ends with everything: receivers round-robin over the rollout workers
    assert [s.receiver for s in plan.shards] == [i % m for i in range(n)]


def test_topo_moves_one_copy_across_flat_moves_m():
    ts = metas([4000, 1200, 800, 4000])  # 10_000 bytes
    topo = build_plan(ts, 4, 4, bucket_bytes=1000)
    flat = build_plan(ts, 4, 4, bucket_bytes=1000, scheme="flat")
    assert topo.model_bytes == flat.model_bytes == 10_000
    assert topo.cross_bytes == 10_000 and flat.cross_bytes == 40_000
    assert topo.summary()["cross_copies"] == 1.0 and flat.summary()["cross_copies"] == 4.0
    # each receiver sends its 2500-byte shard to the three other rollout workers
    links = topo.intra_link_bytes()
    assert len(links) == 12 and set(links.values()) == {2500}
    assert topo.intra_bytes == 30_000 and flat.intra_bytes == 0
    assert sum(topo.cross_link_bytes().values()) == 10_000
    assert flat.cross_link_bytes()[(2, 3)] == 2500


def test_fewer_or_more_rollout_workers_than_trainers():
    ts = metas([6000])
    more_train = build_plan(ts, ParallelLayout(tp=2, dp=2), 2, bucket_bytes=700)
    assert [s.receiver for s in more_train.shards] == [0, 1, 0, 1]
    assert [s.index for s in more_train.shards_received_by(0)] == [0, 2]
    assert more_train.cross_bytes == 6000 and more_train.intra_bytes == 6000
    more_roll = build_plan(ts, 3, 5, bucket_bytes=700)
    assert [s.receiver for s in more_roll.shards] == [0, 1, 2]
    assert more_roll.shards_received_by(4) == ()
    assert more_roll.intra_bytes == 4 * 6000  # each of the 3 shards goes to the 4 others
    # broadcast order is round-robin over shards and lists every bucket once
    assert sorted(more_roll.broadcast_order) == sorted((s.index, b.seq) for s in more_roll.shards for b in s.buckets)
    assert more_roll.broadcast_order[:3] == ((0, 0), (1, 0), (2, 0))


def test_greedy_split_keeps_tensors_whole_and_uneven():
    plan = build_plan(metas([8000, 400, 400, 400]), 2, 2, bucket_bytes=512, split_tensors=False)
    assert sorted(s.nbytes for s in plan.shards) == [1200, 8000]
    assert all(seg.start == 0 and seg.nbytes == t for s in plan.shards for seg, t in
               zip(s.segments, [dict((m.name, m.nbytes) for m in plan.tensors)[g.tensor] for g in s.segments]))
    assert max_imbalance(plan) == pytest.approx(8000 / 4600)


def test_predicted_times_from_link_bandwidths():
    ts = metas([8_000_000])  # 8 MB
    links = LinkModel(cross_gbps=1.0, intra_gbps=20.0)  # 20:1
    flat = build_plan(ts, 8, 8, scheme="flat", bucket_bytes=1 << 20)
    topo = build_plan(ts, 8, 8, bucket_bytes=1 << 20)
    pf, pt = flat.predict(links), topo.predict(links)
    assert pf.total_s == pytest.approx(8 * 8e6 * 8 / 1e9)  # 8 copies at 1 Gbit/s = 0.512 s
    assert pt.cross_s == pytest.approx(0.064)
    # per-NIC fabric: each receiver's egress is 7 x 1 MB = 7 MB at 20 Gbit/s
    assert pt.intra_s == pytest.approx(7e6 * 8 / 20e9)
    assert pt.total_s == pytest.approx(0.064 + pt.intra_s / 1)  # one bucket round per shard
    assert pf.total_s / pt.total_s == pytest.approx(8 / (1 + 7 / 160))
    shared = topo.predict(LinkModel(1.0, 20.0, intra_shared=True))
    assert shared.intra_s == pytest.approx(7 * 8e6 * 8 / 20e9)


def test_layout_metadata_and_bad_input_name_the_field():
    assert ParallelLayout(tp=2, dp=4).workers == 8
    with pytest.raises(SyncPlanError, match="layout.tp"):
        ParallelLayout(tp=0)
    with pytest.raises(SyncPlanError, match="bucket_bytes"):
        build_plan(metas([10]), 1, 1, bucket_bytes=0)
    with pytest.raises(SyncPlanError, match="scheme"):
        build_plan(metas([10]), 1, 1, scheme="ring")  # type: ignore[arg-type]
    with pytest.raises(SyncPlanError, match="duplicate"):
        build_plan([TensorMeta("w", (1,), "float32", 4)] * 2, 1, 1)
    with pytest.raises(SyncPlanError, match="no tensors"):
        build_plan([], 1, 1)
    with pytest.raises(SyncPlanError, match="cross_gbps"):
        LinkModel(0, 1)
    with pytest.raises(SyncPlanError, match="no rollout worker 3"):
        build_plan(metas([10]), 1, 3).global_rank("rollout", 3)
    assert build_plan(metas([10]), 2, 3).global_rank("rollout", 1) == 3


def test_compare_metas_reports_each_difference():
    exp = [TensorMeta("a", (2, 3), "float32", 24), TensorMeta("b", (4,), "bfloat16", 8)]
    assert compare_metas(exp, exp) == []
    got = [TensorMeta("a", (3, 2), "float32", 24), TensorMeta("c", (1,), "float32", 4)]
    problems = compare_metas(exp, got)
    assert any(p.startswith("a: expected shape (2, 3)") for p in problems)
    assert "c: unexpected tensor (not in the trainer's model)" in problems
    assert "b: missing tensor" in problems
    assert compare_metas(exp, exp[:1], subset=True) == []


def test_plan_digest_is_stable_and_sensitive():
    ts = metas([100, 200])
    assert build_plan(ts, 2, 2).digest() == build_plan(ts, 2, 2).digest()
    assert build_plan(ts, 2, 2).digest() != build_plan(ts, 2, 3).digest()
    assert build_plan(ts, 2, 2).digest() != build_plan(ts, 2, 2, bucket_bytes=64).digest()


def test_endpoints_are_resident_control_plane():
    """A sync endpoint stays alive between phases (RollMux §5.1) under the phase API's rule."""
    from collectives import GlooExecutor, SyncEndpoint
    from rollmux.phase_api import is_resident

    assert SyncEndpoint.rollmux_resident is True and GlooExecutor.rollmux_resident is True
    assert is_resident(object.__new__(GlooExecutor))


@pytest.mark.parametrize("n,m", [(1, 1), (3, 5), (5, 3), (4, 4), (7, 2), (2, 9)])
@pytest.mark.parametrize("shared", [False, True])
def test_predict_per_nic_totals_match_the_link_table(n, m, shared):
    """predict() sums per-NIC bytes without building the N x M link table; same figures as the table."""
    metas = [TensorMeta(f"t{i}", (1000 + 37 * i,), "uint8", 1000 + 37 * i) for i in range(6)]
    plan = build_plan(metas, n, m, bucket_bytes=512)
    table = plan.intra_link_bytes()
    egress, ingress = {}, {}
    for (a, b), k in table.items():
        egress[a] = egress.get(a, 0) + k
        ingress[b] = ingress.get(b, 0) + k
    busiest = sum(table.values()) if shared else max([0, *egress.values(), *ingress.values()])
    links = LinkModel(cross_gbps=1.0, intra_gbps=2.0, intra_shared=shared)
    assert plan.intra_bytes == sum(table.values())
    assert plan.predict(links).intra_s == pytest.approx(busiest * 8 / 2e9)


def test_predict_scales_to_large_gpu_counts():
    """65,536 trainers and rollout GPUs (the largest GPU count a job spec admits) plan and predict."""
    metas = [TensorMeta(f"t{i}", (2_000_000,), "uint8", 2_000_000) for i in range(64)]
    pred = build_plan(metas, 65_536, 65_536).predict(LinkModel(cross_gbps=25.0, intra_gbps=400.0))
    assert pred.cross_s == pytest.approx(128_000_000 * 8 / 25e9)
    assert pred.total_s > pred.cross_s
