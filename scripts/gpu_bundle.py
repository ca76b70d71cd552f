#!/usr/bin/env python
"""The wheel bundle ``scripts/gpu_check.sh`` carries to an offline GPU host (built where pip works).

The host this is sized for: one GPU, Python 3.12, torch 2.11 (CUDA 13), cupy-cuda13x 14.2 and
transformers 5.17 preinstalled (with what they require: :data:`HOST`), but no pydantic, Ray,
DeepSpeed, pyarrow, pandas or vLLM, no package index, and at most 64 MiB of files brought along
besides the repository. The bundle holds what the checks import and such a host lacks
(:data:`LOCK`: DeepSpeed as a wheel built here, pydantic and its parts, hjson, msgpack, ..., TRL
with accelerate / datasets, and datasets' pyarrow and pandas), for CPython 3.12 manylinux x86_64
(``pip download --only-binary=:all: --python-version 3.12 --platform manylinux...``), at most
:data:`MAX_BUNDLE_MB`. pyarrow's wheel (55 MB) is repacked without what neither datasets nor TRL
loads (:data:`SLIM`: Arrow Flight, the S3 filesystem, C++ headers, tests, duplicate library
names; ~31 MB): pyarrow imports those lazily and names them as not imported. It leaves out, and
says so: Ray (79 MB) and vLLM (336 MB + torch 2.14): their checks are NOT RUN on such a host.

``python scripts/gpu_bundle.py build DIR`` downloads / builds the wheels into ``DIR`` (reused
while :data:`LOCK` is unchanged: ``DIR/manifest.json`` holds its hash; a copy is kept for every
clone on the machine, :func:`machine_cache`); ``check DIR`` verifies
that every requirement of every bundled wheel (its METADATA, markers evaluated for the target)
is met by the bundle or the host, and the size; ``install DIR TARGET`` (on the host, no pip
needed) unpacks into ``TARGET`` the wheels of distributions the host does not have (their
scripts, e.g. the ``ninja`` binary, into ``TARGET/bin``).
"""

from __future__ import annotations

import argparse
import email
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

MAX_BUNDLE_MB = 64.0
#: The host's Python (env ``GPU_BUNDLE_PYTHON`` builds for another one, e.g. to try the bundle on
#: this machine's interpreter).
PYTHON = os.environ.get("GPU_BUNDLE_PYTHON", "3.12")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64")
#: The target interpreter's PEP 508 marker environment.
TARGET_ENV = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}

#: What the host has: torch 2.11, cupy-cuda13x 14.2, transformers 5.17 (versions known) and what
#: they require (versions unknown here: the requirements of bundled wheels on them are listed as
#: ``host_requirements`` and checked on the host against the installed versions before the checks run).
HOST = {
    "torch": "2.11.0", "cupy-cuda13x": "14.2.0", "transformers": "5.17.0",
    **{n: None for n in ("numpy", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2",
                         "markupsafe", "fsspec", "setuptools", "triton", "huggingface-hub", "hf-xet", "httpx",
                         "httpcore", "h11", "anyio", "idna", "certifi", "click", "packaging", "pyyaml", "regex",
                         "safetensors", "tokenizers", "tqdm", "cuda-pathfinder", "cuda-bindings", "cuda-toolkit")},
}
#: Needed by one check, left out of the bundle for size: the host must have them for that check
#: (none since pyarrow and pandas fit, :data:`SLIM`).
HOST_FOR_CHECK: dict[str, str] = {}

#: The bundle (exact versions; DeepSpeed is built here as a pure-Python wheel, its ops JIT).
LOCK = (
    "deepspeed==0.19.8", "einops==0.8.2", "hjson==3.1.0", "msgpack==1.2.4", "ninja==1.13.2", "psutil==7.2.2",
    "py-cpuinfo==9.0.0",
    "pydantic==2.12.5", "pydantic-core==2.41.5", "annotated-types==0.7.0", "typing-inspection==0.4.2",
    "trl==1.16.0", "accelerate==1.15.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19",
    "xxhash==4.1.0", "pyarrow==26.0.1", "pandas==3.1.1", "python-dateutil==4.0.0", "pytz==2026.6",
    "tzdata==2026.6", "six==1.17.0",
)
#: Wheels repacked without files no check loads (name -> path patterns inside the wheel): pyarrow's
#: Arrow Flight and S3 libraries and their Python modules (imported lazily, only by ``pyarrow.flight``
#: and ``pyarrow.fs.S3FileSystem``), C++ headers and sources, tests, and the library names no module
#: links (``libarrow_python.so`` and ``.so.2600.1.0``: copies of ``.so.2600``, which is what links).
SLIM = {"pyarrow": ("pyarrow/libarrow_flight.so*", "pyarrow/libarrow_python_flight.so*", "pyarrow/_flight.*",
                    "pyarrow/flight.py", "pyarrow/libarrow_s3.so*", "pyarrow/_s3fs.*", "pyarrow/include/*",
                    "pyarrow/src/*", "pyarrow/tests/*", "pyarrow/_pyarrow_cpp_tests.*", "pyarrow/libarrow_python.so",
                    "pyarrow/libarrow_python.so.*.*.*", "pyarrow/*.pxd", "pyarrow/*.pyx", "pyarrow/includes/*")}
