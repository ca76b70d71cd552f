"""Errors are told apart by their type and attributes, never by their message text.

A message is for people; code that branches on it breaks when the wording changes. The check
reads every product module (``ast``): inside an ``except ... as e`` handler, no comparison
(``in``, ``==``, ...) and no ``startswith`` / ``endswith`` / ``find`` / ``index`` call may
take ``str(e)``, ``repr(e)``, ``e.args`` or ``format(e)``, and no line of ``str(e).splitlines()``
may be compared (taking the first line to show it is formatting, not a branch).
``test_the_checker_finds_message_matching`` shows that it fails on the patterns it looks for.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("rollmux", "actors", "collectives", "serve_api", "examples", "scripts", "serve_app.py", "rollmux_cli.py")
TEXT_METHODS = {"startswith", "endswith", "find", "rfind", "index", "rindex", "count"}
SPLIT_METHODS = {"splitlines", "split"}  # formatting (a message's first line), unless a line is compared


def _is_text_of(node: ast.AST, names: set[str]) -> bool:
    """``str(e)`` / ``repr(e)`` / ``format(e)`` / ``e.args`` / ``e.args[i]`` for a bound name ``e``."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and node.attr == "args":
        return isinstance(node.value, ast.Name) and node.value.id in names
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("str", "repr", "format")
            and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id in names)


def message_matches(source: str, filename: str = "<src>") -> list[str]:
    """``file:line`` of every branch on an exception's message text in ``source``."""
    out: list[str] = []
    for handler in ast.walk(ast.parse(source, filename)):
        if not isinstance(handler, ast.ExceptHandler) or not handler.name:
            continue
        names = {handler.name}
        for node in (n for stmt in handler.body for n in ast.walk(stmt)):
            if isinstance(node, ast.Compare) and any(_is_text_of(x, names) for x in (node.left, *node.comparators)):
                out.append(f"{filename}:{node.lineno}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TEXT_METHODS
                  and _is_text_of(node.func.value, names)):
                out.append(f"{filename}:{node.lineno}")
            elif isinstance(node, (ast.comprehension, ast.For)) and _splits_text_of(node.iter, names):
                tests = node.ifs if isinstance(node, ast.comprehension) else node.body
                if any(isinstance(n, (ast.Compare, ast.If)) for t in tests for n in ast.walk(t)):
                    out.append(f"{filename}:{node.iter.lineno}")  # a line of the message is compared
    return out


def _splits_text_of(node: ast.AST, names: set[str]) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SPLIT_METHODS
            and _is_text_of(node.func.value, names))


def _product_files():
    for entry in PRODUCT:
        p = ROOT / entry
        yield from ([p] if p.is_file() else sorted(p.rglob("*.py")))


def test_no_branching_on_exception_message_text():
    found = [hit for p in _product_files() for hit in message_matches(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, f"branching on an exception's message text (give the error a type or an attribute): {found}"


def test_the_checker_finds_message_matching():
    bad = '''
try:
    f()
except ValueError as e:
    if "cannot be recovered" in str(e):
        raise
    why = next(ln for ln in str(e).splitlines() if "refusing" in ln)
    if e.args[0] == "x":
        pass
'''
    assert message_matches(bad) == ["<src>:5", "<src>:7", "<src>:8"]
    ok = '''
try:
    f()
except WorkerLost as e:
    if not e.recoverable:
        raise
    log.warning("failed: %s", str(e).splitlines()[0])
'''
    assert message_matches(ok) == []


def test_worker_lost_says_whether_it_is_recoverable_across_ray():
    """``WorkerLost.recoverable`` survives pickling and Ray's ``RayTaskError`` wrapper (what the
    driver's handle re-raises: an instance of the original class)."""
    from ray.exceptions import RayTaskError

    from actors.handles import unwrap
    from actors.worker.commits import WorkerLost

    for recoverable in (True, False):
        e = pickle.loads(pickle.dumps(WorkerLost("worker on train-0 was lost", recoverable=recoverable)))
        assert e.recoverable is recoverable and str(e) == "worker on train-0 was lost"
        got = unwrap(RayTaskError("TrainWorkerImpl.run", "Traceback ...", e))
        assert isinstance(got, WorkerLost) and got.recoverable is recoverable
