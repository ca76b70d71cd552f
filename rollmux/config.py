"""YAML configuration loading: every file under ``configs/`` is validated by a pydantic model.

``load_model(path, Model)`` reads YAML and returns a validated instance; errors name the file
and the offending field. Environment overrides use the ``ROLLMUX_`` prefix where a model
documents them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from rollmux.models import ClusterSpec, GPUType, JobSpec

M = TypeVar("M", bound=BaseModel)

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"


def repo_label(path: str | Path) -> str:
    """How a result file names a file it read or wrote: its path relative to the repository root
    when it lies inside the repository (``data/philly-adaptdl-philly.csv.gz``,
    ``results/runtime_gantt.png``), else the file's name only, so that no committed result records
    a machine's directory layout.

    Args:
        path: absolute, or relative to the working directory.

    Returns:
        A POSIX path relative to the repository root, or the bare file name.
    """
    p = Path(path).expanduser().resolve()
    try:
        return p.relative_to(REPO_ROOT.resolve()).as_posix()
    except ValueError:
        return p.name


class ConfigError(ValueError):
    """A configuration file is missing, not YAML, or fails validation (message names the field)."""


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only ``true`` / ``false`` (``True``, ``TRUE``,
    ...) are booleans. PyYAML follows YAML 1.1, which also reads ``on`` / ``off`` / ``yes`` / ``no``
    / ``y`` / ``n`` as booleans, so a value documented as ``off`` (``per_job_allocations: off``,
    ``saturation: off``) arrived as ``False`` and was refused. Here such words stay the strings
    written; a boolean setting still accepts them (pydantic reads ``on`` / ``off`` / ``yes`` / ``no``
    as booleans), and any other setting sees exactly the word in the file."""


_BOOL_TAG = "tag:yaml.org,2002:bool"
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file (YAML 1.2 booleans: :class:`ConfigLoader`). Raises :class:`ConfigError`
    when missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        return yaml.load(p.read_text(), Loader=ConfigLoader)  # noqa: S506 (a SafeLoader)
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


#: Facts a job file could state twice: (``job:`` field of the admission spec, ``run:`` field of the
#: RL loop). A file states each once (the other side is filled in) or both equal.
JOB_RUN_SAME_FACTS = (("num_prompts", "num_prompts"), ("responses_per_prompt", "group_size"),
                      ("max_response_tokens", "max_new_tokens"))


def unify_job_file(data: Mapping[str, Any], path: str | Path = "job file") -> dict:
    """One value per fact in a job file with ``job:`` and ``run:`` sections: a fact stated on one
    side is copied to the other (:data:`JOB_RUN_SAME_FACTS`), so admission plans for the job that
    runs. Raises :class:`ConfigError` naming both fields when the two sides disagree. A mapping
    without both sections is returned unchanged."""
    job, run = data.get("job"), data.get("run")
    if not isinstance(job, dict) or not isinstance(run, dict):
        return dict(data)
    job, run = dict(job), dict(run)
    for jk, rk in JOB_RUN_SAME_FACTS:
        if jk in job and rk in run and job[jk] != run[rk]:
            raise ConfigError(f"{path}: job.{jk} ({job[jk]}) and run.{rk} ({run[rk]}) state the same fact "
                              "differently; give it once")
        if jk in job:
            run[rk] = job[jk]
        elif rk in run:
            job[jk] = run[rk]
    return {**data, "job": job, "run": run}


def load_job(path: str | Path) -> JobSpec:
    """A job spec from YAML (``configs/jobs/*.yaml``); a top-level ``job:`` key is accepted (with a
    ``run:`` section, the facts both state are unified first, :func:`unify_job_file`)."""
    data = read_yaml(path)
    if isinstance(data, dict) and "job" in data and isinstance(data["job"], dict):
        data = unify_job_file(data, path)["job"]
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {e}") from e


