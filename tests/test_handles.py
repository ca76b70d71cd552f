"""Every Ray call to one of the project's actors goes through ``actors/handles/`` (read with ``ast``).

The handles hold the timeouts, retries and error translation of those calls in one place, with
typed methods (no method chosen by a string): outside ``actors/handles/`` no module of the
project calls ``<handle>.<method>.remote(...)``, creates an actor with ``ray.remote(...)`` /
``.options(...).remote(...)``, or picks an actor's method with ``getattr`` and a name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HANDLES = sorted((ROOT / "actors" / "handles").glob("*.py"))
SOURCES = [*sorted((ROOT / "actors").rglob("*.py")), *sorted((ROOT / "rollmux").rglob("*.py")),
           *sorted((ROOT / "collectives").rglob("*.py")), *sorted((ROOT / "serve_api").rglob("*.py")),
           *sorted((ROOT / "examples").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py")),
           ROOT / "serve_app.py", ROOT / "rollmux_cli.py"]
#: the one actor outside the project's own: the admission benchmark's no-op actor measuring Serve's
#: replica -> actor hop (a ceiling for the scheduler's, not a RollMux actor)
NOT_OURS = {("scripts/bench_admission.py", "noop"), ("scripts/bench_admission.py", "@ray.remote")}
#: the tests call RollMux's actors through the handles too (where they plug in fakes); these are the
#: tests' own probe actors (not RollMux actors): where a Ray task lands on a node, and the gloo
#: transport's harness actors (a collectives test of its own)
TESTS = sorted((ROOT / "tests").glob("*.py"))
TEST_ACTORS = {("tests/job_probe.py", "probe"), ("tests/job_probe.py", "@ray.remote"),
               ("tests/test_local_jobs.py", "where"), ("tests/test_local_jobs.py", "@ray.remote"),
               ("tests/test_sync_gloo.py", "actor"), ("tests/test_sync_gloo.py", "[a."),
               ("tests/test_sync_gloo.py", "trainers[0].host")}


def _remote_calls(tree: ast.AST) -> list[int]:
    """Line numbers of every ``X.remote(...)`` call (a method call on an actor, an actor creation,
    or ``ray.remote``)."""
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "remote"]


def _getattr_dispatch(tree: ast.AST) -> list[int]:
    """``getattr(<x>, <name>).remote(...)``: an actor method chosen by a string."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "remote":
            v = n.func.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "getattr":
                out.append(n.lineno)
    return out


def _outside_handles(paths, allowed) -> dict[str, list[int]]:
    found = {}
    for path in paths:
        if path in HANDLES:
            continue
        rel = str(path.relative_to(ROOT))
        text = path.read_text().splitlines()
        lines = [n for n in _remote_calls(ast.parse(path.read_text(), str(path)))
                 if not any(rel == f and key in text[n - 1].lower() for f, key in allowed)]
        if lines:
            found[rel] = lines
    return found


def test_only_the_handle_module_calls_remote():
    found = _outside_handles(SOURCES, NOT_OURS)
    assert found == {}, f"Ray calls outside actors/handles/: {found}"
    assert all(_remote_calls(ast.parse(p.read_text())) for p in HANDLES if p.name != "__init__.py")  # seen where they are


def test_the_tests_call_rollmux_actors_through_the_handles():
    found = _outside_handles(TESTS, TEST_ACTORS)
    assert found == {}, f"tests calling a RollMux actor with .remote( instead of its handle: {found}"


def test_no_actor_method_is_chosen_by_a_string():
    for path in SOURCES:
        assert _getattr_dispatch(ast.parse(path.read_text(), str(path))) == [], path
    src = "h = getattr(handle, method).remote(1)\nx = a.b.remote()\n"
    assert _getattr_dispatch(ast.parse(src)) == [1] and _remote_calls(ast.parse(src)) == [1, 2]


def test_the_test_only_scheduler_flag_is_gone():
    for path in SOURCES:
        assert "create_controllers" not in path.read_text(), path


#: handle methods allowed to name dict / Any (none)
UNTYPED_LEFT: set[tuple[str, str]] = set()


def _untyped_methods(tree: ast.AST) -> set[tuple[str, str]]:
    """(class, method) of every handle method whose signature (parameters or answer) names
    ``dict`` / ``Any``."""
    found = set()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for f in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            a = f.args
            anns = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                    if x is not None and x.annotation is not None] + ([f.returns] if f.returns else [])
            names = {n.id for x in anns for n in ast.walk(x) if isinstance(n, ast.Name)}
            names |= {w for x in anns for n in ast.walk(x) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                      for w in n.value.replace("[", " ").replace("]", " ").replace(",", " ").split()}
            if names & {"dict", "Dict", "Any"}:
                found.add((cls.name, f.name))
    return found


def test_handle_methods_take_and_return_typed_values():
    """Data crossing an actor boundary is typed (rollmux.messages, rollmux.answers, the records):
    no handle method's signature names ``dict`` or ``Any``."""
    found = set().union(*(_untyped_methods(ast.parse(p.read_text())) for p in HANDLES))
    assert found == UNTYPED_LEFT, f"handle methods naming dict / Any: {sorted(found - UNTYPED_LEFT)}"
    src = "class H:\n    def a(self, x: dict) -> int: ...\n    def b(self) -> 'Optional[Any]': ...\n    def c(self) -> int: ...\n"
    assert _untyped_methods(ast.parse(src)) == {("H", "a"), ("H", "b")}
