"""Durable commits of a hosted job's phases: what a lost worker's job resumes from (RollMux §5.1).

Every phase *commits* before it counts as done: after the offload, and before the permit is
released and the result returned, the worker writes the state the phase left (the storable
part, plus ``state_dict()`` of resident values that have one) and the phase's result to
``<prefix>.commit<k>.pt`` (temp file + rename; ``k`` = the driver's count of the job's phases on
that pool, :attr:`rollmux.messages.PhaseCall.pool_seq`; a sync's commit refers to the training
commit before it instead of copying the unchanged training state; the last
:data:`KEEP_COMMITS` are kept). Synced weights received on the rollout side are written too
(``<prefix>.weights.pt``, tagged with the rollout commit they follow), so a redone rollout
re-applies them. ``prefix`` = ``<checkpoint_dir>/<job>-<admission>-<pool>[-rank<r>]``.

:class:`Commits` is one hosted job's commit files on one worker (no Ray: torch + cloudpickle
files only; :func:`save_file` / :func:`load_file` write ``torch.save`` files where torch is loaded
and plain cloudpickle files where it is not, e.g. the emulated accelerators' import-light workers,
and read either). A phase redone after a lost worker starts from the commit before it
(:meth:`Commits.restore`); a missing commit, or a resident value whose state is kept outside the
commits (no ``state_dict``: a DeepSpeed or vLLM engine), raises :class:`WorkerLost` saying the
job cannot be recovered.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["KEEP_COMMITS", "WorkerLost", "Commits", "commit_files", "commit_seq", "load_bytes", "load_file", "save_file"]

KEEP_COMMITS = 3  # committed phase states kept per job, pool and rank (a redo needs the one before the last)


class WorkerLost(RuntimeError):
    """A phase was interrupted because one of the job's workers was lost (died, or restarted
    without the job's state). The driver redoes the phase from the job's last committed state.

    ``recoverable``: False when the state the redo needs is not committed (the message says what
    is missing): the job cannot go on, and the driver does not try."""

    def __init__(self, msg: str, recoverable: bool = True):
        super().__init__(msg)
        self.recoverable = bool(recoverable)  # an instance attribute: it survives pickling across Ray


def _commit_path(prefix: str, seq: int) -> Path:
    return Path(f"{prefix}.commit{seq}.pt")


def _weights_path(prefix: str) -> Path:
    return Path(f"{prefix}.weights.pt")


def commit_files(prefix: str) -> list[Path]:
    """The job's commit and weights files (and leftovers of interrupted writes) under ``prefix``."""
    p = Path(prefix)
    if not p.parent.is_dir():
        return []
    return [f for f in p.parent.iterdir() if f.name.startswith(p.name + ".commit") or f.name.startswith(p.name + ".weights")]


def commit_seq(path: Path) -> Optional[int]:
    """The phase number of a commit file (None for the weights file or a temp file)."""
    tail = path.name.rsplit(".commit", 1)[-1]
    return int(tail[:-3]) if tail.endswith(".pt") and tail[:-3].isdigit() else None


#: the first bytes of a ``torch.save`` file (a zip archive); other commit files are plain pickles
_ZIP_MAGIC = b"PK\x03\x04"


def save_file(obj: Any, path: Path) -> None:
    """Write ``obj`` to ``path``: ``torch.save`` (cloudpickle inside) when this process has torch
    loaded, else a plain cloudpickle file, so a worker whose jobs never load torch (emulated
    accelerators) never imports it. Not atomic (see :func:`_atomic_save`)."""
    from ray import cloudpickle

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.save(obj, path, pickle_module=cloudpickle)
    else:
        with open(path, "wb") as f:
            cloudpickle.dump(obj, f)


def load_bytes(data: bytes) -> Any:
    """The object of a file written by :func:`save_file` (or ``torch.save``), from its bytes."""
    if data[:4] == _ZIP_MAGIC:
        import torch

        return torch.load(io.BytesIO(data), weights_only=False)
    return pickle.loads(data)


