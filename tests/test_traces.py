"""Trace reading: Philly format (unsorted, blank lines, naive timestamps), plain CSV, windows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollmux.traces import EXTRACT_TRACE, TraceError, TraceWindow, load_trace, read_raw

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:00:00,7200.0,8,57600.0,ee9e8c

2017-10-09 06:00:00,60.0,1,60.0,6214e9
2017-10-09 06:30:00,90000.0,2,180000.0,ee9e8c

"""


def _write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_philly_unsorted_with_blanks_is_sorted_and_rebased(tmp_path):
    jobs = load_trace(_write(tmp_path, PHILLY))
    assert [j.arrival_s for j in jobs] == [0.0, 1800.0, 3600.0]
    assert [j.duration_s for j in jobs] == [60.0, 90000.0, 7200.0]
    assert [j.num_gpus for j in jobs] == [1, 2, 8]
    assert [j.cluster for j in jobs] == ["6214e9", "ee9e8c", "ee9e8c"]
    assert [j.index for j in jobs] == [0, 1, 2]


def test_plain_format_and_extra_columns(tmp_path):
    p = _write(tmp_path, "num_gpus,arrival_s,duration_s,note\n4,100,50,x\n\n1,10,20,y\n")
    jobs = load_trace(p)
    assert [(j.arrival_s, j.duration_s, j.num_gpus) for j in jobs] == [(0.0, 20.0, 1), (90.0, 50.0, 4)]


def test_window_filters_cap_and_count(tmp_path):
    p = _write(tmp_path, PHILLY)
    jobs = load_trace(p, TraceWindow(min_duration_s=100, max_duration_s=10000))
    # the 60 s job is dropped; arrivals are re-based on the first kept job (06:30)
    assert [(j.arrival_s, j.duration_s) for j in jobs] == [(0.0, 10000.0), (1800.0, 7200.0)]
    jobs = load_trace(p, TraceWindow(start_hours=0.75))  # from 06:45 on
    assert [j.num_gpus for j in jobs] == [8]
    jobs = load_trace(p, TraceWindow(length_hours=0.75, max_jobs=1))
    assert [j.duration_s for j in jobs] == [60.0]
    assert [j.cluster for j in load_trace(p, TraceWindow(cluster="ee9e8c", min_gpus=4))] == ["ee9e8c"]


def test_real_extract_reads_all_rows():
    raw = read_raw(EXTRACT_TRACE)
    assert len(raw) == 215
    jobs = load_trace(EXTRACT_TRACE, TraceWindow(min_duration_s=3600))
    assert len(jobs) == 165
    arrivals = [j.arrival_s for j in jobs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert arrivals[-1] < 12 * 3600


def test_full_trace_ships_in_the_repository_byte_for_byte():
    """The default trace is the whole Philly job log, gzip-compressed in data/ (its README gives the
    checksum of the original file)."""
    import gzip
    import hashlib

    from rollmux.traces import DEFAULT_TRACE, REPO_ROOT

    assert DEFAULT_TRACE.is_relative_to(REPO_ROOT) and DEFAULT_TRACE.is_file()
    digest = hashlib.sha256(gzip.decompress(DEFAULT_TRACE.read_bytes())).hexdigest()
    assert digest == "ebffb3dd1589bdf4e7bcd74496201c5ded1d557d498ee14f560463f37ec353da"
    assert len(read_raw(DEFAULT_TRACE)) == 82_247
    assert len(load_trace(DEFAULT_TRACE, TraceWindow(min_duration_s=3600, max_duration_s=3 * 86400))) == 18_645


def test_unreadable_gzip_names_the_file(tmp_path):
    import gzip

    bad = tmp_path / "t.csv.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match=r"t\.csv\.gz: not a readable CSV trace \(gzip\)"):
        load_trace(bad)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(b"arrival_s,duration_s,num_gpus\n0,5,1\n" * 50)[:40])  # truncated
    with pytest.raises(TraceError, match="cut.csv.gz"):
        load_trace(cut)
    ok = tmp_path / "ok.csv.gz"
    ok.write_bytes(gzip.compress(b"arrival_s,duration_s,num_gpus\n0,5,1\n"))
    assert [(j.duration_s, j.num_gpus) for j in load_trace(ok)] == [(5.0, 1)]


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="unknown header"):
        load_trace(_write(tmp_path, "a,b\n1,2\n"))
    with pytest.raises(TraceError, match=r":2: field duration_s: 'abc'"):
        load_trace(_write(tmp_path, "arrival_s,duration_s,num_gpus\n0,abc,1\n"))
    with pytest.raises(TraceError, match="timestamp"):
        load_trace(_write(tmp_path, "timestamp,duration,num_gpus\n2017/10/09,5,1\n"))
    with pytest.raises(TraceError, match="field num_gpus: must be >= 1"):
        load_trace(_write(tmp_path, "arrival_s,duration_s,num_gpus\n0,5,0\n"))
    with pytest.raises(TraceError, match="selects no job"):
        load_trace(_write(tmp_path, PHILLY), TraceWindow(start_hours=5))
    with pytest.raises(ValidationError, match="max_duration_s"):
        TraceWindow(min_duration_s=100, max_duration_s=10)
    with pytest.raises(ValidationError, match="start_hours"):
        TraceWindow(start_hours=-1)


def test_trace_label_is_repository_relative_or_the_bare_name(tmp_path, monkeypatch):
    from rollmux.traces import DEFAULT_TRACE, trace_label

    assert trace_label(DEFAULT_TRACE) == "data/philly-adaptdl-philly.csv.gz"
    monkeypatch.chdir(EXTRACT_TRACE.parent)
    assert trace_label("philly_extract.csv") == "data/philly_extract.csv"
    outside = tmp_path / "elsewhere" / "my-trace.csv"
    assert trace_label(outside) == "my-trace.csv"


def test_result_files_name_repository_files_relatively():
    # what scripts write into results/: no absolute path of the machine that ran them
    from rollmux.config import REPO_ROOT, repo_label

    assert repo_label(REPO_ROOT / "results" / "runtime_gantt.png") == "results/runtime_gantt.png"
    assert repo_label(REPO_ROOT / "configs" / "jobs" / ".." / "scheduler.yaml") == "configs/scheduler.yaml"
    assert repo_label("/somewhere/else/trace.csv.gz") == "trace.csv.gz"
