"""Shared helpers of the benchmark scripts (not a benchmark itself)."""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

#: Fewest samples for a percentile to be reported (else ``None``): p50 any, p90 100, p99 1,000;
#: with fewer, a "p99" is just the largest sample or close to it.
MIN_SAMPLES = {50: 1, 90: 100, 99: 1000}


def percentiles(lat_ms: Iterable[float], digits: Optional[int] = None) -> dict:
    """``{samples, p50_ms, p90_ms, p99_ms, max_ms}`` of latencies in ms; a percentile with fewer
    samples than :data:`MIN_SAMPLES` requires is ``None`` (``samples`` says how many there were).
    ``digits`` rounds the figures. Raises ValueError on no samples."""
    a = np.asarray(list(lat_ms), dtype=float)
    if a.size == 0:
        raise ValueError("no latency samples")
    r = (lambda x: round(x, digits)) if digits is not None else (lambda x: x)  # noqa: E731
    out: dict = {"samples": int(a.size)}
    for q, need in MIN_SAMPLES.items():
        out[f"p{q}_ms"] = r(float(np.percentile(a, q))) if a.size >= need else None
    out["max_ms"] = r(float(a.max()))
    return out
