"""`rollmux simulate` on the bundled Philly extract: summary.json keys, plots, clear errors."""

from __future__ import annotations

import json

import pytest

from typer.testing import CliRunner

from rollmux.cli import app
from rollmux.traces import EXTRACT_TRACE

KEYS = {
    "avg_cost_usd_per_h", "peak_cost_usd_per_h", "slo_attainment", "peak_rollout_gpus", "peak_train_gpus",
    "rollout_bubble_ratio", "train_bubble_ratio", "decision_latency_ms_p50", "decision_latency_ms_p99", "cost_vs_optimal",
}
ALL = "rollmux,solo-d,colocated,gavel+,random,most-idle,optimal"


def test_simulate_writes_summary_and_plots(tmp_path):
    out = tmp_path / "sim"
    r = CliRunner().invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--mix", "mixed", "--policies", ALL,
                                 "--jobs", "12", "--seed", "1", "--out", str(out), "--max-duration-s", "43200"])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    assert list(s["policies"]) == ALL.split(",")
    for name, m in s["policies"].items():
        assert KEYS <= set(m), (name, KEYS - set(m))
        assert 0.0 <= m["slo_attainment"] <= 1.0
        assert m["avg_cost_usd_per_h"] > 0 and m["peak_cost_usd_per_h"] >= m["avg_cost_usd_per_h"]
        assert m["decision_latency_ms_max"] >= m["decision_latency_ms_p50"] >= 0
        # 12 arrivals: too few samples for a p99 (it would be about their maximum)
        assert m["decision_latency_ms_p99"] is None and m["decision_latency_samples"] >= 12
    assert s["policies"]["rollmux"]["slo_attainment"] == 1.0
    assert s["policies"]["optimal"]["cost_vs_optimal"] == 1.0
    assert s["policies"]["colocated"]["peak_rollout_gpus"] == 0
    assert s["meta"]["jobs"] == 12 and s["meta"]["mix"] == "mixed"
    # the host's load beside the wall-time figures: three non-negative averages at start and end
    assert s["host"]["cpus"] >= 1 and all(len(s["host"][k]) == 3 and min(s["host"][k]) >= 0
                                          for k in ("load_avg_1_5_15_min_start", "load_avg_1_5_15_min_end"))
    # given as an absolute path, the trace is recorded relative to the repository (no machine's layout)
    assert s["meta"]["trace"] == "data/philly_extract.csv"
    ratios = s["rollmux_cost_ratios"]
    assert ratios["solo-d_over_rollmux"]["paper"] == 1.84 and ratios["colocated_over_rollmux"]["paper"] == 1.38
    assert (out / "cost_over_time.png").stat().st_size > 1000
    assert (out / "gantt_rollmux.png").stat().st_size > 1000
    assert "rollmux" in r.output and "SLO" in r.output


