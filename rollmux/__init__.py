"""RollMux: phase-level multiplexing of disaggregated RL post-training jobs.

``rollmux/`` is pure policy and models (no Ray import): the simulator, the Ray actors
(``actors/``) and the HTTP app (``serve_app.py``) all call this package.
"""

__version__ = "0.1.0"
