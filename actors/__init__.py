"""Ray mechanism for RollMux: the GlobalScheduler, GroupControllers and pool workers.

Everything here calls the pure policy in :mod:`rollmux`; no policy is re-implemented.
"""

#: Ray namespace of every RollMux actor (scheduler, group controllers, workers).
NAMESPACE = "rollmux"
