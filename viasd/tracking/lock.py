"""The per-run lock: one process writes a run folder.

``<run folder>/.lock`` is an exclusive inter-process lock (the ``filelock`` library: ``flock`` on
POSIX, released by the kernel when its holder dies, so a ``kill -9`` never leaves a run locked).
While it is held, ``<run folder>/.holder.json`` names the holder — pid, host and the time it took
the lock — so another process can say in one line who is writing the run
(:meth:`RunLock.describe`). Both names start with a dot: they are not part of the run's record
(a published or copied run leaves them behind) and the store checker ignores them.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from viasd.utils.fs import atomic_write_json

LOCK_NAME, HOLDER_NAME = ".lock", ".holder.json"


def is_lock_file(name: str) -> bool:
    """Whether a file of a run folder belongs to its lock, not its record: the lock, the holder note, or the
    temporary file of a holder note whose atomic write was killed (``viasd.utils.fs.atomic_write_text``)."""
    return name in (LOCK_NAME, HOLDER_NAME) or (name.startswith(f".{HOLDER_NAME}.") and name.endswith(".tmp"))


class RunLock:
    """The lock of one run folder (the folder is created when the lock is first taken)."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self._lock: FileLock | None = None

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._lock is not None and self._lock.is_locked

    def _file_lock(self) -> FileLock:
        if self._lock is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = FileLock(str(self.dir / LOCK_NAME))
        return self._lock

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False (at once) when another process holds it."""
        if self.held:
            return True
        try:
            self._file_lock().acquire(timeout=0)
        except Timeout:
            return False
        if not (self.dir / LOCK_NAME).is_file():  # the folder was removed while this process opened its lock
            self._lock.release()
            self._lock = None
            return False
        try:  # who holds it is for messages only: a full disk must not cost the lock
            atomic_write_json(self.dir / HOLDER_NAME, {"pid": os.getpid(), "host": platform.node(),
                                                       "since": time.strftime("%Y-%m-%dT%H:%M:%S")})
        except OSError:
            pass
        return True

    def acquire(self, poll_s: float = 0.2) -> None:
        """Take the lock, waiting as long as another process holds it."""
        while not self.try_acquire():
            time.sleep(poll_s)

    def release(self) -> None:
        """Give the lock up (the holder file first, so it never names a process that let go)."""
        if self.held:
            (self.dir / HOLDER_NAME).unlink(missing_ok=True)
            self._lock.release()

    def holder(self) -> dict[str, Any] | None:
        """``{"pid", "host", "since"}`` of the process holding the lock as it wrote them (None: unknown)."""
        try:
            return json.loads((self.dir / HOLDER_NAME).read_text())
        except (OSError, ValueError):
            return None

    def describe(self) -> str:
        """``pid 123 on host h since 2026-01-01T10:00:00`` for the current holder."""
        h = self.holder()
        return f"pid {h.get('pid')} on {h.get('host')} since {h.get('since')}" if h else "another process"

    def is_locked(self) -> bool:
        """True when another process holds the lock (probes without creating anything)."""
        if self.held:
            return False
        if not (self.dir / LOCK_NAME).is_file():
            return False
        if self.try_acquire():
            self.release()
            return False
        return True
