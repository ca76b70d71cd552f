"""One run of the cost-gap benchmark (scripts/bench_cost_gap.py): RollMux against the lower bound
over 100% of its spend, split by the cheapest known partition, on a budget that does not depend on
the host's load."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from rollmux.partition_bound import BoundBudget
from rollmux.traces import EXTRACT_TRACE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_cost_gap  # noqa: E402


def test_one_run_covers_all_spend_and_splits_the_ratio_to_the_bound():
    budget = BoundBudget(cut_rounds=2, time_limit_s=math.inf)
    # exact optimum only up to 4 active jobs: most instants get the LP bound
    args = (str(EXTRACT_TRACE), 30, 0, "mixed", 1.0, 2.0, 4, True, asdict(budget), True)
    r = bench_cost_gap.run_one(args)
    kinds = r["lower_bound_instants_by_kind"]
    assert sum(v for k, v in kinds.items() if k != "exact") > 10, kinds
    assert r["lower_bound_spend_share_covered"] == pytest.approx(1.0)
    assert r["lower_bound_time_share_covered"] == pytest.approx(1.0)
    # bound <= cheapest known partition <= RollMux, and the two factors multiply to the whole
    assert r["rollmux_vs_best_known_partition"] >= 1.0 - 1e-9
    assert r["best_known_partition_vs_lower_bound"] >= 1.0 - 1e-9
    assert r["rollmux_vs_lower_bound"] == pytest.approx(
        r["rollmux_vs_best_known_partition"] * r["best_known_partition_vs_lower_bound"])
    agg = bench_cost_gap.aggregate([r])
    assert agg["rollmux_vs_lower_bound_spend_weighted"] == pytest.approx(r["rollmux_vs_lower_bound"])
    assert agg["best_known_partition_vs_lower_bound_spend_weighted"] == pytest.approx(
        r["best_known_partition_vs_lower_bound"])
    # no wall-clock limit: the same figures on a second run; without the incumbent (--no-incumbent)
    # the bound is the same and the ratio is not split
    again = bench_cost_gap.run_one(args[:-1] + (False,))
    assert again["bound_usd"] == r["bound_usd"] and again["rollmux_vs_lower_bound"] == r["rollmux_vs_lower_bound"]
    assert again["rollmux_vs_best_known_partition"] is None and again["best_known_usd"] == 0.0


def test_resume_dir_reuses_the_runs_saved_by_the_same_code(tmp_path, monkeypatch):
    """--resume-dir: a second invocation of the same grid runs nothing and writes the same figures;
    a run saved under another code digest is not reused."""
    import json

    resume = tmp_path / "runs"

    def grid(out: Path) -> dict:
        monkeypatch.setattr(sys, "argv", ["bench_cost_gap.py", "--quick", "--seeds", "1", "--jobs", "8", "--no-bound",
                                          "--procs", "1", "--trace", str(EXTRACT_TRACE), "--resume-dir", str(resume),
                                          "--out", str(out)])
        bench_cost_gap.main()
        return json.loads(out.read_text())

    first = grid(tmp_path / "a.json")
    saved = sorted(resume.glob("*.json"))
    assert first["meta"]["runs_reused"] == 0 and len(saved) == first["overall"]["runs"] == 7
    second = grid(tmp_path / "b.json")
    assert second["meta"]["runs_reused"] == 7 and second["overall"] == first["overall"]
    assert second["runs"] == first["runs"]
    task = (str(EXTRACT_TRACE), 8, 0, "mixed", 1.0, 2.0, 16, False, {}, True)
    digest = bench_cost_gap.code_digest(EXTRACT_TRACE)
    assert len(digest) == 64 and bench_cost_gap.run_key(task, digest) != bench_cost_gap.run_key(task, "0" * 64)
    assert bench_cost_gap.run_key(task, digest) != bench_cost_gap.run_key(task[:2] + (1,) + task[3:], digest)


def test_set_replaces_a_scheduler_default_and_bad_settings_are_refused(tmp_path, monkeypatch, capsys):
    """--set KEY=VALUE: RollMux replays with that setting (recorded in meta, saved under its own
    run keys); an unknown key or a value out of range stops the script naming the key."""
    import json

    def grid(*extra: str, out: Path = tmp_path / "g.json") -> dict:
        monkeypatch.setattr(sys, "argv", ["bench_cost_gap.py", "--quick", "--seeds", "1", "--jobs", "8", "--no-bound",
                                          "--procs", "1", "--trace", str(EXTRACT_TRACE), "--out", str(out), *extra])
        bench_cost_gap.main()
        return json.loads(out.read_text())

    for bad, key in (("plan_master_columns=-1", "plan_master_columns"), ("no_such_key=1", "no_such_key"),
                     ("plan_max_jobs", "KEY=VALUE")):
        with pytest.raises(SystemExit):
            grid("--set", bad)
        assert key in capsys.readouterr().err
    first = grid()
    off = grid("--set", "reopt_max_jobs=0", "--set", "plan_max_jobs=0", out=tmp_path / "off.json")
    assert first["meta"]["scheduler_overrides"] == {}
    assert off["meta"]["scheduler_overrides"] == {"reopt_max_jobs": 0, "plan_max_jobs": 0}
    # without re-optimisation or plan the jobs are moved by departure re-packing only
    assert all(set(r["moves_by_source"]) <= {"repack"} for r in off["runs"])
    assert any(set(r["moves_by_source"]) - {"repack"} for r in first["runs"])
    task = (str(EXTRACT_TRACE), 8, 0, "mixed", 1.0, 2.0, 16, False, {}, True)
    assert bench_cost_gap.run_key(task + ({},), "d") == bench_cost_gap.run_key(task, "d")
    assert bench_cost_gap.run_key(task + ({"plan_max_jobs": 0},), "d") != bench_cost_gap.run_key(task, "d")
