"""The policy table's snapshot and its copies, the part of
:class:`rollmux.admission.InterGroupScheduler` that writes the table out (:meth:`TableCopyMixin.snapshot`,
the checkpoint's format) and builds a copy that decides as the original does (:meth:`TableCopyMixin.restore`:
crash recovery, a rolled-back write, a what-if; :meth:`TableCopyMixin.load_groups`: a Serve replica
following the published changes), the order in which decisions visit the open groups included
(:meth:`TableCopyMixin.open_seq`).

A mixin of the scheduler (one class, several files): it uses the scheduler's own state
(``_groups``, ``_open``, ``_index``, ``_job_group``, ``_pools``, ``_next_group``, ``_version``,
``cluster``, ``config``, ``policy``, ``max_group_size``, ``seed``) and its ``_set_group``.
"""

from __future__ import annotations

from typing import Mapping, Optional

from rollmux.admission.config import SchedulerConfig
from rollmux.admission.groups import summarise_group
from rollmux.models import ClusterSpec, CoExecutionGroup, GroupMember

__all__ = ["TableCopyMixin", "group_of_snapshot"]


def group_of_snapshot(gd: "dict | CoExecutionGroup") -> CoExecutionGroup:
    """A group of the policy's table from its :meth:`InterGroupScheduler.group_snapshot` form (or
    the group itself: what the scheduler publishes to its followers)."""
    return gd if isinstance(gd, CoExecutionGroup) else CoExecutionGroup(
        group_id=gd["group_id"], rollout_nodes=tuple(gd["rollout_nodes"]), train_nodes=tuple(gd["train_nodes"]),
        members=tuple(GroupMember.model_validate(m) for m in gd["members"]))


def _seq_of(gd: "dict | CoExecutionGroup", seqs: Optional[Mapping[str, int]]) -> Optional[int]:
    """A copied group's place in the opening order: its snapshot's ``open_seq``, else ``seqs``'s
    entry for it (None: none known, the group goes last)."""
    if isinstance(gd, CoExecutionGroup):
        return None if seqs is None else seqs.get(gd.group_id)
    return gd.get("open_seq")