def load_file(path: Path) -> Any:
    """The object of a file written by :func:`save_file` (or ``torch.save``); torch is imported
    only for a ``torch.save`` file."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head == _ZIP_MAGIC:
        import torch

        return torch.load(path, weights_only=False)
    with open(path, "rb") as f:
        return pickle.load(f)


def _atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(obj, tmp)
    os.replace(tmp, path)


class Commits:
    """One hosted job's commit files on one worker.

    Args:
        prefix: the files' path prefix (see the module docstring).
        where: the worker's node id and the job, for the errors' wording (``node``, ``job``, ``pool``).
    """

    def __init__(self, prefix: str, *, node: str, job: str, pool: str):
        self.prefix = prefix
        self.node, self.job, self.pool = node, job, pool

    def files(self) -> list[Path]:
        return commit_files(self.prefix)

    def last_seq(self) -> int:
        """The number of the newest commit on disk (0: none)."""
        return max((k for k in map(commit_seq, self.files()) if k is not None), default=0)

    def write(self, seq: int, phase: str, storable: dict, resident: dict, result: Any,
              admission: Optional[str]) -> float:
        """Write the state phase ``seq`` left and its result (atomic: temp file + rename), before
        the permit is released and the result returned, so a phase the driver saw finish is always
        committed. A sync leaves the training state as it was: its commit refers to the previous
        one instead of copying it. Keeps the last :data:`KEEP_COMMITS` commits. Returns seconds."""
        t0 = time.perf_counter()
        body: dict = {"rollmux_commit": 1, "seq": seq, "phase": phase, "result": result, "admission": admission}
        if phase == "sync" and seq > 1 and _commit_path(self.prefix, seq - 1).is_file():
            body["state_of"] = seq - 1
        else:
            body["state"] = storable
            body["resident_state"] = {k: v.state_dict() for k, v in resident.items() if hasattr(v, "state_dict")}
            # resident values whose state cannot be written (no state_dict: e.g. a DeepSpeed or vLLM
            # engine): a recovery from this commit would silently restart them, so it refuses
            body["resident_unsaved"] = {k: type(v).__name__ for k, v in resident.items() if not hasattr(v, "state_dict")}
        _atomic_save(body, _commit_path(self.prefix, seq))
        for f in self.files():
            k = commit_seq(f)
            if k is not None and k <= seq - KEEP_COMMITS:
                f.unlink(missing_ok=True)
        return time.perf_counter() - t0

    def load(self, seq: int) -> dict:
        """The commit of phase ``seq`` (a sync's: the state of the commit it refers to, with its own
        result). Raises :class:`WorkerLost` when it is missing."""
        path = _commit_path(self.prefix, seq)
        if not path.is_file():
            raise WorkerLost(f"worker on {self.node} was lost and job {self.job!r}'s state after its {self.pool} "
                             f"phase {seq} was not committed ({path.name} missing): it cannot be recovered",
                             recoverable=False)
        body = load_file(path)
        if "state_of" in body:
            body = {**self.load(int(body["state_of"])), "result": body.get("result")}
        return body

    def restore(self, state: dict, seq: int) -> dict:
        """``state`` (a fresh builder state) with the commit of phase ``seq - 1`` restored into it
        (nothing committed before phase 1: ``state`` as it is). Raises :class:`WorkerLost` when
        the commit is missing or a resident value's state is kept outside the commits."""
        from rollmux.phase_state import restore_state

        if seq <= 1:
            return state
        body = self.load(seq - 1)
        unsaved = body.get("resident_unsaved") or {}
        if unsaved:
            raise WorkerLost(f"worker on {self.node} was lost and job {self.job!r}'s state cannot be recovered: "
                             f"its resident {', '.join(f'{k} ({t})' for k, t in sorted(unsaved.items()))} "
                             "keeps state outside the commits (no state_dict)", recoverable=False)
        state = restore_state(state, dict(body["state"]))
        for k, sd in (body.get("resident_state") or {}).items():
            if hasattr(state.get(k), "load_state_dict"):
                state[k].load_state_dict(sd)
        return state

    def keep_weights(self, after: Optional[int], weights: dict) -> int:
        """Write received weights durably, tagged with the rollout commit they follow (``after``;
        None: nothing in memory, so the last commit on disk). Returns the tag."""
        if after is None:
            after = self.last_seq()
        _atomic_save({"after": after, "weights": weights}, _weights_path(self.prefix))
        return after

    def weights_after(self, seq: int) -> Optional[dict]:
        """The weights received after the commit of phase ``seq`` (not in it yet), or None."""
        wf = _weights_path(self.prefix)
        if not wf.is_file():
            return None
        w = load_file(wf)
        return w["weights"] if int(w.get("after", -1)) == seq else None

    def delete(self) -> None:
        """Delete every commit and weights file of the job here."""
        for f in self.files():
            f.unlink(missing_ok=True)
