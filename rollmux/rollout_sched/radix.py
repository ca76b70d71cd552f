"""Prefix index over prompt token ids: a radix tree with compressed edges.

Used to estimate how much of a prompt's KV cache an engine with prefix caching (vLLM automatic
prefix caching, SGLang RadixAttention) can reuse, and to order requests by reuse.

Features:

* ``match(tokens)``: hit length, the longest common prefix of ``tokens`` with any live entry.
* policy-version expiry: every node carries the newest policy version of the sequences through
  it; a node with ``current_version - version > ttl_versions`` no longer counts (its KV was made
  by a stale policy) and ``expire()`` removes it.
* near-duplicate merging: ``merge_near_duplicates()`` folds short divergent leaf tails of a node
  (prompts of one task family that differ only in their last few tokens) into the shared prefix.
* memory bound with LRU eviction of leaves; ``memory_bytes`` is the index's own footprint
  estimate: ``node_overhead_bytes + bytes_per_token * len(edge)`` per node.

Invariant: a parent's ``version`` and ``last_access`` are >= those of its children, so an expired
node's whole subtree is expired and LRU order can always evict leaves first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence


class _Node:
    __slots__ = ("edge", "children", "parent", "version", "last_access", "hits")

    def __init__(self, edge: tuple[int, ...], parent: "_Node | None", version: int, last_access: int):
        self.edge = edge
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.version = version
        self.last_access = last_access
        self.hits = 0


def _lcp(edge: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of ``edge`` and ``tokens[start:]``."""
    n = len(edge)
    if tokens[start : start + n] == edge:
        return n
    m = min(n, len(tokens) - start)
    k = 0
    while k < m and edge[k] == tokens[start + k]:
        k += 1
    return k


