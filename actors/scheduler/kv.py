"""Checkpoint stores for the GlobalScheduler's target state (jobs + group table snapshot).

A four-method interface (``get``/``put``/``delete``/``keys``) with three implementations:

- :class:`MemoryKV`: a dict, for unit tests (does not survive the process).
- :class:`FileKV`: one JSON file per key under a directory, written atomically (temp file +
  ``os.replace``); put the directory on a shared filesystem for production so a restarted
  scheduler on any node finds it. Survives Ray cluster restarts.
- :class:`RayInternalKV`: Ray's GCS internal KV (``ray.experimental.internal_kv``); survives
  actor restarts (the default), and GCS restarts only with GCS fault tolerance (Redis).

Values are JSON-able objects (dicts / lists); keys are short strings. Source: the Ray Serve
controller's checkpoint-before-act pattern.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Optional

_KEY_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"invalid KV key {key!r}: 1-200 chars of letters, digits, '._:-'")
    return key


class KVStore(ABC):
    """Key -> JSON-able value store. ``get`` returns ``None`` for a missing key."""

    @abstractmethod
    def get(self, key: str) -> Optional[Any]: ...

    @abstractmethod
    def put(self, key: str, value: Any) -> None: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def keys(self, prefix: str = "") -> list[str]: ...

    def where(self, key: str) -> str:
        """Where ``key`` is stored, for messages (a file path, a KV namespace)."""
        return f"{type(self).__name__} key {key!r}"

    def recovery_hint(self) -> str:
        """How an operator discards this store's checkpoint (named in a refusal to start)."""
        return "delete the scheduler's keys from the store"


class MemoryKV(KVStore):
    """In-process dict store (tests). Values are round-tripped through JSON like the others."""

    def __init__(self) -> None:
        self._d: dict[str, str] = {}

    def get(self, key: str) -> Optional[Any]:
        raw = self._d.get(_check_key(key))
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        self._d[_check_key(key)] = json.dumps(value)

    def delete(self, key: str) -> None:
        self._d.pop(_check_key(key), None)

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k in list(self._d) if k.startswith(prefix))  # a copy: another thread may write


class FileKV(KVStore):
    """One ``<key>.json`` per key under ``root`` (created); atomic replace on ``put``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / f"{_check_key(key)}.json"

    def where(self, key: str) -> str:
        return f"file {self._path(key)}"

    def recovery_hint(self) -> str:
        return f"`rollmux down --purge` (deletes {self.root}), or `mv {self.root} {self.root}.bad`"

    def get(self, key: str) -> Optional[Any]:
        p = self._path(key)
        if not p.is_file():
            return None
        return json.loads(p.read_text())

    def put(self, key: str, value: Any) -> None:
        data = json.dumps(value)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(key))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.json") if p.stem.startswith(prefix))


class RayInternalKV(KVStore):
    """Ray GCS internal KV under ``namespace`` (must run inside a connected Ray worker/driver)."""

    def __init__(self, namespace: str = "rollmux") -> None:
        self.namespace = namespace

    def where(self, key: str) -> str:
        return f"Ray GCS internal KV {self.namespace}/{key}"

    def recovery_hint(self) -> str:
        return "restart the Ray cluster (`ray stop --force`; the GCS KV goes with it) or pass a checkpoint path"

    def _kv(self):
        from ray.experimental import internal_kv

        return internal_kv

    def get(self, key: str) -> Optional[Any]:
        raw = self._kv()._internal_kv_get(_check_key(key), namespace=self.namespace)
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        self._kv()._internal_kv_put(_check_key(key), json.dumps(value), overwrite=True, namespace=self.namespace)

    def delete(self, key: str) -> None:
        self._kv()._internal_kv_del(_check_key(key), namespace=self.namespace)

    def keys(self, prefix: str = "") -> list[str]:
        ks = self._kv()._internal_kv_list(prefix, namespace=self.namespace) or []
        return sorted(k.decode() if isinstance(k, bytes) else k for k in ks)


def make_kv(checkpoint_path: Optional[str] = None, *, namespace: str = "rollmux") -> KVStore:
    """``FileKV(checkpoint_path)`` when a path is given, else ``RayInternalKV(namespace)``."""
    return FileKV(checkpoint_path) if checkpoint_path else RayInternalKV(namespace)
