"""Private, per-node Ray temp directories for the local clusters RollMux starts on one host.

Ray keeps a node's session files under ``<temp dir>/session_<date>_<pid>/``: logs, Unix sockets and
``runtime_resources/``, where the node's runtime-env agent unpacks a job's ``working_dir`` package
(``working_dir_files/_ray_pkg_<hash>``) and deletes it once no worker of *that node* uses it any
more. Nodes started on one host with one temp dir share one session directory, so the agents of
sibling nodes unpack the same package into the same directory and one of them deletes it while
another node's workers still import from it (``import torch`` failing with a missing
``libtorch_cpu.so`` or a vanished working directory). Ray also makes the directories it creates
mode 0777.

Here every node gets its own temp dir ``<root>/<node key>`` (``--temp-dir`` is honoured per node
since Ray 2.x), created 0700 under one root created mode 0700 and owned by this user. Ray widens
the directories it uses to 0777 again (at node start and whenever a worker or runtime env is set
up), so the root is what keeps everyone else out: whatever lies below it, nobody else can reach. Unix socket paths are at most 107 bytes and Ray adds about
64 characters to the temp dir (``/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store``),
so roots are kept to :data:`MAX_ROOT_CHARS` characters.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

#: Longest root accepted: root + ``/`` + node key (at most :data:`MAX_KEY_CHARS`) + the ~64
#: characters Ray appends must stay within the 107-byte Unix socket path limit.
MAX_ROOT_CHARS = 32
MAX_KEY_CHARS = 10
HEAD_KEY = "head"


class UnsafeDirError(RuntimeError):
    """A directory meant to be private exists but is not: another owner, a symlink, or not a directory."""


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it a directory only this user can enter (0700).

    An existing ``path`` is accepted only when it is a real directory (not a symlink) owned by
    this user; its mode is then set to 0700. Returns the absolute path.
    Raises:
        UnsafeDirError: ``path`` is a symlink, not a directory, or owned by another user (it could
            have been planted to collect or inject code).
    """
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirError(f"{path} exists and is not a plain directory; refusing to put Ray's files there")
    if st.st_uid != os.getuid():
        raise UnsafeDirError(f"{path} is owned by uid {st.st_uid}, not by this user ({os.getuid()}); "
                             "refusing to put Ray's files there")
    os.chmod(path, 0o700)
    return path


def short_root(preferred: Path, fallback_parent: Path = Path("/tmp"), prefix: str = "rollmux-ray-") -> Path:
    """``preferred`` when it is short enough for Ray's socket paths, else
    ``<fallback_parent>/<prefix><12 hex of sha1(preferred)>`` (the same for the same ``preferred``)."""
    preferred = Path(preferred).absolute()
    if len(str(preferred)) <= MAX_ROOT_CHARS:
        return preferred
    return fallback_parent / f"{prefix}{hashlib.sha1(str(preferred).encode()).hexdigest()[:12]}"


def node_temp_dir(root: Path, key: str) -> Path:
    """The temp dir of one node (``key``: :data:`HEAD_KEY` or a pool node id) under ``root``; created
    0700. Raises ValueError for a key too long for Ray's socket paths, UnsafeDirError as
    :func:`private_dir`."""
    if not key or len(key) > MAX_KEY_CHARS or "/" in key:
        raise ValueError(f"node key {key!r}: 1-{MAX_KEY_CHARS} characters, no '/'")
    return private_dir(Path(root) / key)