BUILT_HERE = {"deepspeed"}  # sdist only on PyPI: `pip wheel` here (no compiled ops: DS_BUILD_OPS=0)


def canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def lock_hash() -> str:
    slim = tuple(f"{k}:{','.join(v)}" for k, v in sorted(SLIM.items()))
    return hashlib.sha256("\n".join(LOCK + PLATFORMS + (PYTHON,) + slim).encode()).hexdigest()[:16]


def slim(whl: Path, drop: tuple[str, ...]) -> dict:
    """Rewrite ``whl`` without the members matching ``drop`` (fnmatch patterns) and their RECORD
    lines. Returns ``{dropped, before_mb, after_mb}``."""
    import fnmatch

    before = whl.stat().st_size
    tmp = whl.with_suffix(".slim")
    dropped = []
    with zipfile.ZipFile(whl) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if any(fnmatch.fnmatch(info.filename, pat) for pat in drop):
                dropped.append(info.filename)
                continue
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                keep = [ln for ln in data.decode().splitlines()
                        if not any(fnmatch.fnmatch(ln.split(",", 1)[0], pat) for pat in drop)]
                data = ("\n".join(keep) + "\n").encode()
            zout.writestr(info, data)
    tmp.replace(whl)
    return {"dropped": len(dropped), "before_mb": round(before / 2**20, 1), "after_mb": round(whl.stat().st_size / 2**20, 1)}


def _pip(*args: str, env: Optional[dict] = None, timeout: float = 600) -> None:
    p = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    if p.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args[:3])} ... failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def wheels(bundle: Path) -> list[Path]:
    return sorted(bundle.glob("*.whl"))


def _complete(bundle: Path) -> Optional[dict]:
    """``bundle``'s manifest when it was built for the current :data:`LOCK` and holds every wheel it names."""
    man = bundle / "manifest.json"
    if man.is_file():
        m = json.loads(man.read_text())
        if m.get("lock") == lock_hash() and all((bundle / f).is_file() for f in m.get("files", {})):
            return m
    return None


def machine_cache() -> Path:
    """Where a built bundle is kept for every clone on this machine (a fresh clone, as CI makes,
    copies it instead of downloading and building again): ``$ROLLMUX_GPU_BUNDLE_CACHE``, default
    ``~/.cache/rollmux/gpu_bundle/<lock hash>``."""
    root = os.environ.get("ROLLMUX_GPU_BUNDLE_CACHE") or str(Path.home() / ".cache" / "rollmux" / "gpu_bundle")
    return Path(root) / lock_hash()[:16]


def _copy(src: Path, dst: Path, m: dict) -> None:
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for f in m["files"]:
        shutil.copyfile(src / f, dst / f)
    (dst / "manifest.json").write_text(json.dumps(m, indent=2))  # last: it marks the copy complete


def build(bundle: Path) -> dict:
    """Download / build the wheels of :data:`LOCK` into ``bundle`` (kept while the lock holds;
    copied from, and after a build into, :func:`machine_cache`)."""
    bundle.mkdir(parents=True, exist_ok=True)
    if (m := _complete(bundle)) is not None:
        return m
    for w in wheels(bundle):
        w.unlink()
    cache = machine_cache()
    if (m := _complete(cache)) is not None:
        _copy(cache, bundle, m)
        return m
    remote = [r for r in LOCK if canon(r.split("==")[0]) not in BUILT_HERE]
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
         "--abi", "cp" + PYTHON.replace(".", ""), *plat, "-d", str(bundle), *remote)
    for r in LOCK:
        if canon(r.split("==")[0]) in BUILT_HERE:
            _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(bundle), r, env={"DS_BUILD_OPS": "0"},
                 timeout=1200)
    slimmed = {}
    for w in wheels(bundle):
        name = canon(w.name.split("-")[0])
        if name in SLIM:
            slimmed[name] = slim(w, SLIM[name])
    files = {w.name: w.stat().st_size for w in wheels(bundle)}
    m = {"lock": lock_hash(), "python": PYTHON, "platforms": list(PLATFORMS), "files": files,
         "total_mb": round(sum(files.values()) / 2**20, 2), "max_mb": MAX_BUNDLE_MB,
         "slimmed": slimmed,
         "left_out": {"ray": "79 MB wheel: the co-executed Ray run is NOT RUN without it",
                      "vllm": "336 MB + torch 2.14: the vLLM checks are NOT RUN without it"}}
    (bundle / "manifest.json").write_text(json.dumps(m, indent=2))
    tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
    try:  # complete before it is visible: renamed into place (another clone may be reading it)
        _copy(bundle, tmp, m)
        if not cache.exists():
            tmp.rename(cache)
    except OSError:  # a read-only home: every clone builds its own
        pass
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return m


def _metadata(whl: Path) -> email.message.Message:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_string(z.read(name).decode())


