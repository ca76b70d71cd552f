"""Cluster job traces for the trace-driven simulator: arrivals, durations, GPU counts.

Two input formats are read, detected from the header row:

* the Microsoft Philly job log as flattened by the Pollux artifact
  (``timestamp,duration,num_gpus,gpu_time,cluster``; rows unsorted, blank lines, naive
  timestamps ``YYYY-MM-DD HH:MM:SS``; see ``data/README.md``);
* a plain CSV ``arrival_s,duration_s,num_gpus`` (any extra columns are ignored), so that other
  traces can be replayed.

A :class:`TraceWindow` picks a slice: a start offset and a length (hours, from the earliest
arrival of the filtered trace), a job count, duration filters (minimum, cap) and an optional
Philly virtual-cluster filter. Arrivals are re-based so the first selected job arrives at 0 s.

Source: RollMux §7.5 (Philly arrival pattern); Pollux
``simulator/workload.py`` filters described in the trace README.
"""

from __future__ import annotations

import csv
import datetime as _dt
import gzip
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollmux.config import REPO_ROOT, repo_label

#: Default trace: the full Philly job log (82,247 jobs), shipped gzip-compressed in ``data/``
#: (provenance, checksum and licence in ``data/README.md``).
DEFAULT_TRACE = REPO_ROOT / "data" / "philly-adaptdl-philly.csv.gz"
#: Small extract of the same trace (215 rows; the tests use it).
EXTRACT_TRACE = REPO_ROOT / "data" / "philly_extract.csv"

_PHILLY_COLS = ("timestamp", "duration", "num_gpus")
_PLAIN_COLS = ("arrival_s", "duration_s", "num_gpus")


def trace_label(path: str | Path) -> str:
    """How a result file names the trace it replayed (:func:`rollmux.config.repo_label`): relative to
    the repository root for a trace inside it (``data/philly-adaptdl-philly.csv.gz``), else its name."""
    return repo_label(path)


class TraceError(ValueError):
    """A trace file is missing, has an unknown header, or a row is malformed (message names it)."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace.

    Attributes:
        index: position in the selected slice (0-based, arrival order).
        arrival_s: arrival time, seconds from the first selected arrival (>= 0).
        duration_s: run time at full speed, seconds (> 0), after the window's cap.
        num_gpus: GPUs the job used in the original trace (>= 1).
        cluster: Philly virtual-cluster id, or ``""`` for plain traces.
    """

    index: int
    arrival_s: float
    duration_s: float
    num_gpus: int
    cluster: str = ""


