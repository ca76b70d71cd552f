"""A picklable, import-light binding of a job config to a phase function.

What travels to RollMux's pool workers is only ``(module, function name, config JSON)``; the
function is imported and the config validated on first call, under a process-wide lock. This
keeps unpickling free of imports, so several jobs registering on one worker at once (Ray actor
threads) never import and build the pydantic models concurrently.
"""

from __future__ import annotations

import importlib
import threading

_LOCK = threading.Lock()


class Bound:
    """``Bound(fn, cfg)(*args, **kw) == fn(cfg, *args, **kw)``; pickles as plain strings."""

    def __init__(self, fn, cfg) -> None:
        self.module, self.name = fn.__module__, fn.__name__
        self.cfg_json = cfg.model_dump_json()
        self.cfg_type = (type(cfg).__module__, type(cfg).__name__)
        self.__name__ = self.__qualname__ = fn.__name__
        self.__doc__ = fn.__doc__
        self._resolved = (fn, cfg)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_resolved"}

    def __setstate__(self, st: dict) -> None:
        self.__dict__.update(st)
        self._resolved = None

    def resolve(self):
        if self._resolved is None:
            with _LOCK:
                fn = getattr(importlib.import_module(self.module), self.name)
                model = getattr(importlib.import_module(self.cfg_type[0]), self.cfg_type[1])
                self._resolved = (fn, model.model_validate_json(self.cfg_json))
        return self._resolved

    def __call__(self, *args, **kwargs):
        fn, cfg = self.resolve()
        return fn(cfg, *args, **kwargs)


def register_phases(job, module, cfg, *, gather_rollout, gather_train):
    """Register a job's state builders and phases, each bound to ``cfg``, on a ``rollmux.Job``:
    ``module`` provides ``build_rollout_state``, ``build_train_state``, ``rollout_phase``,
    ``train_phase``, ``publish_weights`` and ``apply_weights`` (the example jobs' shape);
    ``gather_*`` merge the ranks' results. Returns the decorated ``(rollout, train, publish)``."""
    job.state("rollout")(Bound(module.build_rollout_state, cfg))
    job.state("train")(Bound(module.build_train_state, cfg))
    rollout = job.phase("rollout")(Bound(module.rollout_phase, cfg))
    train = job.phase("train")(Bound(module.train_phase, cfg))
    publish = job.phase("sync")(Bound(module.publish_weights, cfg))
    job.apply_weights(Bound(module.apply_weights, cfg))
    job.gather("rollout")(gather_rollout)
    job.gather("train")(gather_train)
    return rollout, train, publish
