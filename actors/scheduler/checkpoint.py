"""The GlobalScheduler's checkpoint: a base snapshot plus a write-ahead log, over a KV store.

Crash consistency by construction (RollMux fault tolerance, §5): every state change of the
scheduler (admission, departure, failure, expiry, progress, the moves of a departure
re-packing) is ONE atomic ``put`` of one write-ahead record ``<prefix>.w.<seq>``; a crash before
it means the change never happened, after it that it did. Restore reads the base
``<prefix>.base`` and applies the records after its ``seq`` in order; applying a record only
overwrites (job records, groups), so it is idempotent. A new base is written (one put) and the
records it covers are deleted once at least ``COMPACT_EVERY`` records hold at least
``COMPACT_RATIO`` times the base's bytes (or ``MAX_WAL_RECORDS`` records exist): compaction costs
O(state) but comes after O(state) bytes of records, so its cost per change does not grow with
the number of stored jobs. A crash between the put and the deletes leaves records that restore
skips.

Every value carries ``format``, ``version`` and the SHA-256 of its body. A base that is missing
while records exist, a record with a gap before it, a value that is truncated, garbled, of
another version or failing its checksum make :meth:`Checkpoint.load` raise
:class:`CheckpointError` naming the store location and the recovery command, never an empty
start. Keys derive from the scheduler name (hashed when it is long or has other characters),
never from a job id, so no job id can make a write fail after the policy committed.

A checkpoint of the previous layout (``<name>.meta`` + ``<name>.g.<group>`` + ``<name>.j.<job>``,
version 1) is read once and rewritten as a base.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any, Optional

from actors.scheduler.kv import KVStore

FORMAT = "rollmux-checkpoint"
VERSION = 2
COMPACT_EVERY = 64  # fewest write-ahead records between two bases
COMPACT_RATIO = 0.5  # ... and their bytes at least this share of the base's bytes
MAX_WAL_RECORDS = 4096  # ... or this many records (bounds a restore's reads)
_PLAIN = re.compile(r"^[A-Za-z0-9._:-]{1,120}$")


class CheckpointError(RuntimeError):
    """The checkpoint cannot be read: the message names where it is and how to recover."""


def _encoded(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def key_prefix(name: str) -> str:
    """The KV key prefix of scheduler ``name``: the name itself when it is short and plain, else
    ``h-`` + 24 hex digits of its SHA-256."""
    return name if _PLAIN.match(name) else "h-" + hashlib.sha256(name.encode()).hexdigest()[:24]


class Checkpoint:
    """Base + write-ahead log of one scheduler's state in ``kv``.

    The state is ``{header, groups: {group_id: group snapshot} (in the policy's group order), jobs: {job_id:
    record dict}, queue}`` (the policy's snapshot header and groups, :meth:`rollmux.admission.
    InterGroupScheduler.snapshot_header`, the stored job records and the admission queue,
    :meth:`rollmux.admission_queue.AdmissionQueue.snapshot`); a record (delta) has the same keys,
    ``groups`` / ``jobs`` holding only what changed (a group ``None``: dissolved), ``dropped`` the
    job ids whose records were deleted and ``queue`` only when the line changed. The queue rides
    in the same record as the admissions it gives up or takes in, so enqueueing, cancelling and a
    drain that admits queued jobs are each ONE atomic put.
    """

    def __init__(self, kv: KVStore, name: str, *, compact_every: int = COMPACT_EVERY,
                 compact_ratio: float = COMPACT_RATIO) -> None:
        self.kv, self.name, self.compact_every = kv, name, max(1, int(compact_every))
        self.compact_ratio = float(compact_ratio)
        self.base_bytes = 0  # bytes of the base's body
        self.wal_bytes = 0  # bytes of the records after it
        self._size = 0  # bytes of the last value read or wrapped
        self.prefix = key_prefix(name)
        self.base_key = f"{self.prefix}.base"
        self.seq = 0  # the last record written (or restored)
        self.base_seq = 0
        self._legacy: list[str] = []
        # what a restore would read now (the base with every record after it applied), kept in
        # step by every write: a new base is a copy of it, never a re-encoding of the live tables
        self.state: Optional[dict] = None
        self._wal_sizes: dict[int, int] = {}  # bytes of each record after the base
        self._book = threading.Lock()  # seq / base bookkeeping: the writer and a compacting thread

    def _wal_keys(self) -> list[str]:
        return [k for k in self.kv.keys(f"{self.prefix}.w.") if re.fullmatch(r"\d{12}", k[len(self.prefix) + 3:])]

    def _wkey(self, seq: int) -> str:
        return f"{self.prefix}.w.{seq:012d}"

    # ---- errors
    def _where(self, key: str) -> str:
        where = getattr(self.kv, "where", None)
        return where(key) if where else key

    def _refuse(self, key: str, problem: str) -> CheckpointError:
        hint = getattr(self.kv, "recovery_hint", lambda: "delete the scheduler's keys")()
        return CheckpointError(
            f"refusing to start scheduler {self.name!r}: its checkpoint {self._where(key)} {problem}. Restore the "
            f"checkpoint from a backup, or discard it and start with no jobs: {hint}")

    def _read(self, key: str, kind: str) -> Optional[dict]:
        try:
            v = self.kv.get(key)
        except Exception as e:  # truncated or garbled JSON, unreadable file
            raise self._refuse(key, f"cannot be read ({type(e).__name__}: {str(e)[:200]})") from e
        if v is None:
            return None
        if not isinstance(v, dict) or v.get("format") != FORMAT or v.get("kind") != kind:
            raise self._refuse(key, f"is not a {FORMAT} {kind} value")
        if v.get("version") != VERSION:
            raise self._refuse(key, f"has version {v.get('version')!r}; this scheduler reads version {VERSION}")
        raw = _encoded(v["body"]) if isinstance(v.get("body"), dict) else b""
        if not raw or hashlib.sha256(raw).hexdigest() != v.get("sha256"):
            raise self._refuse(key, "fails its SHA-256 checksum (garbled)")
        self._size = len(raw)
        return v["body"]

    def _wrap(self, kind: str, body: dict) -> dict:
        return self._wrap_sized(kind, body)[0]

    @staticmethod
    def _wrap_sized(kind: str, body: dict) -> tuple[dict, int]:
        raw = _encoded(body)
        return {"format": FORMAT, "version": VERSION, "kind": kind, "sha256": hashlib.sha256(raw).hexdigest(), "body": body}, len(raw)

    # ---- restore
    def load(self) -> Optional[dict]:
        """The restored state, or None when the store holds nothing of this scheduler (a fresh
        start). Raises :class:`CheckpointError` (see the module docstring)."""
        wal = self._wal_keys()
        base = self._read(self.base_key, "base")
        if base is None:
            if wal:
                raise self._refuse(self.base_key, f"is missing while {len(wal)} write-ahead records exist")
            return self._load_legacy()
        state, self.base_seq = _ordered(base["state"]), int(base["seq"])
        self.seq, self.base_bytes, self.wal_bytes, self._wal_sizes = self.base_seq, self._size, 0, {}
        for key in wal:
            seq = int(key.rsplit(".", 1)[1])
            if seq <= self.base_seq:
                continue  # covered by the base (a crash between a compaction and its deletes)
            if seq != self.seq + 1:
                raise self._refuse(key, f"follows record {self.seq}: records in between are missing")
            delta = self._read(key, "wal")
            if delta is None or int(delta.get("seq", -1)) != seq:
                raise self._refuse(key, "does not hold the record its key names")
            apply(state, delta)
            self.seq = seq
            self.wal_bytes += self._size
            self._wal_sizes[seq] = self._size
        self.state = _copy_state(state)
        return state

    def _load_legacy(self) -> Optional[dict]:
        mkey = f"{self.name}.meta"
        if not _PLAIN.match(self.name) or len(mkey) > 200:
            return None
        try:
            meta = self.kv.get(mkey)
        except Exception as e:
            raise self._refuse(mkey, f"cannot be read ({type(e).__name__}: {str(e)[:200]})") from e
        if meta is None:
            others = self.kv.keys(f"{self.name}.j.") + self.kv.keys(f"{self.name}.g.")
            if others:
                raise self._refuse(mkey, f"is missing while {len(others)} job / group records exist")
            return None
        if not isinstance(meta, dict) or meta.get("version") != 1 or "snapshot" not in meta:
            raise self._refuse(mkey, "is not a version-1 checkpoint header")
        groups = {}
        for gid in meta.get("group_ids", []):
            g = self.kv.get(f"{self.name}.g.{gid}")
            if g:
                groups[gid] = g
        jobs = {}
        for key in self.kv.keys(f"{self.name}.j."):
            raw = self.kv.get(key)
            if raw:
                jobs[raw["job_id"]] = raw
        self._legacy = [mkey, *(f"{self.name}.g.{g}" for g in meta.get("group_ids", [])),
                        *self.kv.keys(f"{self.name}.j.")]
        return _ordered({"header": meta["snapshot"], "group_ids": list(meta.get("group_ids", [])), "groups": groups,
                         "jobs": jobs})

    # ---- write
    def create(self, state: dict) -> None:
        """Write the first base (a fresh scheduler, or a migrated version-1 checkpoint)."""
        self.compact(state)
        for k in self._legacy:
            self.kv.delete(k)
        self._legacy = []

    def append(self, delta: dict) -> int:
        """Write one record (ONE put); its sequence number. Raises when the store fails (nothing
        was committed). ``delta``'s values must not be changed afterwards (the state mirror,
        :attr:`state`, holds them)."""
        seq = self.seq + 1
        value, size = self._wrap_sized("wal", {**delta, "seq": seq})
        self.kv.put(self._wkey(seq), value)
        with self._book:
            self.seq = seq
            self.wal_bytes += size
            self._wal_sizes[seq] = size
            if self.state is not None:
                apply(self.state, delta)
        return seq

    def wants_compaction(self) -> bool:
        """Whether a new base is due (see the module docstring)."""
        n = self.seq - self.base_seq
        return n >= self.compact_every and (self.wal_bytes >= self.compact_ratio * self.base_bytes
                                            or n >= MAX_WAL_RECORDS)

    def compact(self, state: dict) -> None:
        """Write ``state`` (the state after record ``seq``) as the base, then delete the records it covers."""
        self.write_base(self.seq, state)
        self.state = _copy_state(state)

    def base_view(self) -> Optional[tuple[int, dict]]:
        """``(seq, state)``: the state after record ``seq`` as restore would read it, for
        :meth:`write_base`; a shallow copy of the mirror (O(jobs) references, nothing encoded),
        cheap enough to take under the scheduler's lock. None before the first base."""
        with self._book:
            if self.state is None:
                return None
            return self.seq, _copy_state(self.state)

    def write_base(self, seq: int, state: dict) -> bool:
        """Write ``state`` (the state after record ``seq``, e.g. :meth:`base_view`) as the base
        (one put), then delete the records it covers. It may run on another thread than
        :meth:`append` (one base writer at a time): encoding and the store's writes need no lock
        of the scheduler. False (nothing written) when a newer base exists. Raises when the store fails."""
        if seq < self.base_seq:
            return False
        value, size = self._wrap_sized("base", {"seq": seq, "state": state})
        self.kv.put(self.base_key, value)
        with self._book:
            self.base_seq, self.base_bytes = seq, size
            for s in [s for s in self._wal_sizes if s <= seq]:
                self.wal_bytes -= self._wal_sizes.pop(s)
        for key in self._wal_keys():
            if int(key.rsplit(".", 1)[1]) <= seq:
                self.kv.delete(key)
        return True

    def keys(self) -> list[str]:
        """Every key this checkpoint holds (tests, leak checks)."""
        return self.kv.keys(f"{self.prefix}.")


def _copy_state(state: dict) -> dict:
    """A copy of a state's containers (the values, never changed in place, are shared)."""
    return {**state, "groups": dict(state["groups"]), "jobs": dict(state["jobs"])}


def _ordered(state: dict) -> dict:
    """``state`` with its groups in the order of ``group_ids`` (the earlier layout's explicit order,
    then dropped): the order of ``groups`` is the policy's group order."""
    ids = state.pop("group_ids", None)
    if ids is not None:
        state["groups"] = {g: state["groups"][g] for g in ids if state["groups"].get(g)}
    return state


def apply(state: dict, delta: dict) -> dict:
    """Apply one write-ahead record to ``state`` in place (idempotent: it only overwrites). The
    group order is the order of ``state["groups"]``: a new group goes last, a dissolved one is
    removed, a changed one keeps its place (the policy's order), so a record carries only the
    groups that changed, never the whole order (an earlier layout's ``group_ids`` is honoured)."""
    state["header"] = delta["header"]
    for gid, g in delta.get("groups", {}).items():
        if g is None:
            state["groups"].pop(gid, None)
        else:
            state["groups"][gid] = g
    if "group_ids" in delta:
        state["group_ids"] = delta["group_ids"]
        _ordered(state)
    for jid, rec in delta.get("jobs", {}).items():
        state["jobs"][jid] = rec
    for jid in delta.get("dropped", []):
        state["jobs"].pop(jid, None)
    if delta.get("queue") is not None:
        state["queue"] = delta["queue"]
    return state
