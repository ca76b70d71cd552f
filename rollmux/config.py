"""YAML configuration loading: every file under ``configs/`` is validated by a pydantic model.

``load_model(path, Model)`` reads YAML and returns a validated instance; errors name the file
and the offending field. Environment overrides use the ``ROLLMUX_`` prefix where a model
documents them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rollmux.models import ClusterSpec, GPUType, JobSpec

M = TypeVar("M", bound=BaseModel)

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"


class ConfigError(ValueError):
    """A configuration file is missing, not YAML, or fails validation (message names the field)."""


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file. Raises :class:`ConfigError` when missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:  # pragma: no cover - message passthrough
        raise ConfigError(f"{p}: not valid YAML: {e}") from e


def load_model(path: str | Path, model: type[M]) -> M:
    """Load YAML at ``path`` into ``model``. Raises :class:`ConfigError` naming the field."""
    data = read_yaml(path)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {e}") from e


def load_gpu_types(path: str | Path = CONFIG_DIR / "gpus.yaml") -> dict[str, GPUType]:
    """GPU catalogue ``{name: GPUType}`` from ``configs/gpus.yaml``."""
    data = read_yaml(path)
    try:
        return {g["name"]: GPUType.model_validate(g) for g in data["gpus"]}
    except (ValidationError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: {e}") from e


def load_cluster(path: str | Path = CONFIG_DIR / "cluster_paper.yaml") -> ClusterSpec:
    """Cluster spec from YAML; ``gpu:`` fields may name an entry of ``configs/gpus.yaml``."""
    data = read_yaml(path)
    gpus = load_gpu_types()
    try:
        for pool in ("rollout_pool", "train_pool"):
            node = data[pool]["node"]
            if isinstance(node.get("gpu"), str):
                name = node["gpu"]
                if name not in gpus:
                    raise ConfigError(f"{path}: {pool}.node.gpu: unknown GPU type {name!r} (known: {sorted(gpus)})")
                node["gpu"] = gpus[name].model_dump()
        return ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {e}") from e
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{path}: missing or malformed section {e}") from e


def load_job(path: str | Path) -> JobSpec:
    """A job spec from YAML (``configs/jobs/*.yaml``); a top-level ``job:`` key is accepted."""
    data = read_yaml(path)
    if isinstance(data, dict) and "job" in data and isinstance(data["job"], dict):
        data = data["job"]
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {e}") from e
