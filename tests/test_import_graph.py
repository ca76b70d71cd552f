"""The project's import graph (stdlib ``ast``, every import statement, also those inside functions).

- No circle among the repository's modules (``rollmux``, ``actors``, ``collectives``,
  ``examples``, ``serve_api``, ``serve_app``, ``rollmux_cli``).
- ``rollmux/`` is pure: it imports ``actors/`` only at the documented phase-API entry
  (``rollmux.phase_api`` -> ``actors.driver.runtime_client``, scheduled mode) and never Ray.
- ``actors/`` never imports the HTTP app (``serve_app`` and its parts in ``serve_api``) or the
  assembled CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollmux", "actors", "collectives", "examples", "serve_api")
TOP_MODULES = ("serve_app", "rollmux_cli")
PHASE_API_ENTRY = {("rollmux.phase_api", "actors.driver.runtime_client")}


def _modules() -> dict[str, Path]:
    mods = {m: ROOT / f"{m}.py" for m in TOP_MODULES}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of the repository it imports`` (every ``import`` / ``from`` statement)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = mod.split(".")
                    anchor = anchor if is_pkg else anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                r = _resolve(t, mods)
                if r is not None and r != mod:
                    graph[mod].add(r)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert {"rollmux.phase_api", "actors.scheduler.global_scheduler", "actors.naming", "serve_app"} <= set(graph)
    assert "actors.driver.runtime_client" in graph["rollmux.phase_api"]  # the graph sees lazy imports
    assert _cycles(graph) == []


def test_the_checker_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_rollmux_imports_actors_only_at_the_phase_api_entry_and_never_ray():
    graph = import_graph()
    crossing = {(m, t) for m, ts in graph.items() if m.split(".")[0] == "rollmux"
                for t in ts if t.split(".")[0] != "rollmux"}
    assert crossing == PHASE_API_ENTRY
    for mod, path in _modules().items():
        if mod.split(".")[0] != "rollmux":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "ray" or n.startswith("ray.") for n in names), f"{mod} imports Ray"


def test_actors_import_neither_the_http_app_nor_the_cli():
    graph = import_graph()
    for mod, ts in graph.items():
        if mod.split(".")[0] in ("actors", "collectives", "rollmux"):
            assert not ts & {"serve_app", "rollmux_cli"}, mod
            assert not any(t.split(".")[0] == "serve_api" for t in ts), mod