class TableCopyMixin:
    """The snapshot and copies of the policy table (see the module docstring)."""

    def open_seq(self, group_id: str) -> Optional[int]:
        """Where the group ``group_id`` stands in the order a decision visits the open groups (the
        order each was last (re)opened: a larger number was opened later); None when it is pruned
        (Alg. 1 line 4) or gone. A decision lists its candidates in this order (a tie of cost and
        bound goes to the lower group number), so a copy of the table (:meth:`restore`,
        :meth:`load_groups`) carries these numbers to explain its decisions alike."""
        e = self._index.entries.get(group_id)
        return None if e is None else e[0]

    def _order_open(self) -> None:
        """Put the open groups in their opening order (after groups were set at given places)."""
        entries = self._index.entries
        self._open = dict(sorted(self._open.items(), key=lambda kv: (entries[kv[0]][0], kv[0])))

    def snapshot(self) -> dict:
        """JSON-able state: policy, settings, groups with members (spec, profile, placement).
        The policy owns this format: ``{**snapshot_header(), "groups": [group_snapshot(g), ...]}``."""
        return {**self.snapshot_header(), "groups": [self.group_snapshot(gid) for gid in self._groups]}

    def snapshot_header(self) -> dict:
        """The snapshot without its groups: version, policy, settings and the next group number
        (group ids are never reused). A checkpoint may store it apart from the groups."""
        return {
            "version": 1,
            "policy": self.policy,
            "max_group_size": self.max_group_size,
            "seed": self.seed,
            "config": self.config.model_dump(),
            "next_group": self._next_group,
        }

    def group_snapshot(self, group_id: str) -> Optional[dict]:
        """One group of :meth:`snapshot` (``group_id, rollout_nodes, train_nodes, members,
        open_seq``: its :meth:`open_seq`), None once the group is gone."""
        g = self._groups.get(group_id)
        if g is None:
            return None
        return {
            "group_id": g.group.group_id,
            "rollout_nodes": list(g.group.rollout_nodes),
            "train_nodes": list(g.group.train_nodes),
            "members": [m.model_dump(mode="json") for m in g.group.members],
            "open_seq": self.open_seq(group_id),
        }

    def load_groups(self, header: Mapping, groups: Mapping[str, Optional[dict | CoExecutionGroup]],
                    open_seqs: Optional[Mapping[str, int]] = None) -> None:
        """Bring a copy of the table up to date with published changes: each group of ``groups``
        is replaced by its :meth:`group_snapshot` or the group itself (None: gone; an unknown id: a
        new group), and ``next_group`` taken from ``header`` (:meth:`snapshot_header`). Each open
        group takes its place in the opening order from its snapshot's ``open_seq`` or, for a
        group given as itself, ``open_seqs[group_id]`` (the table's :meth:`open_seq`; absent: last).
        Nodes are released before any is taken, so a change that moves nodes between groups
        applies in any order. Used by a follower (a Serve replica answering dry-runs) that holds
        the scheduler's table without deciding for it; the table equals what :meth:`restore` of
        the scheduler's snapshot gives, the order among open groups (the order a decision lists
        its candidates in) included. Raises ValueError on a malformed group."""
        try:
            for gid in groups:
                old = self._groups.get(gid)
                if old is None:
                    continue
                for m in old.group.members:
                    if self._job_group.get(m.spec.job_id) == gid:
                        del self._job_group[m.spec.job_id]
                self._pools["rollout"].give(old.group.rollout_nodes)
                self._pools["train"].give(old.group.train_nodes)
            for gid, gd in groups.items():
                if gd is None:
                    if gid in self._groups:
                        self._set_group(gid, None)
                    continue
                grp = group_of_snapshot(gd)
                self._pools["rollout"].take(grp.rollout_nodes)
                self._pools["train"].take(grp.train_nodes)
                self._set_group(gid, summarise_group(grp, self.cluster), _seq_of(gd, open_seqs))
                for m in grp.members:
                    self._job_group[m.spec.job_id] = gid
            self._order_open()
            self._next_group = max(self._next_group, int(header.get("next_group", self._next_group)))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed group snapshot: missing or bad {e}") from e
        self._version += 1

    @classmethod
    def restore(cls, cluster: ClusterSpec, snapshot: dict) -> "InterGroupScheduler":
        """Rebuild a scheduler from :meth:`snapshot` output (its ``groups`` may also be the group
        objects themselves, their places in the opening order then in ``snapshot["open_seqs"]``,
        group id -> :meth:`open_seq`; groups without one, from an older release's checkpoint, come
        first in table order). The copy decides as
        the original does and lists the same candidates in the same order. Raises ValueError on a
        malformed snapshot (pydantic messages name the field)."""
        try:
            cfg = SchedulerConfig.model_validate({**snapshot.get("config", {}), "policy": snapshot["policy"],
                                                  "max_group_size": snapshot["max_group_size"], "seed": snapshot["seed"]})
            s = cls(cluster, policy=cfg.policy, max_group_size=cfg.max_group_size, seed=cfg.seed, config=cfg)
            s._next_group = int(snapshot["next_group"])
            seqs = snapshot.get("open_seqs")
            groups = list(snapshot["groups"])
            for i, gd in enumerate(groups):
                grp = group_of_snapshot(gd)
                s._pools["rollout"].take(grp.rollout_nodes)
                s._pools["train"].take(grp.train_nodes)
                seq = _seq_of(gd, seqs)
                # a group written without its place (a checkpoint of an older release) was last
                # opened before every group written with one: first, in table order
                s._set_group(grp.group_id, summarise_group(grp, cluster), i - len(groups) if seq is None else seq)
                for m in grp.members:
                    s._job_group[m.spec.job_id] = grp.group_id
            s._order_open()
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed scheduler snapshot: missing or bad {e}") from e
        return s