def test_simulate_bad_input_is_a_clear_error(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--policies", "rollmux,fifo", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown policy 'fifo'" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--mix", "heavy", "--jobs", "3", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown mix 'heavy'" in r.output
    r = runner.invoke(app, ["simulate", "--trace", str(tmp_path / "none.csv"), "--out", str(tmp_path)])
    assert r.exit_code == 2 and "trace file not found" in r.output
    r = runner.invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--min-duration-s", "10", "--max-duration-s", "5",
                            "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--max-duration-s" in r.output
    assert not (tmp_path / "summary.json").exists()


def test_simulate_input_handling(tmp_path):
    """--out checked before the replay; non-finite / fractional trace values named by file, line and
    field; one-line errors on stderr naming the flag; a UTF-8 BOM accepted; duplicate policies refused."""
    runner = CliRunner()
    base = ["simulate", "--jobs", "4", "--policies", "solo-d", "--no-progress"]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = runner.invoke(app, base + ["--trace", str(EXTRACT_TRACE), "--out", str(blocker)])
    assert r.exit_code == 2 and f"error: --out: {blocker} exists and is not a folder" in r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, base + ["--trace", str(EXTRACT_TRACE), "--out", str(blocker / "sub")])
    assert r.exit_code == 2 and "--out:" in r.stderr and "not a folder" in r.stderr
    for bad, field in (("nan", "duration_s"), ("inf", "duration_s")):
        t = tmp_path / f"{bad}.csv"
        t.write_text(f"arrival_s,duration_s,num_gpus\n0,7200,8\n10,{bad},8\n")
        r = runner.invoke(app, base + ["--trace", str(t), "--out", str(tmp_path / "o")])
        assert r.exit_code == 2 and f"--trace: {t}:3: field {field}: '{bad}' is not a finite number" in r.stderr, r.stderr
    t = tmp_path / "frac.csv"
    t.write_text("arrival_s,duration_s,num_gpus\n0,7200,8\n10,7200,2.5\n")
    r = runner.invoke(app, base + ["--trace", str(t), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and f"{t}:3: field num_gpus: '2.5' is not a whole number" in r.stderr
    t = tmp_path / "bom.csv"
    t.write_bytes("\ufeffarrival_s,duration_s,num_gpus\n0,7200,8\n10,7200,16.0\n".encode("utf-8"))
    r = runner.invoke(app, base + ["--trace", str(t), "--out", str(tmp_path / "bom")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "bom" / "summary.json").read_text())["meta"]["jobs"] == 2
    r = runner.invoke(app, ["simulate", "--jobs", "4", "--no-progress", "--policies", "rollmux,solo-d,rollmux", "--trace", str(EXTRACT_TRACE),
                                        "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and "error: --policies: 'rollmux' given more than once" in r.stderr
    r = runner.invoke(app, base + ["--trace", str(EXTRACT_TRACE), "--slo-min", "nan", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--slo-min: must be a finite number" in r.stderr
    r = runner.invoke(app, base + ["--trace", str(EXTRACT_TRACE), "--slo-min", "2", "--slo-max", "1.5", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--slo-min/--slo-max" in r.stderr


def test_simulate_help_shows_every_default():
    # Help texts stating a default in brackets must survive typer's rich markup (an unescaped
    # "[default: ...]" is read as a style tag and silently dropped from the help).
    import rollmux_cli

    r = CliRunner().invoke(rollmux_cli.app, ["simulate", "--help"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    for text in ("[default: the full Philly trace shipped as data/philly-adaptdl-philly.csv.gz]",
                 "[default: the config's seed]", "[default: unbounded]", "[default: configs/scheduler.yaml]",
                 "[default: configs/cluster_sim.yaml]"):
        assert text in r.output, text
    assert "\\[" not in r.output


def test_simulate_priorities_reports_per_class(tmp_path):
    """`--priorities` on a bounded cluster: per-class figures in summary.json and the table, for
    RollMux and Solo-D (queued as a group of one); bad shares and an unbounded cluster fail clearly."""
    from rollmux.config import CONFIG_DIR

    bounded = CONFIG_DIR / "cluster_sim_bounded.yaml"
    out = tmp_path / "prio"
    r = CliRunner().invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--policies", "rollmux,solo-d", "--jobs", "20",
                                 "--priorities", "production=0.2,research=0.5,best-effort=0.3", "--cluster", str(bounded),
                                 "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    assert s["meta"]["priority_shares"] == "production=0.2,research=0.5,best-effort=0.3"
    for name in ("rollmux", "solo-d"):
        by = s["policies"][name]["by_class"]
        assert set(by) == {"production", "research", "best-effort"} and list(by)[0] == "production"
        assert sum(v["jobs"] for v in by.values()) == 20
        assert sum(v["cost_usd"] for v in by.values()) == pytest.approx(s["policies"][name]["total_cost_usd"], rel=1e-6)
        assert by["production"]["preemptions"] == 0  # nothing ranks above it
        for v in by.values():
            assert v["queue_wait_s_p99"] >= v["queue_wait_s_p50"] >= 0 and 0 <= v["slo_attainment"] <= 1
    assert "per priority class" in r.output
    r = CliRunner().invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--jobs", "5", "--policies", "rollmux",
                                 "--priorities", "gold=1", "--cluster", str(bounded), "--out", str(out)])
    assert r.exit_code == 2 and "--priorities" in r.output and "gold" in r.output
    r = CliRunner().invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--jobs", "5", "--policies", "rollmux",
                                 "--priorities", "production=1", "--out", str(out)])
    assert r.exit_code == 2 and "unbounded" in r.output


def test_simulate_async_share_reports_per_kind(tmp_path):
    """`--async-share`: the same drawn asynchronous jobs for every policy, a per-kind summary
    (SLO, cost, staleness within the bound) in summary.json and the table; bad values fail clearly."""
    out = tmp_path / "async"
    r = CliRunner().invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--policies", "rollmux,solo-d", "--jobs", "12",
                                 "--async-share", "0.5", "--max-staleness", "2", "--staleness-mode", "bounded",
                                 "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    assert (s["meta"]["async_share"], s["meta"]["max_staleness"], s["meta"]["staleness_mode"]) == (0.5, 2, "bounded")
    kinds = [s["policies"][p]["by_kind"] for p in ("rollmux", "solo-d")]
    assert set(kinds[0]) == set(kinds[1]) == {"sync", "async_bounded"}
    assert kinds[0]["async_bounded"]["jobs"] == kinds[1]["async_bounded"]["jobs"] > 0
    for k in kinds:
        assert k["async_bounded"]["staleness_max"] <= 2 and k["async_bounded"]["staleness_over_bound"] == 0
    assert "per kind of job" in r.output and "async_bounded" in r.output
    for bad, says in ((["--async-share", "1.5"], "[0, 1]"), (["--async-share", "0.5", "--max-staleness", "0"], "max_staleness"),
                      (["--async-share", "0.5", "--staleness-mode", "eventual"], "unknown staleness mode")):
        r = CliRunner().invoke(app, ["simulate", "--trace", str(EXTRACT_TRACE), "--jobs", "3", "--policies", "rollmux",
                                     "--out", str(tmp_path / "bad"), "--no-progress", *bad])
        assert r.exit_code == 2 and says in r.output, r.output
