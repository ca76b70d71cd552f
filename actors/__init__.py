"""Ray mechanism for RollMux: the GlobalScheduler, GroupControllers and pool workers.

Everything here calls the pure policy in :mod:`rollmux`; no policy is re-implemented. Names and
the Ray bootstrap live in the leaf :mod:`actors.naming`.
"""

from actors.naming import NAMESPACE  # noqa: F401  (Ray namespace of every RollMux actor)
