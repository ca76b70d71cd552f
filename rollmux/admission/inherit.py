"""Which new group of a re-partition takes over which old group's nodes, and which members stay
where they are (:func:`successions`), so that a re-partition moves only the jobs whose nodes change.

A re-partition replaces some groups by others over the same jobs (the neighbourhood
re-optimisation, the global plan). Each new group is laid out by
:func:`rollmux.admission.build_group` on nodes of its own naming; laid on fresh nodes, every member
would copy its host state. But a new group that keeps part of an old group (``{A, B}`` becomes
``{A, B, X}``, or ``{A, B, C}`` becomes ``{A, B}``) can often be laid on that group's nodes with
those members pinned exactly where they run now: then they do not move (no copy, no stall) and only
the others move in, as an admission packs a job into a running group.

A set ``K`` of members keeps its nodes under a layout iff the layout's nodes can be named after
the old group's so that each member of ``K`` is pinned to the very nodes it holds now: per pool,
for every non-empty set ``sigma`` of members of ``K``, as many layout nodes carry exactly
``sigma`` (of ``K``) as old nodes do (then the nodes of each such class map one to one, and a
member's nodes are the union of its classes). The layout's other nodes take the old group's nodes
left free (when its other members have left), then fresh ones. Each old group's nodes go to at
most one new group (its successor, which keeps its group id) and each new group succeeds at most
one old group, keeping *every* member it takes from it (a job never changes nodes inside one
group: the group's controller keeps a member's nodes); successors are chosen greedily by the copy
seconds they save. Source: extension of
RollMux §4.2 (direct packing keeps a group's members in place; a move is a host-state copy).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from rollmux.models import CoExecutionGroup

__all__ = ["Succession", "node_map", "successions"]

#: (successor's old group id or None, the members that keep their nodes, layout node -> old node
#: for those members' nodes)
Succession = tuple[Optional[str], frozenset, dict]


def _classes(pins: Mapping[str, tuple], keep: Sequence[str]) -> dict[frozenset, list[str]]:
    """Per non-empty set of ``keep`` members, the nodes (of ``pins``: job -> its nodes in one pool)
    carrying exactly those members of ``keep``, sorted."""
    on: dict[str, set] = {}
    for j in keep:
        for n in pins[j]:
            on.setdefault(n, set()).add(j)
    out: dict[frozenset, list[str]] = {}
    for n, js in on.items():
        out.setdefault(frozenset(js), []).append(n)
    return {k: sorted(v) for k, v in out.items()}


def node_map(layout: CoExecutionGroup, keep: Sequence[str], placements: Mapping[str, tuple]) -> Optional[dict]:
    """Layout node -> old node for the nodes of the members ``keep`` when each of them can keep its
    nodes (``placements``: job -> (rollout nodes, training nodes) now, all in one old group), else
    None (module docstring)."""
    if not keep:
        return {}
    mine = {m.spec.job_id: m.placement for m in layout.members}
    out: dict = {}
    for k in (0, 1):
        new = _classes({j: (mine[j].rollout_nodes, mine[j].train_nodes)[k] for j in keep}, keep)
        old = _classes({j: placements[j][k] for j in keep}, keep)
        if set(new) != set(old) or any(len(new[s]) != len(old[s]) for s in new):
            return None
        for s in new:
            out.update(zip(new[s], old[s]))
    return out


def successions(new_groups: Sequence[CoExecutionGroup], old_sets: Mapping[str, frozenset],
                placements: Mapping[str, tuple], weight: Mapping[str, float]) -> list[Succession]:
    """For each layout of ``new_groups``, in order: the old group it succeeds (a key of
    ``old_sets``: group id -> its job ids) or None, the members that keep their nodes and the node
    map of :func:`node_map`. ``weight``: per job, what keeping it saves (its copy seconds);
    ``placements``: job -> (rollout nodes, training
    nodes) now. Deterministic."""
    where = {j: gid for gid, s in old_sets.items() for j in s}
    options = []  # (saved, new index, old group id, kept, map)
    for i, g in enumerate(new_groups):
        by_old: dict[str, list[str]] = {}
        for j in g.job_ids:
            if j in where:
                by_old.setdefault(where[j], []).append(j)
        for gid, js in by_old.items():
            # every member of the new group that comes from the old one stays where it is (a job
            # never moves within one group: its group's controller keeps a member's nodes)
            nmap = node_map(g, sorted(js), placements)
            if nmap is not None:
                options.append((sum(weight.get(j, 0.0) for j in js) + 1e-9 * len(js), i, gid, frozenset(js), nmap))
    options.sort(key=lambda o: (-o[0], o[1], o[2]))
    out: list[Succession] = [(None, frozenset(), {})] * len(new_groups)
    taken_new, taken_old = set(), set()
    for _, i, gid, keep, nmap in options:
        if i in taken_new or gid in taken_old:
            continue
        taken_new.add(i)
        taken_old.add(gid)
        out[i] = (gid, keep, nmap)
    return out