# --- Operator configuration (HTTP admission endpoint and `rollmux up`), configs/serve.yaml ---

class ServeConfig(BaseModel):
    """Configuration of the HTTP admission endpoint and of ``rollmux up`` (``configs/serve.yaml``).

    Precedence: command-line flags > environment ``ROLLMUX_<FIELD>`` (e.g. ``ROLLMUX_PORT``,
    ``ROLLMUX_OPEN_READ_ROUTES``) > YAML > defaults. The API token itself is read from
    ``token`` (discouraged in files), else the environment variable named by ``token_env``,
    else ``token_file`` (written with mode 0600 by ``rollmux up`` when no token exists).

    Attributes:
        host / port: where Serve's HTTP proxy listens (loopback by default).
        token_env: name of the environment variable holding the bearer token.
        token_file: file holding the token (default ``<state_dir>/api_token``).
        open_read_routes: GET routes answer without a token when true.
        open_read_rate_per_s: requests per second one client (by address) may make on the read
            routes without a token, per replica (a token bucket holding ``open_read_burst``);
            more get 429 with ``Retry-After``. Requests with the token are not limited.
        open_read_burst: the bucket's size (requests a client may send at once).
        cluster_spec: cluster YAML the GlobalScheduler plans for.
        scheduler_config: scheduler settings YAML the GlobalScheduler runs with
            (:class:`rollmux.admission.SchedulerConfig`: tenant quotas, priority classes, ...;
            ``None`` = ``configs/scheduler.yaml``); ``rollmux up --scheduler-config`` or env
            ``ROLLMUX_SCHEDULER_CONFIG``. Validated before anything starts; a scheduler restored
            from its checkpoint keeps the checkpoint's settings, so ``up`` refuses a given file
            that differs from them.
        state_dir: where ``rollmux up`` keeps its state file, token and checkpoint.
        checkpoint_path: scheduler checkpoint directory (default ``<state_dir>/checkpoint``).
        scheduler_name: Ray name of the GlobalScheduler actor (``None`` = the contract's default in
            :mod:`actors.scheduler.global_scheduler`; its namespace is always ``rollmux``).
        num_replicas / max_ongoing_requests: Serve replicas of the API and concurrent requests each.
        request_timeout_s: bound on one call from a Serve replica to the scheduler, s (0, 600].
        max_request_bytes: largest accepted request body, bytes (1 KiB .. 16 MiB; larger: 413).
        max_pending_writes: writes (admissions, departures) one replica has in flight at most;
            more get 429 with ``Retry-After``.
        max_queued_requests: requests Serve queues for the replicas at most (more: 503).
        access_log: Serve's per-request access log lines (proxy and replicas); off by default,
            each line costs CPU on the request path.
        ray_port / dashboard_port / metrics_export_port: Ray head ports used by ``rollmux up``.
        head_cpus: logical CPUs of the Ray head started by ``rollmux up``.
        start_pool_nodes: ``rollmux up`` also starts one Ray node per pool node of a bounded spec.
        ray_auth: Ray's own authentication on the cluster ``rollmux up`` starts: ``token`` (default;
            every Ray endpoint needs the Ray token) or ``disabled`` (refused by ``rollmux up`` when the
            host has a non-loopback address, unless forced).
        ray_token_file: Ray token file (default ``<state_dir>/ray_auth_token``, generated with mode
            0600 by ``rollmux up`` when neither ``$RAY_AUTH_TOKEN`` nor ``$RAY_AUTH_TOKEN_PATH`` is set).
        ray_address: a running Ray cluster to deploy the scheduler and the API onto (``host:port``
            of its GCS, or ``auto``); ``None`` = ``rollmux up`` starts a local cluster.
    Raises:
        pydantic.ValidationError: a field out of range (message names it).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    host: str = Field(default="127.0.0.1", min_length=1, max_length=253)
    port: int = Field(default=8000, ge=1, le=65535)
    token: Optional[SecretStr] = None
    token_env: str = Field(default="ROLLMUX_API_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    token_file: Optional[Path] = None
    open_read_routes: bool = True
    open_read_rate_per_s: float = Field(default=50.0, gt=0, le=1_000_000, allow_inf_nan=False)
    open_read_burst: int = Field(default=100, ge=1, le=1_000_000)
    cluster_spec: Path = CONFIG_DIR / "cluster_local.yaml"
    scheduler_config: Optional[Path] = None
    state_dir: Path = Path("~/.rollmux")
    checkpoint_path: Optional[Path] = None
    scheduler_name: Optional[str] = None
    app_name: str = Field(default="rollmux", min_length=1, max_length=64)
    num_replicas: int = Field(default=1, ge=1, le=64)
    max_ongoing_requests: int = Field(default=64, ge=1, le=10_000)
    request_timeout_s: float = Field(default=30.0, gt=0, le=600)
    max_request_bytes: int = Field(default=64 * 1024, ge=1024, le=16 << 20)
    max_pending_writes: int = Field(default=256, ge=1, le=100_000)
    max_queued_requests: int = Field(default=1024, ge=1, le=1_000_000)
    access_log: bool = False
    ray_port: int = Field(default=6390, ge=1, le=65535)
    dashboard_port: int = Field(default=8265, ge=1, le=65535)
    metrics_export_port: int = Field(default=8080, ge=1, le=65535)
    head_cpus: int = Field(default=2, ge=1, le=1024)
    start_pool_nodes: bool = True
    ray_auth: Literal["token", "disabled"] = "token"
    ray_token_file: Optional[Path] = None
    ray_address: Optional[str] = Field(default=None, min_length=1)

    @field_validator("state_dir", "token_file", "ray_token_file", "checkpoint_path", "cluster_spec", "scheduler_config")
    @classmethod
    def _expand(cls, v: Optional[Path]) -> Optional[Path]:
        if v is None:
            return None
        v = Path(v).expanduser()
        # relative paths that do not exist from the working directory are taken from the repo root
        if not v.is_absolute() and not v.exists() and (REPO_ROOT / v).exists():
            v = REPO_ROOT / v
        return v.absolute()

    @property
    def token_path(self) -> Path:
        return self.token_file or self.state_dir / "api_token"

    @property
    def ray_token_path(self) -> Path:
        return self.ray_token_file or self.state_dir / "ray_auth_token"

    @property
    def checkpoint(self) -> Path:
        return self.checkpoint_path or self.state_dir / "checkpoint"

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def resolve_token(self, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The bearer token: ``token``, else ``$<token_env>``, else the token file; ``None`` if none."""
        env = os.environ if env is None else env
        if self.token is not None and self.token.get_secret_value():
            return self.token.get_secret_value()
        if env.get(self.token_env):
            return env[self.token_env]
        if self.token_path.is_file():
            return self.token_path.read_text().strip() or None
        return None


def load_serve_config(
    path: Optional[str | Path] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    env: Optional[Mapping[str, str]] = None,
) -> ServeConfig:
    """``ServeConfig`` from YAML (default ``configs/serve.yaml``), then ``ROLLMUX_*`` env, then ``overrides``.

    ``overrides`` with value ``None`` are ignored (unset command-line flags).
    Raises:
        ConfigError: missing / malformed file or an invalid field (the message names it).
    """
    env = os.environ if env is None else env
    p = Path(path) if path is not None else Path(env.get("ROLLMUX_SERVE_CONFIG", CONFIG_DIR / "serve.yaml"))
    data = dict(read_yaml(p) or {}) if (path is not None or p.is_file()) else {}
    for name in ServeConfig.model_fields:
        key = f"ROLLMUX_{name.upper()}"
        if name != "token" and env.get(key) not in (None, ""):
            data[name] = env[key]
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{p}: {e}") from e
