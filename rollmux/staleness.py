"""The contract of an asynchronous (off-policy) RL job: its staleness bound, the policy version
each rollout uses, and its solo iteration time. Pure and dependency-free (the bottom of the
import graph: :mod:`rollmux.models` builds on it).

Versions. Version ``v`` of a job's policy is its weights after ``v`` training steps: version 0 is
the initial policy, training ``i`` consumes rollout ``i`` and produces version ``i + 1``, which sync
``i`` publishes to the rollout nodes. A job's *staleness bound* ``k`` (``JobSpec.max_staleness``)
lets rollout ``i`` use a version at most ``k`` steps old:

* ``k = 0``: the synchronous on-policy job of the paper (RollMux §3-§4): rollout ``i`` uses
  version ``i``, so it waits for sync ``i - 1``, and the job alternates rollout -> training -> sync.
* ``k >= 1``, mode ``exact``: rollout ``i`` uses exactly version ``max(0, i - k)``, whatever is
  newer; deterministic, so a co-executed run is bit-identical to its solo run.
* ``k >= 1``, mode ``bounded``: rollout ``i`` uses the newest version published when it starts,
  which is at least ``i - k`` (fresher weights, but which one depends on the schedule).

Either way rollout ``i`` may start only once sync ``i - k - 1`` has ended (:func:`gating_sync`), so
the two modes have the same schedule and the same times; they differ in which weights the rollout
applies and in the weight copies the rollout nodes hold (:func:`weight_copies`).

Solo time (:func:`solo_iteration_s`). Alone on its own pools, with phase times ``R`` (rollout),
``T`` (training) and ``S`` (sync, which holds the training nodes), seconds:
``T_solo = R + T + S`` for ``k = 0`` and ``max(R, T + S)`` for every ``k >= 1`` (a two-stage
pipeline; a larger ``k`` absorbs variation but does not raise the throughput). The derivation, the
dependency bubble, the worst case and worked cases are in ``rollmux/admission/README.md``
("Asynchronous jobs"). Source: extension of RollMux §3-§4 (the paper models synchronous jobs
only); the one-step-off-policy pipeline of verl (``recipe/one_step_off_policy``) is ``k = 1``.
"""

from __future__ import annotations

from typing import Literal, Optional

#: how an asynchronous job picks the weights of a rollout (module docstring)
StalenessMode = Literal["exact", "bounded"]
STALENESS_MODES: tuple[str, ...] = ("exact", "bounded")
#: largest staleness bound a job may declare (iterations); beyond a few, off-policy RL diverges
MAX_STALENESS = 16


class StalenessError(ValueError):
    """A rollout would use weights older than its job's bound (or, in ``exact`` mode, other
    weights than the ones its index prescribes)."""


def solo_iteration_s(t_roll_s: float, t_train_s: float, t_sync_s: float, max_staleness: int) -> float:
    """Steady-state solo iteration time of a job, seconds: ``t_roll_s + t_train_s + t_sync_s``
    for a synchronous job (``max_staleness == 0``, the paper's ``T_solo``), ``max(t_roll_s,
    t_train_s + t_sync_s)`` for an asynchronous one (rollout ``i + 1`` overlaps training ``i``).
    The one formula; :attr:`rollmux.models.PhaseProfile.t_solo_s` and the realised solo times call it.
    Raises ValueError for a negative bound."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    if max_staleness == 0:
        return t_roll_s + t_train_s + t_sync_s
    return max(t_roll_s, t_train_s + t_sync_s)


def pipeline_fill_s(t_roll_s: float, t_train_s: float, t_sync_s: float, max_staleness: int) -> float:
    """The one-off time an asynchronous job's first iteration takes beyond its steady solo
    iteration, seconds: ``min(t_roll_s, t_train_s + t_sync_s)`` (the pipeline fills: its first
    iteration takes ``R + T + S``); 0 for a synchronous job. Alone, ``n`` iterations take
    ``n x solo_iteration_s + pipeline_fill_s``."""
    return (t_roll_s + t_train_s + t_sync_s) - solo_iteration_s(t_roll_s, t_train_s, t_sync_s, max_staleness)


def gating_sync(rollout: int, max_staleness: int) -> Optional[int]:
    """The sync that must have ended before rollout ``rollout`` starts: ``rollout - k - 1``
    (it publishes version ``rollout - k``, the oldest the rollout may use); None when no sync is
    needed (version 0, the initial weights, is old enough)."""
    j = rollout - max_staleness - 1
    return j if j >= 0 else None


def oldest_version(rollout: int, max_staleness: int) -> int:
    """The oldest policy version rollout ``rollout`` may use: ``max(0, rollout - k)``."""
    return max(0, rollout - max_staleness)


def phase_version(phase: str, iteration: int, max_staleness: int) -> int:
    """The policy version a phase of index ``iteration`` works with, as its permit carries it
    (:class:`rollmux.messages.Grant` ``version``): a rollout's oldest allowed one
    (:func:`oldest_version`; ``exact``: the one it uses), the version training ``iteration``
    starts from (``iteration``), the version sync ``iteration`` publishes (``iteration + 1``)."""
    if phase == "rollout":
        return oldest_version(iteration, max_staleness)
    return iteration + 1 if phase == "sync" else iteration


def version_for(rollout: int, max_staleness: int, mode: str, published: int) -> int:
    """The policy version rollout ``rollout`` uses when versions ``0 .. published`` have been
    published to its rollout nodes: ``exact``: ``max(0, rollout - k)``; ``bounded`` (and
    ``k = 0``): ``published``, the newest.

    Raises :class:`StalenessError` when the version it needs is not published yet (the rollout
    must not start: the runtime refuses it) and ValueError for an unknown mode."""
    if mode not in STALENESS_MODES:
        raise ValueError(f"unknown staleness mode {mode!r} (known: {', '.join(STALENESS_MODES)})")
    need = oldest_version(rollout, max_staleness)
    if published < need:
        raise StalenessError(f"rollout {rollout} needs policy version >= {need} (staleness bound {max_staleness}); "
                             f"only versions up to {published} are published")
    if max_staleness > 0 and mode == "exact":
        return need
    return min(published, rollout)


def check_version(rollout: int, version: int, max_staleness: int, mode: str) -> None:
    """Check that rollout ``rollout`` used policy ``version`` within its job's contract:
    ``rollout - k <= version <= rollout`` (``bounded``, and ``k = 0`` where it means ``version ==
    rollout``), ``version == max(0, rollout - k)`` (``exact``). Raises :class:`StalenessError`."""
    lo = oldest_version(rollout, max_staleness)
    if not lo <= version <= rollout:
        raise StalenessError(f"rollout {rollout} used policy version {version}: outside [{lo}, {rollout}] "
                             f"(staleness bound {max_staleness})")
    if max_staleness > 0 and mode == "exact" and version != lo:
        raise StalenessError(f"rollout {rollout} used policy version {version}; exact staleness {max_staleness} "
                             f"prescribes version {lo}")


def weight_copies(max_staleness: int, mode: str) -> int:
    """Policy versions the rollout nodes hold in host memory at once: 1 for a synchronous job;
    for an asynchronous one the version the running rollout uses plus the newest published
    (``bounded``: 2), or every version published but not yet due (``exact``: up to ``k``) plus
    the one in use, ``k + 1``. :func:`rollmux.profiler.state_gb` counts them."""
    if max_staleness == 0:
        return 1
    return max_staleness + 1 if mode == "exact" else 2
