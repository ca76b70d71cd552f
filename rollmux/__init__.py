"""RollMux: phase-level multiplexing of disaggregated RL post-training jobs.

``rollmux/`` is pure policy and models (no Ray import): the simulator, the Ray actors
(``actors/``) and the HTTP app (``serve_app.py``) all call this package.
"""

__version__ = "0.1.0"

# Phase API (RollMux §5): the user-facing decorators; scheduled mode imports actors/ lazily.
from rollmux.phase_api import Job, parallel, phase, runtime_hook  # noqa: E402,F401

__all__ = ["Job", "parallel", "phase", "runtime_hook", "__version__"]
