"""scripts/gpu_check.sh on this CPU machine: ``--dry-run`` builds the wheel bundle for the offline
one-GPU host and checks it and the plan; a real run without a GPU is "not ok" and says why. (The
GPU checks themselves run on a GPU host only: see docs/GPU.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_bundle  # noqa: E402
import gpu_checks  # noqa: E402

pytestmark = pytest.mark.timeout(900)


def _sh(*args: str, env: dict | None = None, timeout: int = 850) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHON=sys.executable, **(env or {})))


def test_dry_run_builds_the_bundle_and_checks_the_plan(tmp_path):
    p = _sh("--dry-run", "--out", str(tmp_path))
    if p.returncode == 3:
        pytest.skip("the wheel bundle could not be built (no package index?): the dry run did NOT run\n"
                    + p.stderr[-800:])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert lines[-1] == "dry-run ok"
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert res["dry_run"] and res["ok"] and not res["problems"]
    b = res["bundle"]
    assert b["ok"] and 0 < b["total_mb"] <= gpu_bundle.MAX_BUNDLE_MB and b["wheels"] == len(gpu_bundle.LOCK)
    assert f"{b['total_mb']} MB (max 64 MB)" in p.stdout  # the size is shown
    assert b["host_for_check"] == {}  # pyarrow and pandas are in the bundle: TRL runs on the host
    plan = {r["name"]: r for r in res["plan"]}
    assert [n for n, r in plan.items() if r["planned"]] == ["env", "deepspeed_zero2_cuda", "hf_rollout_cuda",
                                                            "cuda_sync", "trl_adapter_cuda", "nccl_one_rank",
                                                            "deepspeed_switch_1b"]  # the ~1B timing last
    assert "vLLM is not installed" in plan["vllm_cuda"]["reason"]
    assert "two CUDA devices" in plan["nccl_two_gpu"]["reason"]
    assert "NOT RUN on the reference host: coexec_vllm_deepspeed, nccl_two_gpu, vllm_cuda" in lines
    assert res["planned_budget_s"] < gpu_checks.BUDGET_S
    # each check depends on the bundled packages it imports only: the TRL stack is not DeepSpeed's
    needs = res["bundle_needs"]
    assert {"pyarrow", "pandas", "datasets"} <= set(needs["trl_adapter_cuda"])
    assert "pyarrow" not in needs["deepspeed_zero2_cuda"] and "deepspeed" not in needs["trl_adapter_cuda"]
    assert needs["env"] == [] and needs["nccl_one_rank"] == []
    assert res["no_ray"]["ray_importers"] == [] and "rollmux.integrations.trl" in res["no_ray"]["modules"]
    assert res["import_without_ray"]["rc"] == 0
    assert 0.9e9 <= res["plan_checks"]["one_b_params"] <= 1.2e9
    man = json.loads((ROOT / ".cache" / "gpu_bundle" / "manifest.json").read_text())
    assert any(f.startswith("deepspeed-0.19.8-py3-none-any") for f in man["files"])  # built here as a wheel


def test_a_run_without_a_gpu_is_not_ok_and_says_why(tmp_path):
    p = _sh("--out", str(tmp_path), "--checks", "env", "--bundle", str(tmp_path / "no-bundle"), timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    not_run = [n for n in gpu_checks.CHECKS if n != "env"]
    assert lines[-1] == "not ok: env; NOT RUN: " + ", ".join(not_run) and "ok" not in lines[:-1]
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert res["ok"] is False and res["checks"]["env"]["status"] == "fail"
    assert "no CUDA device" in res["checks"]["env"]["error"]
    assert "no wheel bundle" in res["install"]["note"]
    assert all(c["status"] == "NOT RUN" for n, c in res["checks"].items() if n != "env")
    assert set(res["not_run"]) == set(not_run)
    assert json.loads((tmp_path / "gpu_check_env.json").read_text())["status"] == "fail"
    # results go only where the caller says
    q = _sh("--checks", "env", timeout=60, env={"GPU_CHECK_OUT": ""})
    assert q.returncode == 2 and "--out DIR" in q.stderr


def test_final_line_names_what_did_not_run():
    import gpu_check

    ok = {"env": {"planned": True, "status": "pass"}, "vllm_cuda": {"planned": False, "status": "NOT RUN"}}
    assert gpu_check.final_line(ok) == "ok; NOT RUN: vllm_cuda"
    bad = {**ok, "cuda_sync": {"planned": True, "status": "timeout"}}
    assert gpu_check.final_line(bad) == "not ok: cuda_sync; NOT RUN: vllm_cuda"
    assert gpu_check.final_line({"env": {"planned": True, "status": "pass"}}) == "ok"


def test_plan_marks_what_a_host_cannot_run_and_only_that():
    one = {r["name"]: r for r in gpu_checks.plan({"cuda_devices": 1, "vllm": False})}
    assert not one["vllm_cuda"]["planned"] and not one["nccl_two_gpu"]["planned"]
    assert all(one[n]["planned"] for n in ("env", "deepspeed_zero2_cuda", "trl_adapter_cuda"))
    assert not one["coexec_vllm_deepspeed"]["planned"] and "need Ray" in one["coexec_vllm_deepspeed"]["reason"]
    # a missing package: only the checks importing it are NOT RUN
    miss = {r["name"]: r for r in gpu_checks.plan({"cuda_devices": 1, "pyarrow": False, "cupy": False})}
    assert not miss["trl_adapter_cuda"]["planned"] and "pyarrow" in miss["trl_adapter_cuda"]["reason"]
    assert not miss["nccl_one_rank"]["planned"] and "cupy" in miss["nccl_one_rank"]["reason"]
    assert all(miss[n]["planned"] for n in ("env", "deepspeed_zero2_cuda", "hf_rollout_cuda", "cuda_sync",
                                            "deepspeed_switch_1b"))
    two = {r["name"]: r for r in gpu_checks.plan({"cuda_devices": 2, "vllm": True, "ray": True},
                                                  {"trl_adapter_cuda": "datasets needs fsspec<=2026.9.0"})}
    assert not two["trl_adapter_cuda"]["planned"] and "fsspec" in two["trl_adapter_cuda"]["reason"]
    assert all(r["planned"] for n, r in two.items() if n != "trl_adapter_cuda")


def _fake_wheel(folder: Path, name: str, requires: list[str], tag: str = "py3-none-any") -> Path:
    w = folder / f"{name}-1.0-{tag}.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr(f"{name}-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
        z.writestr(f"{name}/__init__.py", "")
    return w


def test_bundle_check_finds_unmet_requirements_foreign_tags_and_missing_locks(tmp_path):
    _fake_wheel(tmp_path, "alpha", ["torch>=2.0", "not-a-real-package>=1", "pyarrow>=20",
                                    'colorama; platform_system == "Windows"'])
    _fake_wheel(tmp_path, "beta", ["torch>=3.0"], tag="cp39-cp39-win_amd64")
    got = gpu_bundle.check(tmp_path)
    assert not got["ok"]
    probs = "\n".join(got["problems"])
    assert "not-a-real-package>=1: neither in the bundle nor on the host" in probs
    assert "needs torch>=3.0, the host has torch 2.11.0" in probs
    assert "beta-1.0-cp39-cp39-win_amd64.whl: no tag for CPython" in probs
    assert "colorama" not in probs  # a marker false on the target is not required
    assert "deepspeed==0.19.8: not in the bundle" in probs
    assert "pyarrow>=20: neither in the bundle nor on the host" in probs


def test_install_unpacks_only_what_the_interpreter_lacks(tmp_path):
    b = tmp_path / "b"
    b.mkdir()
    _fake_wheel(b, "rollmux_gpu_check_probe_pkg", [])
    _fake_wheel(b, "torch", [])  # this interpreter has torch: never shadowed
    got = gpu_bundle.install(b, tmp_path / "deps")
    assert got["installed"] == ["rollmux_gpu_check_probe_pkg-1.0-py3-none-any.whl"] and got["kept_host"] == ["torch"]
    assert (tmp_path / "deps" / "rollmux_gpu_check_probe_pkg" / "__init__.py").is_file()
    assert not (tmp_path / "deps" / "torch").exists()


def test_a_violated_host_pin_stops_only_the_checks_using_that_wheel(tmp_path):
    """A bundled wheel whose requirement on a host package this host violates makes NOT RUN the
    checks that use that wheel (directly or through the bundle), and no other."""
    import gpu_check

    _fake_wheel(tmp_path, "datasets", ["fsspec<0.0.1"])  # no fsspec satisfies it
    _fake_wheel(tmp_path, "trl", ["datasets"])
    _fake_wheel(tmp_path, "deepspeed", ["packaging"])
    got = gpu_check.host_problems(tmp_path)
    assert set(got) == {"trl_adapter_cuda"} and "datasets needs fsspec<0.0.1" in got["trl_adapter_cuda"]
