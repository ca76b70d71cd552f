"""Radix prefix index: hit lengths vs brute force, version expiry, LRU eviction, merging."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.rollout_sched import RadixPrefixIndex


def lcp(a, b) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def brute(entries, query, cv, ttl) -> int:
    return max((lcp(seq, query) for seq, v in entries if cv - v <= ttl), default=0)


def expected_bytes(idx: RadixPrefixIndex) -> int:
    total, stack = 0, [idx.root]
    while stack:
        n = stack.pop()
        total += idx.node_overhead_bytes + idx.bytes_per_token * len(n.edge)
        stack.extend(n.children.values())
    return total


seqs = st.lists(st.integers(0, 3), min_size=1, max_size=12)  # tiny alphabet: many shared prefixes


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(seqs, st.integers(0, 5)), min_size=1, max_size=25), st.lists(seqs, min_size=1, max_size=10),
       st.integers(0, 7), st.integers(0, 3))
def test_hit_length_matches_brute_force(entries, queries, cv, ttl):
    idx = RadixPrefixIndex(ttl_versions=ttl, max_bytes=1 << 30)
    for seq, v in entries:
        idx.insert(seq, version=v)
    for q in queries + [s for s, _ in entries]:
        assert idx.match(q, current_version=cv, touch=False) == brute(entries, q, cv, ttl)
    assert idx.memory_bytes == expected_bytes(idx)
    # expiry removes exactly what no longer counts: hits unchanged, nothing expired left
    idx.expire(cv)
    for q in queries + [s for s, _ in entries]:
        assert idx.match(q, touch=False) == brute(entries, q, cv, ttl)
    assert all(cv - v <= ttl for _, v in idx.sequences())
    assert idx.memory_bytes == expected_bytes(idx)


def test_radix_edges_are_compressed_and_split():
    idx = RadixPrefixIndex(max_bytes=1 << 20)
    idx.insert([1, 2, 3, 4, 5])
    assert idx.num_nodes == 2  # root + one compressed edge
    idx.insert([1, 2, 3, 9])
    assert idx.num_nodes == 4  # split at 3: [1,2,3] -> {[4,5], [9]}
    assert sorted(s for s, _ in idx.sequences()) == [(1, 2, 3, 4, 5), (1, 2, 3, 9)]
    assert idx.match([1, 2, 3, 4, 7]) == 4
    assert idx.match([1, 2, 8]) == 2
    assert idx.match([7]) == 0


def test_version_expiry_stops_counting_then_prunes():
    idx = RadixPrefixIndex(ttl_versions=1, max_bytes=1 << 20)
    idx.insert([1, 2, 3, 4], version=0)
    idx.insert([1, 2, 7, 7], version=2)
    assert idx.match([1, 2, 3, 4], current_version=1) == 4
    # at version 2 the version-0 tail is stale; the shared [1, 2] was refreshed by version 2
    assert idx.match([1, 2, 3, 4], current_version=2) == 2
    assert idx.match([1, 2, 7, 7], current_version=2) == 4
    before = idx.memory_bytes
    assert idx.expire(2) == 1
    assert idx.memory_bytes < before
    assert sorted(idx.sequences()) == [((1, 2, 7, 7), 2)]
    assert idx.match([1, 2, 7, 7], current_version=4) == 0  # everything stale at version 4
    idx.expire(4)
    assert idx.num_nodes == 1 and idx.memory_bytes == idx.node_overhead_bytes


def test_eviction_keeps_memory_bound_and_is_lru():
    idx = RadixPrefixIndex(max_bytes=2000, node_overhead_bytes=96, bytes_per_token=4, evict_low_watermark=0.8)
    hot = list(range(1000, 1040))
    idx.insert(hot)
    for i in range(60):
        idx.insert([i, i + 1, i + 2] + list(range(20)))
        idx.match(hot)  # keep the hot prompt recently used
        assert idx.memory_bytes <= 2000
    assert idx.stats["evicted_nodes"] > 0
    assert idx.match(hot) == 40  # survived LRU eviction
    assert idx.match([0, 1, 2] + list(range(20))) == 0  # the oldest cold prompt was evicted
    assert idx.memory_bytes == expected_bytes(idx)
    assert idx.peak_bytes > idx.memory_bytes or idx.peak_bytes <= 2000 + 96 + 4 * 23


def test_near_duplicate_tails_fold_into_shared_prefix():
    base = list(range(100, 140))  # 40-token shared template
    idx = RadixPrefixIndex(max_bytes=1 << 20)
    for i in range(6):
        idx.insert(base + [i, i + 50])  # perturbed endings, 2 tokens each
    idx.insert(base[:10] + [999] * 30)  # a different branch with a long tail: not a near-duplicate
    assert idx.match(base + [3, 53]) == 42
    nodes, mem = idx.num_nodes, idx.memory_bytes
    # first pass only marks (tails were used since the last pass); second pass folds
    assert idx.merge_near_duplicates(min_siblings=4, max_tail_tokens=2) == 0
    folded = idx.merge_near_duplicates(min_siblings=4, max_tail_tokens=2)
    assert folded == 6
    assert idx.num_nodes < nodes and idx.memory_bytes < mem
    assert idx.match(base + [3, 53]) == 40  # the shared template still hits
    assert idx.match(base[:10] + [999] * 30) == 40  # the other branch untouched
    assert idx.memory_bytes == expected_bytes(idx)


def test_merge_by_tail_fraction_and_recent_tails_survive():
    base = list(range(200, 240))
    idx = RadixPrefixIndex(max_bytes=1 << 20)
    for i in range(4):
        idx.insert(base + [i] * 10)  # 10-token tails = 25% of the 40-token prefix
    idx.merge_near_duplicates(min_siblings=4, max_tail_tokens=2, max_tail_fraction=0.25)  # mark
    idx.insert(base + [9] * 10)  # recent: must survive the next pass
    assert idx.merge_near_duplicates(min_siblings=4, max_tail_tokens=2, max_tail_fraction=0.25) == 4
    assert idx.match(base + [9] * 10, touch=False) == 50
    assert idx.match(base + [1] * 10, touch=False) == 40
    assert idx.merge_near_duplicates(min_siblings=4, max_tail_tokens=2, max_tail_fraction=0.2) == 0


def test_bad_arguments_raise():
    import pytest

    with pytest.raises(ValueError, match="ttl_versions"):
        RadixPrefixIndex(ttl_versions=-1)
    with pytest.raises(ValueError, match="max_bytes"):
        RadixPrefixIndex(max_bytes=0)
