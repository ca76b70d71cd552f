"""Benchmark percentiles are reported only with enough samples (scripts/_bench.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from _bench import percentiles  # noqa: E402


def test_p99_needs_1000_samples_and_p90_100():
    few = percentiles([float(x) for x in range(1, 41)])  # 40 samples: a "p99" would be ~the max
    assert few == {"samples": 40, "p50_ms": pytest.approx(20.5), "p90_ms": None, "p99_ms": None, "max_ms": 40.0}
    mid = percentiles(range(1, 101))
    assert mid["p90_ms"] == pytest.approx(90.1) and mid["p99_ms"] is None
    many = percentiles(range(1, 1001))
    assert many["samples"] == 1000 and many["p99_ms"] == pytest.approx(990.01) and many["max_ms"] == 1000
    assert percentiles([1.23456], digits=2)["p50_ms"] == 1.23
    with pytest.raises(ValueError):
        percentiles([])
