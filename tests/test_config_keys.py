"""Every key of every YAML file under ``configs/`` is declared by the pydantic model its loader
validates it into, and read by the code.

How: each file is loaded through the loader the code uses (:data:`LOADERS`; a file without one
fails, so a new config file must be registered here), and the YAML mapping is walked beside the
validated model: each key must name a field of the model at that place (``extra="forbid"`` also
refuses others at load time), and each such field must be *read* somewhere in the repository's
own code outside ``tests/``: as an attribute (``cfg.field``), a string key of a subscript or of
``get`` / ``getattr`` / ``pop``, so that a key only declared in a model (the failure mode of a
setting added and never wired) fails. The section names of a multi-section file must be
given to its loader somewhere in the code likewise.

Limits: a read is found by its name, not its type, so a key whose name is also read as an
attribute of another object passes on that read. ``test_the_checker_finds_an_unread_key`` shows
that the check fails on a key nothing reads.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from pydantic import BaseModel

from examples.grpo.config import load_job_config
from rollmux.admission import load_scheduler_config
from rollmux.config import CONFIG_DIR, REPO_ROOT, load_cluster, load_gpu_types, load_serve_config, read_yaml
from rollmux.emulation import load_emulation_config
from rollmux.rollout_sched import load_rollout_sched_config

#: the repository's own code: every ``.py`` file outside tests/
SOURCE_ROOTS = ("rollmux", "actors", "collectives", "examples", "scripts", "serve_api", "serve_app.py", "rollmux_cli.py")

Loaded = list[tuple[tuple, BaseModel, dict]]  # (key path of the mapping, validated model, the YAML mapping)


def _sections(load: Callable[[Path, str], BaseModel]) -> Callable[[Path], Loaded]:
    """A loader of a multi-section file (``section: {...}`` each, loaded by name)."""
    def f(p: Path) -> Loaded:
        data = read_yaml(p)
        return [((s,), load(p, s), data[s]) for s in data]
    return f


def _gpus(p: Path) -> Loaded:
    data, types = read_yaml(p), load_gpu_types(p)
    return [(("gpus", i), types[g["name"]], g) for i, g in enumerate(data["gpus"])]


#: file name pattern (relative to configs/) -> what the code loads it with, as (path, model, mapping)
LOADERS: dict[str, Callable[[Path], Loaded]] = {
    "scheduler.yaml": lambda p: [((), load_scheduler_config(p), read_yaml(p))],
    "emulation.yaml": lambda p: [((), load_emulation_config(p), read_yaml(p))],
    "rollout_sched.yaml": _sections(lambda p, s: load_rollout_sched_config(p, section=s)),
    "serve.yaml": lambda p: [((), load_serve_config(p, env={}), read_yaml(p))],
    "gpus.yaml": _gpus,
    "cluster_*.yaml": lambda p: [((), load_cluster(p), read_yaml(p))],
    "jobs/*.yaml": lambda p: [((), load_job_config(p), read_yaml(p))],
}
#: top-level keys that are not model fields but sections or lists the loader itself indexes
STRUCTURE_KEYS = {"rollout_sched.yaml": "sections", "gpus.yaml": ("gpus",)}


def config_files() -> list[Path]:
    return sorted(CONFIG_DIR.rglob("*.yaml")) + sorted(CONFIG_DIR.rglob("*.yml"))


def loader_of(path: Path) -> tuple[str, Callable[[Path], Loaded]]:
    rel = path.relative_to(CONFIG_DIR)
    for pattern, load in LOADERS.items():
        if rel.match(pattern):
            return pattern, load
    raise AssertionError(f"configs/{rel.as_posix()} has no loader in LOADERS: register the code that reads it")


def _field_of(model: type[BaseModel], key: str) -> str | None:
    for name, f in model.model_fields.items():
        if key in (name, f.alias):
            return name
    return None


def declared(model: BaseModel, data: Any, path: tuple) -> Iterator[tuple[tuple, type[BaseModel], str | None]]:
    """``(key path, model class, field name or None when the key is no field)`` for every key of
    ``data``, recursing into sub-models (also inside lists and dicts) beside the YAML."""
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        name = _field_of(type(model), key)
        yield path + (key,), type(model), name
        if name is None:
            continue
        sub = getattr(model, name)
        if isinstance(sub, BaseModel):
            yield from declared(sub, value, path + (key,))
        elif isinstance(sub, (list, tuple)) and isinstance(value, list):
            for i, (s, v) in enumerate(zip(sub, value)):
                if isinstance(s, BaseModel):
                    yield from declared(s, v, path + (key, i))
        elif isinstance(sub, dict) and isinstance(value, dict):
            for k, v in value.items():
                if isinstance(sub.get(k), BaseModel):
                    yield from declared(sub[k], v, path + (key, k))


def source_files() -> list[Path]:
    out = []
    for r in SOURCE_ROOTS:
        p = REPO_ROOT / r
        out += [p] if p.is_file() else sorted(p.rglob("*.py"))
    return out


def reads_in(sources: dict[str, str]) -> set[str]:
    """Names the code reads: attribute loads, and string keys of subscripts and of
    ``get`` / ``getattr`` / ``hasattr`` / ``pop`` / ``setdefault`` calls (the key argument only)."""
    names: set[str] = set()
    for label, text in sources.items():
        for node in ast.walk(ast.parse(text, label)):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                    names.add(node.slice.value)
            elif isinstance(node, ast.Call):
                fn = node.func
                if isinstance(fn, ast.Name) and fn.id in ("getattr", "hasattr") and len(node.args) >= 2:
                    key = node.args[1]
                elif isinstance(fn, ast.Attribute) and fn.attr in ("get", "pop", "setdefault") and node.args:
                    key = node.args[0]
                else:
                    continue
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    names.add(key.value)
    return names


def string_constants(sources: dict[str, str]) -> set[str]:
    return {n.value for text in sources.values() for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def problems_of(label: str, loaded: Loaded, data: dict, structure, reads: set[str], consts: set[str]) -> list[str]:
    """The problems of one file (``label``) as its loader gave it (``loaded``; ``data``: the whole
    YAML mapping; ``structure``: :data:`STRUCTURE_KEYS` of its loader): a key that is no field
    of its model, a field nothing reads, a section no code loads by name
    (``"label: key.path: what"`` each)."""
    problems = []
    if structure == "sections":
        problems += [f"{label}: {s}: section no code loads by name" for s in data if s not in consts]
    else:
        problems += [f"{label}: {k}: read by no code" for k in structure if k in data and k not in reads]
    for path, model, payload in loaded:
        for keys, cls, name in declared(model, payload, path):
            where = ".".join(map(str, keys))
            if name is None:
                if keys[-1] not in structure:
                    problems.append(f"{label}: {where}: not a field of {cls.__name__}")
            elif name not in reads:
                problems.append(f"{label}: {where}: {cls.__name__}.{name} is declared but read by no code")
    return problems


def unread_keys(files: list[Path], sources: dict[str, str]) -> list[str]:
    """:func:`problems_of` every file, each loaded by its loader."""
    reads, consts = reads_in(sources), string_constants(sources)
    out = []
    for f in files:
        pattern, load = loader_of(f)
        out += problems_of(f.relative_to(CONFIG_DIR).as_posix(), load(f), read_yaml(f) or {},
                           STRUCTURE_KEYS.get(pattern, ()), reads, consts)
    return out


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {str(p.relative_to(REPO_ROOT)): p.read_text() for p in source_files()}


def test_every_config_file_has_its_loader():
    files = config_files()
    assert {f.name for f in files} >= {"scheduler.yaml", "rollout_sched.yaml", "serve.yaml", "gpus.yaml"}
    for f in files:
        loader_of(f)


def test_every_key_of_every_config_file_is_read_by_the_code(sources):
    files = config_files()
    n_keys = sum(1 for f in files for path, model, data in loader_of(f)[1](f) for _ in declared(model, data, path))
    assert n_keys > 200  # the walk reached the nested sections (rollout_sched budget / index / coldstart, job files)
    assert unread_keys(files, sources) == []


def test_the_checker_finds_an_unread_key(sources):
    """A key declared by its model but read nowhere fails (as ``budget.kv_bytes_per_token`` of
    ``configs/rollout_sched.yaml`` did: a memory figure no code used); a key that is no field, and
    a section no code loads, fail too; each passes once the code reads it."""
    class Budget(BaseModel):
        kv_capacity_tokens: int
        planted_kv_bytes_per_token: int

    class Sched(BaseModel):
        slice_tokens: int
        budget: Budget

    data = {"planted_section": {"slice_tokens": 8, "budget": {"kv_capacity_tokens": 64, "planted_kv_bytes_per_token": 512}}}
    loaded = [(("planted_section",), Sched.model_validate(data["planted_section"]), data["planted_section"])]
    reads, consts = reads_in(sources), string_constants(sources)
    assert "slice_tokens" in reads and "kv_capacity_tokens" in reads
    assert problems_of("x.yaml", loaded, data, "sections", reads, consts) == [
        "x.yaml: planted_section: section no code loads by name",
        "x.yaml: planted_section.budget.planted_kv_bytes_per_token: Budget.planted_kv_bytes_per_token is declared "
        "but read by no code"]
    wired = {**sources, "wired.py": "def f(load, cfg):\n    load(section='planted_section')\n"
                                    "    return cfg.budget.planted_kv_bytes_per_token\n"}
    assert problems_of("x.yaml", loaded, data, "sections", reads_in(wired), string_constants(wired)) == []
    assert problems_of("x.yaml", loaded, data, "sections", reads_in({"k.py": "v = d.get('planted_kv_bytes_per_token')"}) | reads,
                       consts | {"planted_section"}) == []
    # a key that is no field of the model at its place (a typo the model would refuse at load time)
    typo = {"slice_tokens": 8, "budget": {"kv_capacity_tokens": 64, "planted_kv_bytes_per_token": 1}, "slice_token": 3}
    model = Sched.model_validate({k: v for k, v in typo.items() if k != "slice_token"})
    assert problems_of("y.yaml", [((), model, typo)], typo, (), reads | {"planted_kv_bytes_per_token"}, consts) == [
        "y.yaml: slice_token: not a field of Sched"]


#: the words YAML 1.1 (PyYAML's default) reads as booleans; the configs are read as YAML 1.2 (only
#: true / false are booleans: rollmux.config.ConfigLoader)
YAML11_BOOL_WORDS = {"on": True, "off": False, "yes": True, "no": False, "y": True, "n": False}


def _words_of(annotation) -> dict[str, Any]:
    """The YAML-1.1-boolean words a field of this type documents, with the value each must load as:
    every such word of a ``Literal`` (itself), ``on`` / ``off`` / ``yes`` / ``no`` for a ``bool``."""
    import typing

    if annotation is bool:
        return {w: YAML11_BOOL_WORDS[w.lower()] for w in ("on", "off", "yes", "no", "On", "OFF", "Yes", "NO")}
    if typing.get_origin(annotation) is typing.Literal:
        return {a: a for a in typing.get_args(annotation) if isinstance(a, str) and a.lower() in YAML11_BOOL_WORDS}
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        out: dict[str, Any] = {}
        for a in typing.get_args(annotation):
            out.update(_words_of(a))
        return out
    return {}


def _at(obj: Any, keys: tuple) -> Any:
    for k in keys:
        obj = obj[k] if isinstance(obj, (dict, list, tuple)) else getattr(obj, _field_of(type(obj), k) or k)
    return obj


def test_documented_values_yaml_reads_as_booleans_load_as_written(tmp_path):
    """Every key of every config file whose values include a word YAML 1.1 reads as a boolean
    (``per_job_allocations: off``, ``saturation: off``, ``open_read_routes: on``, ...) loads
    with the word written unquoted: a Literal setting gets the word, a boolean the truth value."""
    import yaml

    checked = 0
    for f in config_files():
        _, load = loader_of(f)
        for path, model, payload in load(f):
            for keys, cls, name in list(declared(model, payload, path)):
                words = _words_of(cls.model_fields[name].annotation) if name else {}
                for word, want in words.items():
                    data = read_yaml(f)
                    parent = _at(data, keys[:-1])
                    parent[keys[-1]] = "__WORD__"
                    text = yaml.safe_dump(data, sort_keys=False).replace("__WORD__", word)
                    copy = tmp_path / f.relative_to(CONFIG_DIR)
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    copy.write_text(text)
                    got = [m for p, m, _ in load(copy) if p == path][0]
                    assert _at(got, keys[len(path):]) == want, (f.name, keys, word)
                    checked += 1
    assert checked >= 20  # per_job_allocations, saturation and the boolean settings of every file


def test_per_job_allocations_off_as_documented_runs_the_replay(tmp_path):
    """``per_job_allocations: off   # off | simulator``, written as configs/scheduler.yaml documents
    it, in a user's own config given to ``rollmux simulate --config`` (and ``$ROLLMUX_SCHEDULER_CONFIG``)."""
    from typer.testing import CliRunner

    from rollmux.cli import app
    from rollmux.traces import EXTRACT_TRACE

    text = (CONFIG_DIR / "scheduler.yaml").read_text()
    lines = ["per_job_allocations: off   # off | simulator" if ln.startswith("per_job_allocations:") else ln
             for ln in text.splitlines()]
    cfg = tmp_path / "scheduler.yaml"
    cfg.write_text("\n".join(lines) + "\n")
    assert load_scheduler_config(cfg).per_job_allocations == "off"
    args = ["simulate", "--trace", str(EXTRACT_TRACE), "--policies", "rollmux", "--jobs", "5", "--no-progress"]
    r = CliRunner().invoke(app, [*args, "--config", str(cfg), "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b")], env={"ROLLMUX_SCHEDULER_CONFIG": str(cfg)})
    assert r.exit_code == 0, r.output
    import json

    assert json.loads((tmp_path / "b" / "summary.json").read_text())["meta"]["scheduler_config"] == "scheduler.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text("\n".join("per_job_allocations: false" if ln.startswith("per_job_allocations:") else ln
                             for ln in text.splitlines()) + "\n")
    r = CliRunner().invoke(app, [*args, "--config", str(bad), "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "per_job_allocations" in r.output and "'off' or 'simulator'" in r.output


def test_the_shipped_scheduler_file_is_the_models_defaults():
    """configs/scheduler.yaml (what `rollmux up` and `rollmux simulate` read) and SchedulerConfig's
    defaults (what scripts and tests that build SchedulerConfig() get) are one configuration: a
    benchmark on the model's defaults measures the shipped default."""
    from rollmux.admission import SchedulerConfig, load_scheduler_config

    shipped, model = load_scheduler_config().model_dump(), SchedulerConfig().model_dump()
    assert {k: (shipped[k], model[k]) for k in shipped if shipped[k] != model[k]} == {}
