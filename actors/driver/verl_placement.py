"""verl's worker groups on the nodes RollMux assigned a job (the Ray side of the verl integration).

The hooks that put verl's phases under RollMux permits are pure (:mod:`rollmux.integrations.verl`);
this module adds the mechanism: verl builds its worker groups from Ray placement groups
(``verl.single_controller.ray.base.RayResourcePool.get_placement_groups``, one group per node of
``process_on_nodes`` bundles of ``{"CPU": max_colocate_count, "GPU": 1}``), which land wherever Ray
finds room. :class:`PinnedPlacement`, mixed into the trainer class, replaces the trainer's
``global_pool`` with one whose placement group ``i`` also asks for the ``rollmux_node:<id>``
resource of the job's ``i``-th RollMux training node (the resource every RollMux Ray node carries,
:mod:`rollmux.nodes`), so the actor / reference / critic (and hybrid rollout) workers run where the
scheduler placed the job. In plain mode (no placement) nothing changes.

Written against verl 0.9.1 (``tests/test_verl_integration.py`` checks the attributes used);
imports verl and Ray only when called. An end-to-end run needs GPUs and has not run here.
"""

from __future__ import annotations

from typing import Any

from rollmux.integrations.verl import node_bundles, rollmux_trainer_cls


def pinned_pool_manager(manager: Any, nodes_of_pool: dict[str, list[str]]) -> Any:
    """A copy of verl's ``ResourcePoolManager`` ``manager`` whose pools named in ``nodes_of_pool``
    create their placement groups on those RollMux nodes, in that order. Needs verl."""
    from verl.single_controller.ray.base import RayResourcePool

    class PinnedResourcePool(RayResourcePool):
        """A ``RayResourcePool`` whose placement groups carry RollMux node resources."""

        def __init__(self, *args, rollmux_nodes: list[str], **kwargs):
            super().__init__(*args, **kwargs)
            self.rollmux_nodes = list(rollmux_nodes)

        def get_placement_groups(self, strategy="STRICT_PACK", name=None, device_name="cuda"):
            if self.pgs is not None:
                return self.pgs
            import ray
            from ray.util.placement_group import placement_group

            schemes = node_bundles(list(self._store), self.rollmux_nodes, cpus=self.max_colocate_count,
                                   device="GPU" if self.use_gpu else None)
            prefix = name or f"{self.name_prefix}rollmux_"
            pgs = [placement_group(bundles=b, strategy=strategy, name=f"{prefix}{i}",
                                   lifetime="detached" if self.detached else None) for i, b in enumerate(schemes)]
            ray.get([pg.ready() for pg in pgs])
            self.pgs = pgs  # in the job's node order (rank i on node i)
            return pgs

    class PinnedResourcePoolManager(type(manager)):
        def create_resource_pool(self):
            super().create_resource_pool()
            for pool, nodes in nodes_of_pool.items():
                old = self.resource_pool_dict.get(pool)
                if old is None:
                    continue
                self.resource_pool_dict[pool] = PinnedResourcePool(
                    process_on_nodes=list(old._store), use_gpu=old.use_gpu, name_prefix=old.name_prefix,
                    max_colocate_count=old.max_colocate_count, rollmux_nodes=nodes)

    new = PinnedResourcePoolManager.__new__(PinnedResourcePoolManager)
    new.__dict__.update(manager.__dict__)
    return new


class PinnedPlacement:
    """Trainer mixin (before :class:`rollmux.integrations.verl.RollMuxV1Hooks`): after verl built its
    resource pool manager, the global pool is pinned to the job's RollMux training nodes."""

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        nodes = list((self.rollmux_job.info.get("placement") or {}).get("train_nodes") or [])
        if nodes:  # scheduled mode: the job's training nodes, in the placement's order
            self.resource_pool_manager = pinned_pool_manager(self.resource_pool_manager, {"global_pool": nodes})


def trainer_cls(base: type) -> type:
    """``base`` (a verl v1 trainer class) under RollMux permits, its global pool on the job's nodes."""
    return rollmux_trainer_cls(base, (PinnedPlacement,))


def register(name: str = "rollmux_sync") -> type:
    """Register ``PPOTrainerSync`` under RollMux permits, its pools on the job's nodes, as verl
    trainer mode ``name`` (``trainer.v1.trainer_mode=rollmux_sync``). Call it in verl's task
    runner process. Needs verl."""
    from rollmux.integrations.verl import register as register_hooks

    return register_hooks(name, (PinnedPlacement,))
