"""The GlobalScheduler's policy table, as every service of the scheduler reads it.

The policy (:class:`rollmux.admission.InterGroupScheduler`, RollMux Alg. 1) owns the group table:
where every active job runs. It is *replaced* when the scheduler restores its checkpoint and
when a change that was not committed is rolled back (:class:`actors.scheduler.commit.Commit`), so
no service keeps the policy object itself: each holds this one :class:`PolicyRef` and reads
``ref.igs`` when it acts. Pure bookkeeping: no Ray, no I/O.
"""

from __future__ import annotations

from typing import Any, Optional

from rollmux.models import ClusterSpec

__all__ = ["PolicyRef"]


class PolicyRef:
    """The current policy table of one scheduler.

    Args:
        cluster: the cluster the table places jobs on.
        igs: the :class:`rollmux.admission.InterGroupScheduler` (set once the checkpoint is read).
    """

    def __init__(self, cluster: ClusterSpec, igs: Any = None):
        self.cluster = cluster
        self.igs = igs

    @property
    def config(self) -> Any:
        """The scheduler settings (:class:`rollmux.admission.SchedulerConfig`)."""
        return self.igs.config

    def nodes_in_use(self) -> set[str]:
        """Node ids of every group in the table."""
        return {n for g in self.igs.groups for n in (*g.rollout_nodes, *g.train_nodes)}

    def group_cost(self, group_id: str) -> Optional[float]:
        """The group's Cost(G), USD/h (RollMux §4.1); None once it dissolved."""
        if self.igs.group_snapshot(group_id) is None:
            return None
        return self.igs.group(group_id).cost_usd_per_h(self.cluster)

    def groups_on(self, nodes: set[str]) -> list[str]:
        """The groups using any of ``nodes``."""
        return [g.group_id for g in self.igs.groups if nodes.intersection((*g.rollout_nodes, *g.train_nodes))]
