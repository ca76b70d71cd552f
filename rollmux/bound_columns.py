"""The pieces of the column generation behind :func:`rollmux.partition_bound.lp_lower_bound` (and
the global plan's master): per-job rows, the set floors ``L(S)`` and the monotone pruning floor,
the restricted master LP with its subset-row cuts, and the pricing search over the relaxed column
space. ``rollmux/partition_bound.py``'s module docstring states the problem, the floors' rules and
why the bound they give is proven; this module holds the code, moved there verbatim.

Source: RollMux §7.5 ("Opt"); column generation as in Lasdon (1970), Vanderbeck & Wolsey (1996);
subset-row cuts as in Jepsen, Petersen, Spoorendonk & Pisinger (2008).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import numpy as np

from rollmux.admission.layouts import job_layout_needs
from rollmux.models import JobSpec, PhaseProfile

#: Relative tolerance of the node-load comparisons (as :data:`rollmux.admission.rules.SLO_REL_TOL`).
_TOL = 1e-9
#: A column is "negative" below this reduced cost, USD/h.
_RC_EPS = 1e-4


def _rows(members: Sequence[tuple[JobSpec, PhaseProfile]], cluster) -> list[tuple]:
    """Per job: ``(NR nodes, NT nodes, rollout s per node, training + sync s per node,
    B = slo x T_solo, T_solo)``."""
    out = []
    for j, p in members:
        nr, nt, _, _ = job_layout_needs(j, cluster)
        out.append((nr, nt, p.t_roll_s, p.t_train_node_s, j.slo * p.t_solo_s, p.t_solo_s))
    return out


def _at_cadence(rows: Sequence[tuple]) -> Optional[list[tuple]]:
    """The meta-iteration rule (:func:`rollmux.admission.rules.cadence_bound`): the members of a
    layout share one cadence, so every node carries at most the least budget ``B_min`` and
    every member's solo time fits it. ``rows`` with every budget set to ``B_min``, or None when
    some solo time exceeds it (no layout of the set is feasible)."""
    b_min = min(r[4] for r in rows)
    if max(r[5] for r in rows) > b_min * (1 + _TOL) + 1e-9:
        return None
    return [(r[0], r[1], r[2], r[3], b_min, r[5]) for r in rows]


def _carried(items: Iterable[tuple[float, float]], n_nodes: int, cap: float = math.inf) -> bool:
    """Whether ``n_nodes`` nodes can carry work ``w`` (phase-seconds, all of a job's nodes) of
    jobs of budget ``b`` (``(b, w)`` pairs) under the node-load rule, each node at most ``cap``
    (a budget every node shares): for every ``tau``, the nodes holding a job of budget
    ``<= tau`` carry at most ``min(tau, cap)`` each (module docstring)."""
    acc = 0.0
    for b, w in sorted(items):
        acc += w
        if acc > n_nodes * min(b, cap) * (1 + _TOL) + 1e-9:
            return False
    return True


def _pool_ok(rows: Sequence[tuple], n_col: int, t_col: int, n_nodes: int) -> bool:
    """Node-load test of one pool of ``n_nodes`` nodes: the jobs needing ``n_nodes`` span the set
    (on every node), so every node carries their phases and at most their least budget, each
    job's nodes carry its own phase besides theirs, and :func:`_carried` holds."""
    span = [r for r in rows if r[n_col] == n_nodes]
    cap = min((r[4] for r in span), default=math.inf)
    # every node carries the spanning jobs' phases, so each job's nodes carry them plus its own
    w_span = sum(r[t_col] for r in span)
    if any((w_span if r[n_col] == n_nodes else w_span + r[t_col]) > r[4] * (1 + _TOL) + 1e-9 for r in rows):
        return False
    return _carried(((r[4], r[n_col] * r[t_col]) for r in rows), n_nodes, cap)


def floor_usd_per_h(rows: Sequence[tuple], price_r: float, price_t: float) -> float:
    """``L(S)`` of the module docstring for the jobs ``rows`` (:func:`_rows`), USD/h: the price of
    the cheapest layout of :func:`rollmux.admission.build_group`'s class (``max NT`` training
    nodes; jobs on dedicated rollout nodes or sharing ``max NR`` of the rest) whose pools pass
    the node-load test of :func:`_pool_ok`; ``inf`` when none does (no layout can keep every
    member's node-load rule)."""
    rows = _at_cadence(rows)
    if rows is None:
        return math.inf
    n_t = max(r[1] for r in rows)
    if not _pool_ok(rows, 1, 3, n_t):
        return math.inf
    from rollmux.admission.layouts import _rollout_layouts

    for n_nodes, _, mask in _rollout_layouts(tuple(r[0] for r in rows)):
        shared = [r for i, r in enumerate(rows) if not mask >> i & 1]
        if not shared or _pool_ok(shared, 0, 2, max(r[0] for r in shared)):
            return n_t * price_t + n_nodes * price_r
    return math.inf  # pragma: no cover - all dedicated always passes


def prune_floor_usd_per_h(rows: Sequence[tuple], price_r: float, price_t: float, nt_cap: int) -> float:
    """A monotone lower bound on :func:`floor_usd_per_h` of every superset of ``rows`` whose
    training nodes are at most ``nt_cap`` (the pricing search's pruning): ``inf`` when no such
    superset can pass the training test; never decreases when a job is added."""
    rows = _at_cadence(rows)  # B_min only falls and the solo times only grow as jobs join
    if rows is None or not _carried(((r[4], r[1] * r[3]) for r in rows), nt_cap):
        return math.inf
    acc, need = 0.0, max(r[0] for r in rows)
    for b, w in sorted((r[4], r[0] * r[2]) for r in rows):
        acc += w
        need = max(need, math.ceil(acc / (b * (1 + _TOL)) - 1e-9))
    return max(r[1] for r in rows) * price_t + need * price_r


class _Master:
    """The restricted master LP of one bound computation, kept across its column-generation and
    cut rounds: covering LP ``min c x, sum_{S ∋ j} x_S >= 1, x >= 0`` by GLOP, plus one
    subset-row cut ``sum_S floor(|S ∩ R| / 2) x_S <= floor(|R| / 2)`` per job set ``R`` of the
    cuts. Columns and cuts are only ever added (:meth:`sync`), so the model is extended in place
    and GLOP re-solves from its last basis instead of a model rebuilt every round.
    ``cut_coefs[c]``: ``{column index: coefficient}`` of cut ``c`` (its non-zeros)."""

    def __init__(self, ids: list[str]):
        from ortools.linear_solver import pywraplp

        self._pw = pywraplp
        self._s = pywraplp.Solver.CreateSolver("GLOP")
        inf = self._s.infinity()
        self.ids = ids
        self._cons = {j: self._s.Constraint(1.0, inf) for j in ids}
        self._obj = self._s.Objective()
        self._obj.SetMinimization()
        self.keys: list[frozenset] = []
        self._xs: list = []
        self.cuts: list[frozenset] = []
        self._cut_cons: list = []
        self.cut_coefs: list[dict[int, int]] = []

    def sync(self, cols: dict, cuts: Sequence[frozenset] = ()) -> None:
        """Adds the columns of ``cols`` (``{job set: USD/h}``, insertion-ordered, of which the
        master holds a prefix) and the cuts of ``cuts`` (of which it holds a prefix) it lacks."""
        s, inf = self._s, self._s.infinity()
        items = list(cols.items())
        if self.keys and (len(items) < len(self.keys) or items[len(self.keys) - 1][0] != self.keys[-1]):
            raise ValueError("_Master.sync: the columns are not an extension of the master's")
        for key, c in items[len(self.keys):]:
            i = len(self.keys)
            x = s.NumVar(0.0, inf, "")
            for j in key:
                self._cons[j].SetCoefficient(x, 1.0)
            self._obj.SetCoefficient(x, c)
            for r, k, coefs in zip(self.cuts, self._cut_cons, self.cut_coefs):
                a = len(key & r) // 2
                if a:
                    k.SetCoefficient(x, float(a))
                    coefs[i] = a
            self.keys.append(key)
            self._xs.append(x)
        new = list(cuts[len(self.cuts):])
        for r, coefs in zip(new, _cut_rows(self.keys, new)):
            k = s.Constraint(-inf, float(len(r) // 2))
            for i, a in coefs.items():
                k.SetCoefficient(self._xs[i], float(a))
            self.cuts.append(r)
            self._cut_cons.append(k)
            self.cut_coefs.append(coefs)

    def solve(self):
        """(value, duals by job id (``>= 0``), duals by cut (``<= 0``), the primal ``x`` in the
        columns' order)."""
        if self._s.Solve() != self._pw.Solver.OPTIMAL:  # pragma: no cover - singletons make it feasible
            raise RuntimeError("restricted master LP not solved")
        return (self._obj.Value(), {j: max(0.0, self._cons[j].dual_value()) for j in self.ids},
                [min(0.0, k.dual_value()) for k in self._cut_cons], [x.solution_value() for x in self._xs])


def _cut_rows(keys: Sequence[frozenset], cuts: Sequence[frozenset]) -> list[dict[int, int]]:
    """Per subset-row cut over ``r``: ``{column index: floor(|key ∩ r| / 2)}`` over the columns
    ``keys`` whose coefficient is not 0, found through the columns holding each of its jobs."""
    holding: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        for j in key:
            holding.setdefault(j, []).append(i)
    out = []
    for r in cuts:
        hits: dict[int, int] = {}
        for j in r:
            for i in holding.get(j, ()):
                hits[i] = hits.get(i, 0) + 1
        out.append({i: h // 2 for i, h in hits.items() if h >= 2})
    return out


_MAX_CYCLES = 20000  # 5-job candidates per separation round
_MAX_PATHS = 200_000  # open paths kept per start job while 5-cycles are enumerated


def _separate_subset_rows(cols: list[tuple[frozenset, float]], x: Sequence[float], have: set,
                          limit: int, min_violation: float = 0.05) -> list[frozenset]:
    """Up to ``limit`` job sets ``R`` of 3 or 5 jobs (not in ``have``) whose subset-row cut
    ``sum_S floor(|S ∩ R| / 2) x_S <= floor(|R| / 2)`` the master's solution ``x`` violates by
    more than ``min_violation``, most violated first. The groups of a partition are disjoint, so
    their ``|S ∩ R|`` sum to at most ``|R|`` and the cut holds for every partition (Jepsen,
    Petersen, Spoorendonk & Pisinger 2008; the 5-job cut is the odd-hole cut of five pairs at
    one half). Candidates: paths of two pairs and cycles of five pairs that fractional columns
    hold (at most ``_MAX_CYCLES`` cycles, in order of their least job, from at most
    ``_MAX_PATHS`` open paths per start job: a candidate list, not a proof, so a cut left out only
    leaves the bound where it was); the violations are summed over all candidates at once."""
    frac = [(key, v) for (key, _), v in zip(cols, x) if 1e-6 < v < 1 - 1e-6 and len(key) >= 2]
    if not frac:
        return []
    names = sorted({j for key, _ in frac for j in key})
    at = {j: i for i, j in enumerate(names)}
    m = len(names)
    held = np.zeros((len(frac), m), dtype=np.int8)  # held[f, j]: fractional column f holds job j
    for f, (key, _) in enumerate(frac):
        held[f, [at[j] for j in key]] = 1
    adj = (held.T.astype(np.int32) @ held) > 0  # two jobs of one fractional column
    np.fill_diagonal(adj, False)
    sets = []
    for b_ in range(m):  # triples: a - b - c
        nb = np.flatnonzero(adj[b_])
        if len(nb) >= 2:
            i, k = np.triu_indices(len(nb), 1)
            sets.append(np.sort(np.stack([nb[i], np.full(len(i), b_), nb[k]], axis=1), axis=1))
    triples = np.unique(np.concatenate(sets), axis=0) if sets else np.zeros((0, 3), dtype=np.int64)
    cycles = np.zeros((0, 5), dtype=np.int64)
    if m <= 60:  # simple 5-cycles, each through its least job, at most _MAX_CYCLES of them
        found_c, n_c = [], 0
        for st in range(m):
            paths = np.array([[st]], dtype=np.int64)
            for _ in range(4):
                ok = adj[paths[:, -1]] & (np.arange(m) > st)[None, :]
                ok[np.arange(len(paths))[:, None], paths] = False
                r, w = np.nonzero(ok)
                paths = np.hstack([paths[r], w[:, None]])[:_MAX_PATHS]  # a dense graph: its first paths
                if not len(paths):
                    break
            if len(paths):
                closed = np.unique(np.sort(paths[adj[paths[:, -1], st]], axis=1), axis=0)
                found_c.append(closed)
                n_c += len(closed)
                if n_c >= _MAX_CYCLES:
                    break
        if found_c:
            cycles = np.concatenate(found_c)[:_MAX_CYCLES]
    xv = np.array([v for _, v in frac], dtype=float)
    found = []
    for cand in (triples, cycles):
        if not len(cand):
            continue
        for c0 in range(0, len(cand), 4000):
            part = cand[c0:c0 + 4000]
            lhs = xv @ (held[:, part].sum(axis=2) // 2)  # sum_S x_S floor(|S ∩ R| / 2)
            rhs = part.shape[1] // 2
            for t in np.flatnonzero(lhs > rhs + min_violation).tolist():
                r = frozenset(names[q] for q in part[t].tolist())
                if r not in have:
                    found.append((round(float(lhs[t]) - rhs, 9), r))  # ties: by the job names
    found.sort(key=lambda t: (-t[0], sorted(t[1])))
    out, used = [], {}
    for _, r in found:  # spread the cuts: each job in at most two new ones per round
        if all(used.get(j, 0) < 2 for j in r):
            out.append(r)
            for j in r:
                used[j] = used.get(j, 0) + 1
        if len(out) >= limit:
            break
    return out


def _price(ids, rows, pi, known, raised, max_size, price_r, price_t, keep: int, mode: str = "first",
           floors: Optional[dict] = None, skip=(), cuts: Sequence[tuple[frozenset, float]] = ()):
    """Pricing over the relaxed column space (exact price where ``known`` has it, None there =
    not a column; otherwise the floor, or the larger price ``raised`` proves; ``floors`` caches
    the floors by job set; ``skip``: the master's columns, never collected; ``cuts``: subset-row
    cuts ``(job set, dual <= 0)``, a set holding ``h`` jobs of one pays ``-dual x floor(h / 2)``).

    The search enumerates job sets level by level (sets of 1, 2, ... ``max_size`` jobs, each
    extended only by jobs of lower dual than all its members), vectorised over each level with
    numpy, and extends a set only while ``prune_floor_usd_per_h(S) - (pi(S) - penalty(S) + the
    largest duals that can still join) < 0`` (the floor is monotone and the penalties only grow
    with the set, so no pruned subtree holds a negative column). A set itself is a candidate
    only when that floor is below ``pi(S) - penalty(S)``: every column's price is at least it
    (exact layouts and raised floors are above ``L(S)``, itself above the pruning floor; the
    per-job and policy-priced columns that may be cheaper are in the master, ``skip``).
    Candidates are priced most promising first.

    ``mode="first"``: up to ``keep`` columns of reduced cost ``cost(S) - pi(S) < 0``, the search
    stopping once it has them (an empty answer proves none exists). ``mode="farley"``: the least
    ratio ``theta = min cost(S) / pi(S)`` (at most 1; a lower bound on the true one).
    Returns ``(theta or None, [(rc, key, exact, pi(S) - penalty(S))])``; ``"farley"`` reads no cuts."""
    n = len(ids)
    order = sorted(range(n), key=lambda k: -pi[ids[k]])
    oid = [ids[k] for k in order]
    pv = np.array([pi[i] for i in oid], dtype=float)
    rr = [rows[k] for k in order]
    # per job: B / (1 + tol), training phase-seconds on all its nodes, rollout ditto, NR, NT
    bb = np.array([r[4] * (1 + _TOL) for r in rr], dtype=float)
    solo = np.array([r[5] for r in rr], dtype=float)
    wt = np.array([r[1] * r[3] for r in rr], dtype=float)
    wr = np.array([r[0] * r[2] for r in rr], dtype=float)
    nr = np.array([r[0] for r in rr], dtype=float)
    nt = np.array([r[1] for r in rr], dtype=float)
    tt = np.array([r[3] for r in rr], dtype=float)
    nt_cap = max(r[1] for r in rows)
    # top[i, m]: the m largest duals among positions >= i (sorted by dual: a run of them)
    cs = np.concatenate([[0.0], np.cumsum(pv)])
    pos = np.arange(n + 1)[:, None] + np.arange(max_size + 1)[None, :]
    top_tab = cs[np.minimum(pos, n)] - cs[np.arange(n + 1)][:, None]
    farley = mode == "farley"
    live = [(r, -d) for r, d in cuts if d < -1e-12] if not farley else []
    where = {j: t for t, j in enumerate(oid)}
    if live:
        memb = np.zeros((n, len(live)), dtype=np.int8)
        for c, (r, _) in enumerate(live):
            for j in r:
                if j in where:
                    memb[where[j], c] = 1
        wcut = np.array([w for _, w in live], dtype=float)
    floors = {} if floors is None else floors
    found: list[tuple[float, frozenset, bool, float]] = []
    theta = 1.0
    chunk = 200_000
    # Per set of the frontier, its aggregates, extended job by job as the set grows (each child is
    # its parent plus one job of lower dual; sums in member order, so the same floats as summing
    # the members): least budget, largest solo time, training / rollout phase-seconds, largest NR,
    # largest NT, training s per node of the members needing that many (the spanning ones), sum
    # of NT x training s, largest training s of the others (-inf: none) and of all, dual sum,
    # and per live cut the members it holds.
    one = np.arange(n, dtype=np.int32)
    agg = {"b": bb, "solo": solo, "wt": wt, "wr": wr, "nr": nr, "nt": nt, "wspan": tt, "ntt": nt * tt,
           "tt_other": np.full(n, -np.inf), "tt_all": tt, "ps": pv}
    frontier, state = one[:, None], {k_: v[one] for k_, v in agg.items()}
    if live:
        state["cc"] = memb[one]  # int8: a set holds at most max_size jobs of a cut
    for k in range(1, max_size + 1):
        nxt, nxt_state = [], []
        for c0 in range(0, len(frontier), chunk):
            sets = frontier[c0:c0 + chunk]
            a = {k_: v[c0:c0 + chunk] for k_, v in state.items()}
            # prune_floor_usd_per_h at the set's cadence: every budget is the least one, B_min
            b_min = a["b"]
            feasible = (a["solo"] <= b_min + 1e-9) & (a["wt"] <= nt_cap * b_min + 1e-9)
            need = np.maximum(np.ceil(a["wr"] / b_min - 1e-9), a["nr"])
            n_t = a["nt"]
            lo = np.where(feasible, n_t * price_t + need * price_r, np.inf)
            # the set's own floor L(S) is at least lo, and infinite when its training pool of
            # n_t = max NT nodes fails the node-load test (_pool_ok; a looser tolerance here):
            # a spanning member's node carries the spanning phases, another's its own besides
            own_ok = (((a["wspan"] + np.maximum(a["tt_other"], 0.0)) <= b_min + 1e-6)
                      & (a["ntt"] <= n_t * b_min + 1e-6))
            own = np.where(own_ok, lo, np.inf)
            ps = a["ps"]
            if live:
                ps = ps - (a["cc"] // 2) @ wcut
            room = max_size - k
            top = ps + top_tab[sets[:, -1] + 1, room]
            # no set containing this one (and only jobs of lower dual) prices below lo - top,
            # nor at a ratio below lo / top
            promising = np.isfinite(lo) & ((lo < top * theta) if farley else (lo - top < -_RC_EPS))
            if farley:
                cand = np.flatnonzero(promising & (ps > 0) & (own < ps * theta))
                cand = cand[np.argsort(own[cand] / ps[cand], kind="stable")]
            else:
                cand = np.flatnonzero(promising & (own - ps < -_RC_EPS))
                cand = cand[np.argsort(own[cand] - ps[cand], kind="stable")]
            for t in cand.tolist():
                p = float(ps[t])
                if farley and not own[t] < p * theta:
                    continue
                key = frozenset(oid[q] for q in sets[t].tolist())
                if not farley and key in skip:
                    continue
                if key in known:
                    cost, exact = (math.inf if known[key] is None else known[key]), True
                else:
                    f = floors.get(key)
                    if f is None:
                        f = floors[key] = floor_usd_per_h([rr[q] for q in sets[t].tolist()], price_r, price_t)
                    cost, exact = max(f, raised.get(key, 0.0)), False
                if farley:
                    if cost < p * theta:
                        theta = cost / p
                elif cost - p < -_RC_EPS:
                    found.append((cost - p, key, exact, p))
                    if len(found) >= keep:
                        found.sort(key=lambda x: x[0])
                        return None, found
            if room > 0:
                keep_rows = np.flatnonzero(promising)
                last = sets[keep_rows, -1]
                cnt = n - 1 - last
                if cnt.sum() > 0:
                    rep = np.repeat(keep_rows, cnt)
                    start = np.cumsum(cnt) - cnt
                    child = (last.repeat(cnt) + 1 + (np.arange(len(rep)) - np.repeat(start, cnt))).astype(np.int32)
                    nxt.append(np.hstack([sets[rep], child[:, None]]))
                    nxt_state.append(_extend(a, rep, child, agg, memb if live else None))
        if not nxt:
            break
        frontier = np.concatenate(nxt)
        state = {k_: np.concatenate([s_[k_] for s_ in nxt_state]) for k_ in nxt_state[0]}
    found.sort(key=lambda x: x[0])
    return (theta if farley else None), found



def _extend(a: dict, rep: np.ndarray, child: np.ndarray, agg: dict, memb: Optional[np.ndarray]) -> dict:
    """The aggregates of :func:`_price`'s frontier sets (``a``, per set) for the children
    ``a``'s set ``rep[i]`` plus job ``child[i]`` (``agg``: the per-job values; ``memb``: per job
    its live cuts, or None)."""
    nt_p, nt_c, tt_c = a["nt"][rep], agg["nt"][child], agg["tt_all"][child]  # per job: its training s per node
    up, same = nt_c > nt_p, nt_c == nt_p
    wspan_p, other_p, all_p = a["wspan"][rep], a["tt_other"][rep], a["tt_all"][rep]
    out = {
        "b": np.minimum(a["b"][rep], agg["b"][child]),
        "solo": np.maximum(a["solo"][rep], agg["solo"][child]),
        "wt": a["wt"][rep] + agg["wt"][child],
        "wr": a["wr"][rep] + agg["wr"][child],
        "nr": np.maximum(a["nr"][rep], agg["nr"][child]),
        "nt": np.maximum(nt_p, nt_c),
        # a job needing more training nodes than every member spans the set alone; one needing as
        # many joins the spanning ones; one needing fewer is another's
        "wspan": np.where(up, tt_c, np.where(same, wspan_p + tt_c, wspan_p)),
        "ntt": a["ntt"][rep] + agg["ntt"][child],
        "tt_other": np.where(up, all_p, np.where(same, other_p, np.maximum(other_p, tt_c))),
        "tt_all": np.maximum(all_p, tt_c),
        "ps": a["ps"][rep] + agg["ps"][child],
    }
    if memb is not None:
        out["cc"] = a["cc"][rep] + memb[child]
    return out


class _FloorCache(dict):
    """``L(S)`` by job set, stored on the optimum (``OptimalPartition._lb_floors``) so that later
    instants reuse it; each new set is indexed by its jobs, so ``OptimalPartition.forget`` drops
    it with them."""

    def __init__(self, opt):
        super().__init__()
        self._opt = opt

    def get(self, key, default=None):
        return self._opt._lb_floors.get(key, default)

    def __setitem__(self, key, value):
        if key not in self._opt._lb_floors:
            self._opt._remember(key)
        self._opt._lb_floors[key] = value