def check(bundle: Path) -> dict:
    """Every requirement of every bundled wheel met by the bundle or :data:`HOST` (or, for the
    TRL check, :data:`HOST_FOR_CHECK`), every locked package present once, the size within
    budget. Returns ``{ok, problems, total_mb, host_for_check}``."""
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename

    problems: list[str] = []
    have: dict[str, str] = {}
    supported = target_tags()
    for w in wheels(bundle):
        name, ver, _b, tags = parse_wheel_filename(w.name)
        have[canon(name)] = str(ver)
        if not set(tags) & supported:
            problems.append(f"{w.name}: no tag for CPython {PYTHON} on manylinux x86_64")
    for r in LOCK:
        n, v = r.split("==")
        if have.get(canon(n)) != v:
            problems.append(f"{r}: not in the bundle (found {have.get(canon(n))})")
    needs_host: dict[str, set] = {}
    host_reqs: dict[str, set] = {}
    for w in wheels(bundle):
        meta = _metadata(w)
        for raw in meta.get_all("Requires-Dist") or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
                continue
            n = canon(req.name)
            if n in have:
                if req.specifier and have[n] not in req.specifier:
                    problems.append(f"{w.name} needs {req}, the bundle has {n} {have[n]}")
            elif n in HOST:
                if HOST[n] and req.specifier and HOST[n] not in req.specifier:
                    problems.append(f"{w.name} needs {req}, the host has {n} {HOST[n]}")
                elif HOST[n] is None and req.specifier:
                    host_reqs.setdefault(n, set()).add(f"{req.specifier} ({canon(w.name.split('-')[0])})")
            elif n in HOST_FOR_CHECK:
                needs_host.setdefault(n, set()).add(HOST_FOR_CHECK[n])
            else:
                problems.append(f"{w.name} needs {req}: neither in the bundle nor on the host")
    total = sum(w.stat().st_size for w in wheels(bundle)) / 2**20
    if total > MAX_BUNDLE_MB:
        problems.append(f"bundle is {total:.1f} MB > {MAX_BUNDLE_MB} MB")
    return {"ok": not problems, "problems": problems, "total_mb": round(total, 2), "wheels": len(have),
            "host_for_check": {k: sorted(v) for k, v in needs_host.items()},
            "host_requirements": {k: sorted(v) for k, v in sorted(host_reqs.items())}}


def target_tags() -> set:
    """The wheel tags CPython 3.12 on manylinux x86_64 (glibc 2.28 and older) accepts."""
    from packaging import tags

    ver = tuple(int(x) for x in PYTHON.split("."))
    plats = [f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)] + ["manylinux2014_x86_64", "manylinux2010_x86_64",
                                                                        "manylinux1_x86_64", "linux_x86_64"]
    interp = f"cp{ver[0]}{ver[1]}"
    return set(tags.cpython_tags(ver, abis=[interp], platforms=plats)) | set(
        tags.compatible_tags(ver, interp, platforms=plats))


def install(bundle: Path, target: Path) -> dict:
    """Unpack (a wheel is a zip: no pip needed) the wheels of distributions this interpreter
    does not have into ``target``; the host's own packages are never shadowed. Returns
    ``{installed, kept_host}``."""
    from importlib import metadata

    target.mkdir(parents=True, exist_ok=True)
    installed, kept = [], []
    for w in wheels(bundle):
        name, ver = w.name.split("-")[:2]
        try:
            metadata.version(name)
            on_target = (target / f"{name}-{ver}.dist-info").is_dir() or any(target.glob(f"{name}-*.dist-info"))
            if not on_target:
                kept.append(name)
                continue
        except metadata.PackageNotFoundError:
            pass
        with zipfile.ZipFile(w) as z:
            z.extractall(target)
        _spread_data(target)
        installed.append(w.name)
    return {"installed": installed, "kept_host": kept, "bin": str(target / "bin")}


def _spread_data(target: Path) -> None:
    """A wheel's ``<dist>.data/`` folders as an installer lays them out: ``scripts/`` (e.g. the
    ``ninja`` binary DeepSpeed's op builds call) into ``target/bin`` (executable), ``purelib`` /
    ``platlib`` into ``target``."""
    import shutil

    for d in target.glob("*.data"):
        for kind in ("purelib", "platlib"):
            src = d / kind
            if src.is_dir():
                shutil.copytree(src, target, dirs_exist_ok=True)
                shutil.rmtree(src)
        scripts = d / "scripts"
        if scripts.is_dir():
            (target / "bin").mkdir(exist_ok=True)
            for f in scripts.iterdir():
                dst = target / "bin" / f.name
                shutil.move(str(f), dst)
                dst.chmod(0o755)
            scripts.rmdir()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("build", "check", "install"))
    ap.add_argument("bundle")
    ap.add_argument("target", nargs="?")
    a = ap.parse_args(argv)
    b = Path(a.bundle)
    if a.action == "build":
        out = build(b)
        out = {**out, "check": check(b)}
    elif a.action == "check":
        out = check(b)
    else:
        if not a.target:
            ap.error("install needs a TARGET folder")
        out = install(b, Path(a.target))
    print(json.dumps(out, indent=2))
    return 0 if out.get("ok", out.get("check", {}).get("ok", True)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
