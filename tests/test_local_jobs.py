"""Local clusters whose Ray nodes do not trip over each other, and leave nothing behind.

Every local Ray node has its own temp dir (its own session dir, so its runtime-env agent unpacks
a job's ``working_dir`` into its own ``runtime_resources``) under one private (0700) root. Jobs
submitted back to back with ``ray job submit --working-dir .`` onto a fresh ``rollmux up`` all
finish (they used to break each other: sibling nodes unpacked the same package into one shared
directory and deleted it while another node still imported from it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from factories import tiny_stack_spec

ROOT = Path(__file__).resolve().parent.parent

TINY_SPEC = tiny_stack_spec("jobs-test")


def _mode(p: Path) -> int:
    return os.stat(p).st_mode & 0o777


# ----------------------------------------------------------------------------- no Ray
def test_private_dir_refuses_a_planted_symlink_or_foreign_dir(tmp_path):
    from actors.ops.ray_dirs import UnsafeDirError, node_temp_dir, private_dir, short_root

    d = private_dir(tmp_path / "root")
    assert _mode(d) == 0o700
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    assert _mode(private_dir(tmp_path / "open")) == 0o700  # ours: tightened
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeDirError, match="not a plain directory"):
        private_dir(tmp_path / "link")
    if os.geteuid() == 0:
        (tmp_path / "foreign").mkdir()
        os.chown(tmp_path / "foreign", 12345, 12345)
        with pytest.raises(UnsafeDirError, match="owned by uid 12345"):
            private_dir(tmp_path / "foreign")
    with pytest.raises(ValueError, match="node key"):
        node_temp_dir(d, "rollout-1000")
    # Ray's socket paths: a long state dir gets a short root of its own in /tmp
    long = tmp_path / ("x" * 40)
    assert short_root(long) == short_root(long) and len(str(short_root(long))) <= 32
    assert str(short_root(long)).startswith("/tmp/rollmux-ray-") and short_root(Path("/s/ray")) == Path("/s/ray")


def test_leftovers_names_a_run_dir_until_it_is_removed():
    from actors.ops.local_cluster import leftovers, new_run_dir, remove_run_dir

    d = new_run_dir()
    assert _mode(d) == 0o700 and d in leftovers()
    remove_run_dir(d)
    assert not d.exists() and d not in leftovers()


@pytest.mark.parametrize("gitignore", [True, False])
def test_working_dir_upload_leaves_out_the_venv_and_git(tmp_path, gitignore):
    """The package ``ray job submit --working-dir .`` uploads (Ray's own zip step), also when Ray is
    told to disregard .gitignore (``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1``): .rayignore suffices."""
    from zipfile import ZipFile

    from ray._private.runtime_env.packaging import _zip_files

    out = tmp_path / "pkg.zip"
    _zip_files(str(ROOT), [], str(out), include_gitignore=gitignore)
    names = ZipFile(out).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {"rollmux", "scripts", "tests", "configs"} <= tops
    assert not tops & {".venv", ".git", ".venv-vllm", ".venv-vllm-cpu", ".venv-verl", ".pytest_cache", ".hypothesis", "tmp", "out"}
    assert not any("__pycache__" in n for n in names) and out.stat().st_size < 20 * 2**20


# ----------------------------------------------------------------------------- the session's cluster
@pytest.mark.ray
def test_each_session_node_has_its_own_private_temp_and_runtime_env_dirs(ray_cluster, tmp_path):
    import ray

    lc = ray_cluster
    dirs = lc.node_dirs
    assert set(dirs) == {"head", *lc.node_ids} and len(set(dirs.values())) == len(dirs)
    # created 0700; Ray widens its own dirs to 0777 again, the 0700 run dir keeps others out of all of them
    assert _mode(lc.run_dir) == 0o700 and all(d.parent == lc.run_dir for d in dirs.values())
    assert not str(lc.run_dir).startswith("/tmp/ray")
    by_res = {k.split(":", 1)[1]: n for n in ray.nodes() if n.get("Alive")
              for k in n["Resources"] if k.startswith("rollmux_node:")}
    for nid in lc.node_ids:  # each raylet's sockets live in that node's own dir
        assert by_res[nid]["ObjectStoreSocketName"].startswith(str(dirs[nid]) + "/session_"), nid
    # a working_dir package is unpacked once per node, in that node's own runtime_resources
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "probe_mod.py").write_text("VALUE = 42\n")

    @ray.remote(num_cpus=0)
    def where() -> tuple[str, int]:
        import probe_mod

        return os.getcwd(), probe_mod.VALUE

    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    renv = upload_working_dir_if_needed({"working_dir": str(wd)}, include_gitignore=True, scratch_dir=str(tmp_path))
    assert renv["working_dir"].startswith("gcs://_ray_pkg_")  # what `ray job submit --working-dir` uploads
    nodes = lc.node_ids[:2]
    got = ray.get([where.options(resources={f"rollmux_node:{n}": 1}, runtime_env=renv).remote() for n in nodes],
                  timeout=180)
    for nid, (cwd, v) in zip(nodes, got):
        assert v == 42 and cwd.startswith(str(dirs[nid]) + "/session_") and "/runtime_resources/working_dir_files/" in cwd
    assert _mode(lc.run_dir) == 0o700


# ----------------------------------------------------------------------------- rollmux up + ray job submit
def _env(sd: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "ROLLMUX_", "RAY_ADDRESS", "RAY_TMPDIR"))}
    env.update(PYTHONPATH=str(ROOT), ROLLMUX_CURRENT=str(sd / "current"), RAY_USAGE_STATS_ENABLED="0",
               COLUMNS="200", **extra)
    # the environment activated, as a user's shell has it: the entrypoint's `python` is this one
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


POLL = """
import json, sys, time
from ray.job_submission import JobSubmissionClient, JobStatus
c = JobSubmissionClient(sys.argv[1])
ids = sys.argv[2:]
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    st = {i: c.get_job_status(i) for i in ids}
    if all(s.is_terminal() for s in st.values()):
        break
    time.sleep(0.25)
print(json.dumps({i: {"status": str(c.get_job_status(i).value), "logs": c.get_job_logs(i)[-3000:]} for i in ids}))
"""


@pytest.mark.slow
def test_jobs_submitted_back_to_back_with_the_working_dir_all_succeed():
    from actors.ops.cli_stack import _free_port

    sd = Path(tempfile.mkdtemp(prefix="rmx-up-", dir="/tmp"))  # short: Ray's root goes in <sd>/ray
    spec = sd / "spec.yaml"
    spec.write_text(TINY_SPEC)
    env = _env(sd)
    dash = _free_port()
    cli = [sys.executable, "-m", "rollmux_cli"]
    try:
        r = subprocess.run(cli + ["up", "--state-dir", str(sd), "--cluster-spec", str(spec), "--port", str(_free_port()),
                                  "--ray-port", str(_free_port()), "--dashboard-port", str(dash),
                                  "--metrics-export-port", str(_free_port()), "--timeout-s", "240"],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        root = sd / "ray"
        assert _mode(root) == 0o700
        assert {p.name for p in root.iterdir()} >= {"head", "rollout-0", "train-0"}
        jenv = dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(sd / "ray_auth_token"))
        address = f"http://127.0.0.1:{dash}"
        ray_bin = str(Path(sys.executable).with_name("ray"))
        ids = []
        for _ in range(3):  # back to back, as a user would
            r = subprocess.run([ray_bin, "job", "submit", "--address", address, "--no-wait", "--working-dir", ".",
                                "--", "python", "tests/job_probe.py", "--hold-s", "1.0"],
                               env=jenv, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            ids.append(next(w.strip("'") for w in r.stdout.split() if w.strip("'").startswith("raysubmit_")))
        r = subprocess.run([sys.executable, "-c", POLL, address, *ids], env=jenv, cwd=ROOT, capture_output=True,
                           text=True, timeout=360)
        assert r.returncode == 0, r.stderr[-3000:]
        res = json.loads(r.stdout.strip().splitlines()[-1])
        bad = {i: v for i, v in res.items() if v["status"] != "SUCCEEDED"}
        assert not bad, json.dumps(bad, indent=1)[-6000:]
        for i, v in res.items():
            out = json.loads(next(ln for ln in reversed(v["logs"].splitlines()) if ln.startswith("{")))
            assert set(out["tasks"]) == {"rollout-0", "train-0"} and out["driver_torch"] == 2.0
            assert out["driver_cwd"].startswith(str(root / "head") + "/session_")
            for nid, t in out["tasks"].items():  # each node ran from its own unpacked copy
                assert t["torch"] == 3.0 and t["cwd"].startswith(str(root / nid) + "/session_"), (nid, t)
                assert "/runtime_resources/working_dir_files/_ray_pkg_" in t["cwd"]
    finally:
        r = subprocess.run(cli + ["down", "--state-dir", str(sd), "--purge", "--grace-s", "10"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=180)
        purged = not (sd / "ray").exists()
        shutil.rmtree(sd, ignore_errors=True)
    assert r.returncode == 0 and "RollMux is down" in r.stdout, r.stdout + r.stderr
    assert purged
