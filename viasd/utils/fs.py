"""The project's one way to write a file atomically and to lock a path between processes.

Every file the project publishes (run-store files, manifests, reports, fetched data) goes
through :func:`atomic_write_text` / :func:`atomic_write_json` (binary: :func:`atomic_write_bytes`): the bytes are written to a
temporary file in the destination's folder, flushed to disk, given the mode a plain
``open(path, "w")`` would give (0644 under the usual umask), and moved over the destination
with ``os.replace`` — a reader sees the old file or the new one, never half of one, and an
error leaves no temporary file behind. Logs that grow line by line use :func:`append_text`. :func:`file_lock` is an inter-process lock built on
the ``filelock`` library; a lock that stays taken longer than its timeout ends in one
:class:`~viasd.errors.ConfigError` line naming the lock file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from viasd.errors import ConfigError

__all__ = ["FILE_MODE", "append_text", "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "file_lock",
           "json_text", "jsonable"]

#: Mode of every written file before the umask, like ``open(..., "w")`` (0644 under umask 022).
FILE_MODE = 0o666


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def jsonable(x: Any) -> Any:
    """``x`` with NaN/inf floats replaced by ``None`` and dict keys made strings (strict JSON)."""
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via a same-folder temp file + ``os.replace``.

    The parent folder is created if needed. The file gets mode ``FILE_MODE & ~umask``. On any
    error (including Ctrl-C) the temp file is removed and ``path`` is left as it was.
    """
    _atomic_write(path, text, "w")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, as :func:`atomic_write_text` does (binary files: traces)."""
    _atomic_write(path, data, "wb")


def _atomic_write(path: str | Path, data: str | bytes, mode: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_text(obj: Any) -> str:
    """``obj`` as the text :func:`atomic_write_json` writes (indented, key-sorted strict JSON, a final newline)."""
    return json.dumps(jsonable(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted strict JSON (NaN/inf → ``null``) atomically to ``path``."""
    atomic_write_text(path, json_text(obj))


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` (UTF-8) to ``path`` and flush it (a log that grows line by line, like a run's
    ``examples.jsonl``; created with the same mode as the atomic writes)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()


@contextlib.contextmanager
def file_lock(path: str | Path, timeout: float | None = None) -> Iterator[None]:
    """Hold an exclusive inter-process lock on the lock file ``path`` for the block.

    ``timeout`` is in seconds (``None``: wait as long as it takes). When another process keeps
    the lock past ``timeout``, raises :class:`ConfigError` naming the lock file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=-1 if timeout is None else timeout)
    try:
        lock.acquire()
    except Timeout:
        raise ConfigError(
            f"{path} is locked by another process (waited {timeout:g} s); let that process finish "
            f"(it is building the same cached files) or stop it, then run again"
        ) from None
    try:
        yield
    finally:
        lock.release()
