"""Framework integrations: jobs whose phases run inside a framework's own code (RollMux §5).

A TRL or verl job keeps its trainer, engines and optimizer; it tells RollMux when each phase
starts and ends (``with job.permit("rollout"): ...``), RollMux grants the permits in the
co-execution group's round-robin order, says which pool nodes (and GPUs) to run on, and calls the
job's own offload / reload hooks around each phase. Plain mode (no cluster) runs the same code
with every permit granted at once.

- :mod:`rollmux.integrations.protocol`: spec derivation, offload hooks, the :class:`Permit`.
- :mod:`rollmux.integrations.permits`: :class:`PermitScope` (``Job.permit``), :class:`PhaseSequencer`.
- :mod:`rollmux.integrations.trl`: ``RollMuxGRPOTrainer`` (TRL 1.16), imported on demand.
- :mod:`rollmux.integrations.verl`: hooks for verl 0.9's v1 trainer and ``RayPPOTrainer``, imported on demand.

See docs/INTEGRATIONS.md.
"""

from rollmux.integrations.permits import PermitScope, PhaseSequencer, PlainPermits  # noqa: F401
from rollmux.integrations.protocol import (  # noqa: F401
    REQUIRED_FIELDS, Permit, SpecFieldMissing, Underivable, build_spec, offload_hooks,
)