class RadixPrefixIndex:
    """Radix tree over token-id sequences with version expiry, merging and an LRU memory bound.

    Args:
        ttl_versions: entries more than this many policy versions old stop counting (>= 0).
        max_bytes: memory bound of the index's own footprint estimate, bytes.
        node_overhead_bytes / bytes_per_token: constants of the footprint estimate.
        evict_low_watermark: eviction stops at this share of ``max_bytes``.

    Raises:
        ValueError: negative ttl, non-positive bound.
    """

    def __init__(
        self,
        ttl_versions: int = 4,
        max_bytes: int = 4 << 20,
        *,
        node_overhead_bytes: int = 96,
        bytes_per_token: int = 4,
        evict_low_watermark: float = 0.9,
    ):
        if ttl_versions < 0:
            raise ValueError(f"ttl_versions must be >= 0, got {ttl_versions}")
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        if not 0 < evict_low_watermark <= 1:
            raise ValueError(f"evict_low_watermark must be in (0, 1], got {evict_low_watermark}")
        self.ttl_versions = ttl_versions
        self.max_bytes = max_bytes
        self.node_overhead_bytes = node_overhead_bytes
        self.bytes_per_token = bytes_per_token
        self.evict_low_watermark = evict_low_watermark
        self.current_version = 0
        self._clock = 0
        self._merge_mark = 0
        self.epoch = 0  # bumped whenever entries are removed (hits may shrink)
        self.root = _Node((), None, version=1 << 62, last_access=1 << 62)
        self._bytes = node_overhead_bytes
        self._nodes = 1
        self.peak_bytes = self._bytes
        self.stats = {"inserts": 0, "lookups": 0, "evicted_nodes": 0, "expired_nodes": 0, "merged_tails": 0, "cleared_nodes": 0}

    # ------------------------------------------------------------------ figures
    @property
    def memory_bytes(self) -> int:
        """Footprint estimate of the index, bytes (see module doc)."""
        return self._bytes

    @property
    def num_nodes(self) -> int:
        return self._nodes

    def _node_bytes(self, node: _Node) -> int:
        return self.node_overhead_bytes + self.bytes_per_token * len(node.edge)

    # ------------------------------------------------------------------ core ops
    def insert(self, tokens: Sequence[int], version: int | None = None) -> None:
        """Insert a token sequence made under policy ``version`` (default: current version).

        Evicts LRU leaves afterwards if the memory bound is exceeded.
        """
        toks = tuple(tokens)
        ver = self.current_version if version is None else int(version)
        self._clock += 1
        clock = self._clock
        self.stats["inserts"] += 1
        node, i, n = self.root, 0, len(toks)
        while i < n:
            child = node.children.get(toks[i])
            if child is None:
                new = _Node(toks[i:], node, ver, clock)
                node.children[toks[i]] = new
                self._add_bytes(self._node_bytes(new), 1)
                break
            k = _lcp(child.edge, toks, i)
            if k < len(child.edge):  # split the edge at k
                mid = _Node(child.edge[:k], node, child.version, child.last_access)
                mid.hits = child.hits
                child.edge = child.edge[k:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                node.children[toks[i]] = mid
                self._add_bytes(self.node_overhead_bytes, 1)
                child = mid
            if ver > child.version:
                child.version = ver
            child.last_access = clock
            node, i = child, i + k
        if self._bytes > self.max_bytes:
            self.evict_to(int(self.evict_low_watermark * self.max_bytes))

    def match(self, tokens: Sequence[int], current_version: int | None = None, *, touch: bool = True) -> int:
        """Hit length: longest common prefix of ``tokens`` with a live (non-expired) entry, tokens.

        ``touch`` refreshes the LRU stamp and hit counters of the matched nodes.
        """
        toks = tokens if isinstance(tokens, tuple) else tuple(tokens)
        cv = self.current_version if current_version is None else current_version
        ttl = self.ttl_versions
        self.stats["lookups"] += 1
        if touch:
            self._clock += 1
        node, i, n, hit = self.root, 0, len(toks), 0
        while i < n:
            child = node.children.get(toks[i])
            if child is None or cv - child.version > ttl:
                break
            k = _lcp(child.edge, toks, i)
            hit += k
            if touch:
                child.last_access = self._clock
                child.hits += 1
            if k < len(child.edge):
                break
            node, i = child, i + k
        return hit

    # ------------------------------------------------------------------ maintenance
    def expire(self, current_version: int | None = None) -> int:
        """Remove every node older than the TTL; sets ``current_version``. Returns nodes removed."""
        if current_version is not None:
            self.current_version = current_version
        cv, ttl, removed = self.current_version, self.ttl_versions, 0
        stack = [self.root]
        touched: list[_Node] = []
        while stack:
            node = stack.pop()
            for key, child in list(node.children.items()):
                if cv - child.version > ttl:
                    removed += self._remove_subtree(child)
                    touched.append(node)
                else:
                    stack.append(child)
        for node in touched:
            self._compress(node)
        self.stats["expired_nodes"] += removed
        self.epoch += bool(removed)
        return removed

    def merge_near_duplicates(self, min_siblings: int = 4, max_tail_tokens: int = 8, max_tail_fraction: float = 0.0) -> int:
        """Fold near-duplicate branches (merge and prune).

        At any non-root node with >= ``min_siblings`` leaf children whose edges are short
        (<= ``max_tail_tokens``, or <= ``max_tail_fraction`` x the node's depth in tokens) and that
        were not matched or inserted since the previous merge pass, drop those tails: the shared
        prefix stays (with their hit counts), the divergent ends go. Returns tails folded.
        """
        folded = 0
        mark, self._merge_mark = self._merge_mark, self._clock
        stack = [(c, len(c.edge)) for c in self.root.children.values()]
        while stack:
            node, depth = stack.pop()
            limit = max(max_tail_tokens, int(max_tail_fraction * depth))
            tails = [c for c in node.children.values() if not c.children and len(c.edge) <= limit and c.last_access <= mark]
            if len(tails) >= min_siblings:
                for c in tails:
                    node.hits += c.hits
                    node.last_access = max(node.last_access, c.last_access)
                    folded += self._remove_subtree(c)
                self._compress(node)
            stack.extend((c, depth + len(c.edge)) for c in node.children.values())
        self.stats["merged_tails"] += folded
        self.epoch += bool(folded)
        return folded

    def evict_to(self, target_bytes: int) -> int:
        """Evict least-recently-used leaves until ``memory_bytes <= target_bytes``. Returns nodes evicted."""
        heap = [(n.last_access, id(n), n) for n in self._iter_nodes() if not n.children and n is not self.root]
        heapq.heapify(heap)
        evicted = 0
        while self._bytes > target_bytes and heap:
            _, _, leaf = heapq.heappop(heap)
            if leaf.children or leaf.parent is None:  # became internal again / already removed
                continue
            parent = leaf.parent
            evicted += self._remove_subtree(leaf)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.stats["evicted_nodes"] += evicted
        self.epoch += bool(evicted)
        return evicted

    def clear(self) -> None:
        """Drop every entry (e.g. an engine that resets its prefix cache on a weight load)."""
        self.stats["cleared_nodes"] = self.stats.get("cleared_nodes", 0) + self._nodes - 1
        self.root.children.clear()
        self._bytes, self._nodes = self.node_overhead_bytes, 1
        self.epoch += 1

    # ------------------------------------------------------------------ helpers
    def _add_bytes(self, b: int, nodes: int) -> None:
        self._bytes += b
        self._nodes += nodes
        if self._bytes > self.peak_bytes:
            self.peak_bytes = self._bytes

    def _iter_nodes(self) -> Iterator[_Node]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _remove_subtree(self, node: _Node) -> int:
        parent = node.parent
        assert parent is not None
        del parent.children[node.edge[0]]
        count, b = 0, 0
        stack = [node]
        while stack:
            n = stack.pop()
            count += 1
            b += self._node_bytes(n)
            stack.extend(n.children.values())
            n.parent = None
        self._bytes -= b
        self._nodes -= count
        return count

    def _compress(self, node: _Node) -> None:
        """Merge ``node`` with its only child when both carry the same version (path compression)."""
        if node is self.root or node.parent is None or len(node.children) != 1:
            return  # the root, a detached (already merged) node, or not a chain
        (child,) = node.children.values()
        if child.version != node.version:
            return
        node.edge = node.edge + child.edge
        node.children = child.children
        for g in node.children.values():
            g.parent = node
        node.last_access = max(node.last_access, child.last_access)
        node.hits += child.hits
        child.parent, child.children = None, {}
        self._bytes -= self.node_overhead_bytes
        self._nodes -= 1

    def sequences(self) -> list[tuple[tuple[int, ...], int]]:
        """Every root-to-leaf path with its leaf version (for inspection and tests)."""
        out: list[tuple[tuple[int, ...], int]] = []
        stack: list[tuple[_Node, tuple[int, ...]]] = [(c, c.edge) for c in self.root.children.values()]
        while stack:
            node, path = stack.pop()
            if not node.children:
                out.append((path, node.version))
            stack.extend((c, path + c.edge) for c in node.children.values())
        return out
