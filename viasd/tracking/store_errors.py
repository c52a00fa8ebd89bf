"""What a failed write to the run store becomes: one line naming the store and the fix — a full disk
(:class:`StoreFull`) or a read-only store (:class:`StoreReadOnly`), never a raw ``OSError``
traceback. :func:`viasd.tracking.store.store_write` and the lock claim raise them."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from viasd.errors import ConfigError

FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


class StoreFull(ConfigError):
    """A write to the run store failed for lack of space; the message names the store and the fix."""


def full_disk_error(path: Path, root: Path) -> StoreFull:
    try:
        n = shutil.disk_usage(root if root.exists() else root.parent).free
        free = f"{n / 2**20:.0f} MiB free" if n >= 2**20 else f"{n // 1024} KiB free"
    except OSError:
        free = "free space unknown"
    return StoreFull(f"no space left on device writing {path} (run store {root}, {free}); free space there or "
                     f"point VIASD_RUNS_DIR (tracking.store_dir) at another disk, then run the same command again "
                     f"(finished runs and finished examples are kept)")


class StoreReadOnly(StoreFull):
    """A write to the run store was refused (read-only file system, no write permission); handled as
    a full disk (a grid stops after this one line, a folder without examples is removed)."""


def read_only_error(path: Path, root: Path, e: OSError) -> StoreReadOnly:
    return StoreReadOnly(f"cannot write {path} ({e.strerror or 'permission denied'}: the run store {root} is "
                         f"read-only for this user); make it writable or point VIASD_RUNS_DIR (tracking.store_dir) "
                         f"at a writable folder, then run the same command again")


def store_error(e: OSError, path: Path, root: Path) -> StoreFull | None:
    """The one-line error for an ``OSError`` writing ``path`` of the store ``root`` (None: not a full or
    read-only store: the caller re-raises)."""
    if e.errno in FULL_DISK:
        return full_disk_error(path, root)
    if e.errno in READ_ONLY:
        return read_only_error(path, root, e)
    return None
