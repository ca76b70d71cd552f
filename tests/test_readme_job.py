"""The phase-API job the README leads with (``examples/quick/job.py``, shown there verbatim) runs:
solo in this process (it learns the bandit's best arm), and scheduled on the session's Ray cluster,
where its phases run on the pool workers under permits and its result is bit-identical to solo."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
import uuid
from pathlib import Path

from actors.handles import SchedulerHandle
import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "quick" / "job.py"


def test_the_readme_shows_the_example_file_verbatim():
    # the README's first python block is the file itself (code, not prose: the job the reader copies is the one tested)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks and blocks[0] == JOB.read_text()


def test_solo_run_learns_the_best_arm():
    r = subprocess.run([sys.executable, str(JOB)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    reward = float(r.stdout.strip().rsplit(" ", 1)[-1])
    assert reward > 0.8, r.stdout   # the best arm pays 0.9, a uniform policy 0.375


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_scheduled_run_is_bit_identical_to_solo(ray_cluster, local_cluster_spec, monkeypatch):
    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from factories import kill_scheduler_and_controllers

    solo = runpy.run_path(str(JOB), run_name="__main__")
    name = f"test-readme-{uuid.uuid4().hex[:6]}"
    h = get_or_create_scheduler(local_cluster_spec, name=name)
    try:
        assert SchedulerHandle(h).health().ok
        monkeypatch.setenv("ROLLMUX_ATTACH", "1")
        monkeypatch.setenv("ROLLMUX_SCHEDULER_NAME", name)
        sched = runpy.run_path(str(JOB), run_name="__main__")
        job = sched["job"]
        assert job.mode == "scheduled"
        nodes = {(r["pool"], r["node"]) for r in job.timeline}
        assert ("rollout", "local") not in nodes and {p for p, _ in nodes} == {"rollout", "train"}
        assert sched["mean_reward"] == solo["mean_reward"]
        assert len([r for r in job.timeline if r["phase"] == "train"]) == 30
    finally:
        kill_scheduler_and_controllers(h, name)