class TraceWindow(BaseModel):
    """Which slice of a trace to replay (all optional; units in the names).

    Attributes:
        start_hours: skip jobs arriving earlier than this offset from the earliest (filtered)
            arrival, hours (>= 0).
        length_hours: keep jobs arriving within this many hours after ``start_hours``.
        max_jobs: keep at most the first ``max_jobs`` jobs (arrival order) of the slice.
        min_duration_s: drop jobs shorter than this, seconds.
        max_duration_s: cap longer jobs' durations to this, seconds (a cap, not a filter).
        min_gpus: drop jobs that used fewer GPUs.
        cluster: keep only this Philly virtual cluster (``cluster`` column), e.g. ``"ee9e8c"``.

    Raises:
        pydantic.ValidationError: negative offsets, non-positive lengths, cap < minimum, a
            non-finite number or one above its bound (hours <= 1e6 h, durations <= 1e10 s,
            max_jobs <= 1e8, min_gpus <= 65,536).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    start_hours: float = Field(default=0.0, ge=0, le=1e6)
    length_hours: Optional[float] = Field(default=None, gt=0, le=1e6)
    max_jobs: Optional[int] = Field(default=None, gt=0, le=100_000_000)
    min_duration_s: float = Field(default=0.0, ge=0, le=1e10)
    max_duration_s: Optional[float] = Field(default=None, gt=0, le=1e10)
    min_gpus: int = Field(default=1, ge=1, le=65_536)
    cluster: Optional[str] = Field(default=None, max_length=128)

    @model_validator(mode="after")
    def _check(self) -> "TraceWindow":
        if self.max_duration_s is not None and self.max_duration_s < self.min_duration_s:
            raise ValueError(
                f"max_duration_s ({self.max_duration_s}) is below min_duration_s ({self.min_duration_s})"
            )
        return self


def _parse_philly_ts(s: str, where: str) -> float:
    try:
        # naive timestamps: read as UTC so that local DST never shifts differences
        t = _dt.datetime.strptime(s.strip(), "%Y-%m-%d %H:%M:%S")
        return t.replace(tzinfo=_dt.timezone.utc).timestamp()
    except ValueError as e:
        raise TraceError(f"{where}: timestamp {s!r} is not 'YYYY-MM-DD HH:MM:SS'") from e


def _num(s: str, what: str, where: str, cast=float):
    """A finite number from a CSV field; ``cast=int``: a whole number (``8`` or ``8.0``, not
    ``8.5``). Raises TraceError naming ``where`` (file:line) and the field."""
    try:
        v = float(s)
    except (TypeError, ValueError) as e:
        raise TraceError(f"{where}: field {what}: {s!r} is not a number") from e
    if not math.isfinite(v):
        raise TraceError(f"{where}: field {what}: {s.strip()!r} is not a finite number")
    if cast is int:
        if v != int(v):
            raise TraceError(f"{where}: field {what}: {s.strip()!r} is not a whole number")
        return int(v)
    return v


def read_raw(path: str | Path) -> list[tuple[float, float, int, str]]:
    """Rows ``(arrival_s, duration_s, num_gpus, cluster)`` of a trace, unsorted, blanks skipped.

    Philly arrivals are naive timestamps converted to seconds (only differences are used).

    Raises:
        TraceError: file missing or unreadable (bad gzip, not UTF-8), header matching neither
            format, malformed row (the message gives the file, line and field).
    """
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file not found: {p}")
    rows: list[tuple[float, float, int, str]] = []
    opener = gzip.open if p.suffix == ".gz" else open  # a ``.gz`` file is read decompressed
    try:
        with opener(p, "rt", newline="", encoding="utf-8-sig") as f:  # utf-8-sig: a byte-order mark is accepted
            reader = csv.reader(f)
            header = None
            for line_no, rec in enumerate(reader, start=1):
                if not rec or all(not c.strip() for c in rec):
                    continue  # blank line
                if header is None:
                    header = [c.strip() for c in rec]
                    if all(c in header for c in _PHILLY_COLS):
                        fmt, cols = "philly", _PHILLY_COLS
                    elif all(c in header for c in _PLAIN_COLS):
                        fmt, cols = "plain", _PLAIN_COLS
                    else:
                        raise TraceError(
                            f"{p}: unknown header {header}; expected columns {list(_PHILLY_COLS)} (Philly) "
                            f"or {list(_PLAIN_COLS)} (plain)"
                        )
                    idx = [header.index(c) for c in cols]
                    cl_idx = header.index("cluster") if "cluster" in header else None
                    continue
                where = f"{p}:{line_no}"
                if len(rec) < len(header):
                    raise TraceError(f"{where}: expected {len(header)} columns, got {len(rec)}")
                a, d, g = (rec[i] for i in idx)
                arrival = _parse_philly_ts(a, where) if fmt == "philly" else _num(a, "arrival_s", where)
                duration = _num(d, "duration" if fmt == "philly" else "duration_s", where)
                gpus = _num(g, "num_gpus", where, cast=int)
                if duration <= 0:
                    raise TraceError(f"{where}: field {'duration' if fmt == 'philly' else 'duration_s'}: must be > 0, got {duration}")
                if gpus < 1:
                    raise TraceError(f"{where}: field num_gpus: must be >= 1, got {gpus}")
                if fmt == "plain" and arrival < 0:
                    raise TraceError(f"{where}: field arrival_s: must be >= 0, got {arrival}")
                rows.append((arrival, duration, gpus, rec[cl_idx].strip() if cl_idx is not None else ""))
    except (OSError, EOFError, UnicodeDecodeError) as e:  # not gzip / truncated / not text
        raise TraceError(f"{p}: not a readable CSV trace{' (gzip)' if opener is gzip.open else ''}: {e}") from e
    if header is None:
        raise TraceError(f"{p}: empty trace (no header)")
    return rows


def load_trace(path: str | Path = DEFAULT_TRACE, window: TraceWindow | None = None) -> list[TraceJob]:
    """Read a trace and select a window of it, sorted by arrival.

    Args:
        path: Philly CSV or plain ``arrival_s,duration_s,num_gpus`` CSV.
        window: slice to keep (default: the whole trace).

    Returns:
        Jobs in arrival order (ties broken by file order), arrivals re-based to 0 s, durations
        capped at ``window.max_duration_s``.

    Raises:
        TraceError: bad file (see :func:`read_raw`) or an empty selection.
    """
    w = window or TraceWindow()
    raw = read_raw(path)
    kept = [
        r
        for r in raw
        if r[1] >= w.min_duration_s and r[2] >= w.min_gpus and (w.cluster is None or r[3] == w.cluster)
    ]
    kept.sort(key=lambda r: r[0])  # stable: file order breaks ties
    if not kept:
        raise TraceError(f"{path}: no job passes the window filters {w.model_dump(exclude_defaults=True)}")
    t0 = kept[0][0] + w.start_hours * 3600.0
    t1 = None if w.length_hours is None else t0 + w.length_hours * 3600.0
    sel = [r for r in kept if r[0] >= t0 and (t1 is None or r[0] < t1)]
    if w.max_jobs is not None:
        sel = sel[: w.max_jobs]
    if not sel:
        raise TraceError(f"{path}: the window {w.model_dump(exclude_defaults=True)} selects no job")
    base = sel[0][0]
    cap = w.max_duration_s
    return [
        TraceJob(
            index=i,
            arrival_s=a - base,
            duration_s=min(d, cap) if cap is not None else d,
            num_gpus=g,
            cluster=c,
        )
        for i, (a, d, g, c) in enumerate(sel)
    ]
