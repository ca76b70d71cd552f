#!/usr/bin/env python
"""Runner of ``scripts/gpu_check.sh``: unpack the wheel bundle, plan, run each GPU check with its
own timeout, write the results, print "ok" only when every planned check ran and passed.

    PYTHONPATH=. python scripts/gpu_check.py [--out DIR] [--bundle DIR] [--checks a,b] [--dry-run]

``--out`` (else env ``GPU_CHECK_OUT``; one of them is required: nothing is written anywhere else)
receives ``gpu_check.json`` (host, bundle install, plan, every check's status: pass | fail |
timeout | NOT RUN, with reasons and seconds; rewritten after every check, so a run cut short keeps
what finished) and one ``gpu_check_<name>.json`` per check that ran (a long check writes its
stages there as they end). A check the host cannot run (no vLLM, one GPU, a module it imports
missing, a host package too old for a bundled wheel it uses) is NOT RUN with the reason, and only
that check: the others run. The last line is ``ok`` or ``not ok: <failed checks>``, followed by
``; NOT RUN: <checks>`` when any did not run (a NOT RUN check is never a pass). Nothing here needs Ray.

``--dry-run`` (a CPU machine, where pip works; run by tests/test_gpu_check.py): checks the bundle
(size, every requirement met by the bundle or the host), the plan of the reference host (one
GPU, no vLLM, no Ray: which checks run, their timeouts within the 5-minute budget), that the
checks' modules import with Ray absent, and what can be checked of each check without a GPU.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_bundle  # noqa: E402
import gpu_checks  # noqa: E402

#: The host the check is sized for, with the bundle unpacked (what a run there plans): its own
#: torch, cupy and transformers; DeepSpeed, pydantic and TRL with datasets, pyarrow and pandas from
#: the bundle; no vLLM, no Ray.
REFERENCE_HOST = {"python": "3.12", "torch": "2.11.0", "cuda_devices": 1, "vllm": False, "ray": False,
                  **{m: True for m in ("pyarrow", "pandas", "cupy", "deepspeed", "pydantic", "trl", "accelerate",
                                       "datasets", "transformers")}}
#: Repository modules the checks import (their closure must not import Ray).
CHECK_MODULES = ("actors.backends.deepspeed_train", "actors.backends.hf_rollout", "actors.backends.vllm_rollout",
                 "actors.backends.weight_payload", "rollmux.integrations.trl", "collectives.nccl_executor",
                 "examples.grpo.model", "examples.grpo.tokenizer", "examples.grpo.config")


def _bundle_graph(bundle: Path) -> dict[str, set[str]]:
    """Bundled distribution -> the bundled distributions it requires (markers for the target)."""
    from packaging.requirements import Requirement

    whls = {gpu_bundle.canon(w.name.split("-")[0]): w for w in gpu_bundle.wheels(bundle)}
    graph: dict[str, set[str]] = {}
    for name, w in whls.items():
        deps = set()
        for raw in gpu_bundle._metadata(w).get_all("Requires-Dist") or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate(gpu_bundle.TARGET_ENV):
                continue
            if gpu_bundle.canon(req.name) in whls:
                deps.add(gpu_bundle.canon(req.name))
        graph[name] = deps
    return graph


def _needs(check: str, graph: dict[str, set[str]]) -> set[str]:
    """The bundled distributions ``check`` uses: the ones its modules name, and what they require."""
    todo = [gpu_bundle.canon(m) for m in gpu_checks.CHECKS[check][2]]
    seen: set[str] = set()
    while todo:
        d = todo.pop()
        if d in seen:
            continue
        seen.add(d)
        todo += graph.get(d, ())
    return {d for d in seen if d in graph}


def host_problems(bundle: Path) -> dict[str, str]:
    """Check -> why this host's packages cannot run it: an installed package violates a
    requirement of a bundled wheel that check uses (directly or through the bundle's own
    requirements). Other checks are not affected."""
    from importlib import metadata

    from packaging.requirements import Requirement

    graph = _bundle_graph(bundle)
    bad: dict[str, list[str]] = {}  # bundled distribution -> violated requirements
    for w in gpu_bundle.wheels(bundle):
        owner = gpu_bundle.canon(w.name.split("-")[0])
        for raw in gpu_bundle._metadata(w).get_all("Requires-Dist") or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate(gpu_bundle.TARGET_ENV):
                continue
            n = gpu_bundle.canon(req.name)
            if n not in gpu_bundle.HOST or not req.specifier:
                continue
            try:
                v = metadata.version(n)
            except metadata.PackageNotFoundError:
                v = None
            if v is None or v not in req.specifier:
                bad.setdefault(owner, []).append(f"{owner} needs {req}, this host has {n} {v or 'missing'}")
    out: dict[str, str] = {}
    for check in gpu_checks.CHECKS:
        why = [x for d in sorted(_needs(check, graph)) for x in bad.get(d, [])]
        if why:
            out[check] = "; ".join(dict.fromkeys(why))
    return out


def _write(out: Path, summary: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=str))


def final_line(checks: dict) -> str:
    """``ok`` / ``not ok: <failed>``, then ``; NOT RUN: <checks>`` when any did not run."""
    planned = [n for n, c in checks.items() if c["planned"]]
    failed = [n for n in planned if checks[n]["status"] != "pass"]
    not_run = [n for n, c in checks.items() if c["status"] == "NOT RUN"]
    line = "not ok: " + ", ".join(failed) if failed or not planned else "ok"
    return line + ("; NOT RUN: " + ", ".join(not_run) if not_run else "")


def run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    bundle = Path(args.bundle)
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "bundle": str(bundle), "ok": False}
    deps = Path(args.deps)
    t0 = time.perf_counter()
    if bundle.is_dir() and gpu_bundle.wheels(bundle):
        summary["install"] = gpu_bundle.install(bundle, deps)
    else:
        summary["install"] = {"note": f"no wheel bundle at {bundle} (built with `bash scripts/gpu_check.sh "
                                      "--build-bundle` where pip works): using the host's packages only"}
    summary["install"]["seconds"] = round(time.perf_counter() - t0, 2)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(deps.resolve())]
                                                      + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
               PATH=os.pathsep.join([str((deps / "bin").resolve()), os.environ.get("PATH", "")]),
               DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cuda"), RAY_USAGE_STATS_ENABLED="0",
               **gpu_checks.DETERMINISTIC_ENV)
    sys.path.insert(0, str(deps.resolve()))
    host = json.loads(subprocess.run([sys.executable, "-c", "import json,sys; sys.path.insert(0, 'scripts'); "
                                      "import gpu_checks; print(json.dumps(gpu_checks.probe()))"],
                                     env=env, capture_output=True, text=True, timeout=60, cwd=ROOT).stdout or "{}")
    summary["host"] = host
    problems = host_problems(bundle) if bundle.is_dir() and gpu_bundle.wheels(bundle) else {}
    rows = gpu_checks.plan(host, problems)
    only = set(filter(None, (args.checks or "").split(",")))
    if only:
        rows = [r if r["name"] in only else {**r, "planned": False, "reason": "not selected (--checks)"} for r in rows]
    summary["plan"] = rows
    checks: dict = {r["name"]: {"status": "NOT RUN" if not r["planned"] else "pending", "reason": r["reason"],
                                "planned": r["planned"]} for r in rows}
    summary["checks"] = checks
    _write(out, summary)
    for r in rows:
        name = r["name"]
        if not r["planned"]:
            continue
        t0 = time.perf_counter()
        res_file = out / f"gpu_check_{name}.json"
        res_file.unlink(missing_ok=True)
        try:
            p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_checks.py"), name, "--out", str(out)],
                               env=env, cwd=ROOT, capture_output=True, text=True, timeout=r["timeout_s"])
            rec = json.loads(res_file.read_text()) if res_file.is_file() else {
                "status": "fail", "error": f"exit {p.returncode} without a result: {p.stderr[-1500:]}"}
            if rec.get("status") == "running":  # the process died mid-check: its stages stay
                rec = {"status": "fail", "error": f"exit {p.returncode} during the check: {p.stderr[-1500:]}",
                       "partial": rec.get("partial")}
        except subprocess.TimeoutExpired:
            part = json.loads(res_file.read_text()).get("partial") if res_file.is_file() else None
            rec = {"status": "timeout", "error": f"no result within {r['timeout_s']} s", "partial": part}
        rec.pop("traceback", None)
        checks[name] = {**rec, "planned": True, "wall_s": round(time.perf_counter() - t0, 2)}
        summary["seconds"] = round(time.time() - t_start, 1)
        _write(out, summary)  # after every check: a run cut short keeps what finished
    planned = [n for n, c in checks.items() if c["planned"]]
    summary["ok"] = bool(planned) and all(checks[n]["status"] == "pass" for n in planned)
    summary["not_run"] = {n: c["reason"] for n, c in checks.items() if c["status"] == "NOT RUN"}
    summary["seconds"] = round(time.time() - t_start, 1)
    _write(out, summary)
    for n, c in checks.items():
        why = c.get("reason") if c["status"] == "NOT RUN" else c.get("error") or ""
        print(f"{c['status'].upper() if c['status'] != 'NOT RUN' else 'NOT RUN':8s} {n:22s} "
              f"{str(c.get('wall_s', '')) + ' s' if 'wall_s' in c else ''} {why or ''}".rstrip())
    print(f"results: {out / 'gpu_check.json'} ({summary['seconds']} s)")
    print(final_line(checks))
    return 0 if summary["ok"] else 1


def _repo_imports(mod: str) -> tuple[set[str], set[str]]:
    """Modules ``mod`` imports: (every statement, also inside functions; those that run when the
    module is imported: module and class bodies, not function bodies)."""
    path = ROOT / (mod.replace(".", "/") + ".py")
    if not path.is_file():
        path = ROOT / mod.replace(".", "/") / "__init__.py"
    every, at_import = set(), set()

    def names(node) -> set[str]:
        if isinstance(node, ast.Import):
            return {a.name for a in node.names}
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            return {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        return set()

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            got = names(child)
            every.update(got)
            if not in_function:
                at_import.update(got)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    return every, at_import


#: The phase API's scheduled mode (``Job(attach=True)`` / ``ROLLMUX_ATTACH``), which the checks never
#: take: they run plain (its lazy import is the one documented entry from rollmux/ into actors/).
SCHEDULED_ENTRY = {("rollmux.phase_api", "actors.driver.runtime_client")}


def no_ray_closure() -> dict:
    """The repository modules the checks reach (imports followed transitively, inside functions
    too, except into the scheduled mode) and which import Ray when imported (none may: the checks
    run on a host without it; Ray imports inside functions are listed, and the import of the
    checks' modules with Ray blocked shows none of them runs)."""
    seen: set[str] = set()
    todo = list(CHECK_MODULES) + ["scripts.gpu_checks"]
    ray_users: list[str] = []
    ray_in_functions: list[str] = []
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        p = ROOT / (m.replace(".", "/") + ".py")
        if not p.is_file() and not (ROOT / m.replace(".", "/") / "__init__.py").is_file():
            continue
        seen.add(m)
        parts = m.split(".")
        for i in range(1, len(parts)):  # packages run their __init__ first
            todo.append(".".join(parts[:i]))
        every, at_import = _repo_imports(m)
        for n in every:
            top = n.split(".")[0]
            if top == "ray":
                (ray_users if n in at_import else ray_in_functions).append(m)
            elif top in ("rollmux", "actors", "collectives", "examples") and (m, n) not in SCHEDULED_ENTRY:
                todo.append(n)
    return {"modules": sorted(seen), "ray_importers": sorted(set(ray_users)),
            "ray_only_inside_functions": sorted(set(ray_in_functions)),
            "not_followed": sorted(f"{a} -> {b}" for a, b in SCHEDULED_ENTRY)}


BLOCK_RAY = r"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"blocked for the check: {name} (a GPU host without Ray)")
sys.meta_path.insert(0, Block())
import importlib
for m in MODULES:
    importlib.import_module(m)
print("imported", len(MODULES))
"""


def dry_run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"dry_run": True, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    problems: list[str] = []
    bundle = Path(args.bundle)
    if not gpu_bundle.wheels(bundle):
        problems.append(f"no wheel bundle at {bundle}")
        res["bundle"] = {}
    else:
        res["bundle"] = gpu_bundle.check(bundle)
        problems += [f"bundle: {p}" for p in res["bundle"]["problems"]]
    rows = gpu_checks.plan(REFERENCE_HOST)
    res["reference_host"] = REFERENCE_HOST
    res["plan"] = rows
    planned = [r for r in rows if r["planned"]]
    total = sum(r["timeout_s"] for r in planned) + gpu_checks.INSTALL_S
    res["planned_budget_s"] = total
    if total >= gpu_checks.BUDGET_S:
        problems.append(f"planned checks' timeouts + install = {total} s >= {gpu_checks.BUDGET_S} s")
    not_run = {r["name"]: r["reason"] for r in rows if not r["planned"]}
    if set(not_run) != set(gpu_checks.REFERENCE_NOT_RUN):
        problems.append(f"NOT RUN on the reference host: {sorted(not_run)}, expected {sorted(gpu_checks.REFERENCE_NOT_RUN)}")
    if [r["name"] for r in planned][-1:] != ["deepspeed_switch_1b"]:
        problems.append("the ~1B timing must run last")
    if res["bundle"] and gpu_bundle.wheels(bundle):
        graph = _bundle_graph(bundle)
        res["bundle_needs"] = {r["name"]: sorted(_needs(r["name"], graph)) for r in rows}
    clo = no_ray_closure()
    res["no_ray"] = clo
    if clo["ray_importers"]:
        problems.append(f"the checks reach modules that import Ray: {clo['ray_importers']}")
    p = subprocess.run([sys.executable, "-c", f"MODULES = {list(CHECK_MODULES)!r}\n" + BLOCK_RAY], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=240)
    res["import_without_ray"] = {"rc": p.returncode, "out": p.stdout.strip()[-200:], "err": p.stderr.strip()[-1500:]}
    if p.returncode != 0:
        problems.append(f"the checks' modules do not import with Ray absent: {p.stderr.strip()[-500:]}")
    try:
        res["plan_checks"] = gpu_checks.plan_checks()
    except Exception as e:
        problems.append(f"plan check failed: {type(e).__name__}: {e}")
    res["problems"] = problems
    res["ok"] = not problems
    (out / "gpu_check.json").write_text(json.dumps(res, indent=2, default=str))
    for r in rows:
        print(f"{'PLANNED' if r['planned'] else 'NOT RUN':8s} {r['name']:22s} {r['timeout_s']:4d} s  "
              f"{'' if r['planned'] else r['reason']}".rstrip())
    b = res.get("bundle") or {}
    print(f"bundle: {b.get('wheels', 0)} wheels, {b.get('total_mb', 0)} MB (max {gpu_bundle.MAX_BUNDLE_MB:g} MB); "
          f"planned checks {total} s with the install (budget {gpu_checks.BUDGET_S} s)")
    print("NOT RUN on the reference host: " + ", ".join(sorted(not_run)))
    for pr in problems:
        print("problem:", pr)
    print("dry-run ok" if res["ok"] else "dry-run FAILED")
    return 0 if res["ok"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("GPU_CHECK_OUT"),
                    help="the results folder (required here or as GPU_CHECK_OUT: nothing is written elsewhere)")
    ap.add_argument("--bundle", default=os.environ.get("GPU_CHECK_BUNDLE") or str(ROOT / ".cache" / "gpu_bundle"))
    # a folder named site-packages: dill (datasets' hashing, in the TRL check) pickles by reference only
    # classes of modules under a site-packages path; pyarrow's types elsewhere fail to pickle by value
    ap.add_argument("--deps", default=os.environ.get("GPU_CHECK_DEPS") or str(ROOT / ".cache" / "gpu_deps" / "site-packages"),
                    help="where the bundle is unpacked (put on PYTHONPATH of every check)")
    ap.add_argument("--checks", default=None, help="comma-separated subset to run (others: NOT RUN)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if not a.out:
        ap.error("--out DIR (or GPU_CHECK_OUT) is required: the results go where the caller says")
    return dry_run(a) if a.dry_run else run(a)


if __name__ == "__main__":
    raise SystemExit(main())
