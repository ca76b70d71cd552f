"""Ray mechanism for RollMux: the GlobalScheduler, GroupControllers and pool workers.

Everything here calls the pure policy in :mod:`rollmux`; no policy is re-implemented. Names and
the Ray bootstrap live in the leaf :mod:`actors.naming`; every Ray call to one of these actors goes
through :mod:`actors.handles`, carrying the messages of :mod:`rollmux.messages`.
"""

from actors.naming import NAMESPACE  # noqa: F401  (Ray namespace of every RollMux actor)
