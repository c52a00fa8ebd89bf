"""Local launchers for exp grids: a bounded number of cells at once, and no cell outliving its grid.

Hydra's submitit plugin (``hydra-submitit-launcher``, a dev dependency) starts every cell of a
multirun at once under ``hydra/launcher=submitit_local`` and leaves them running when the grid's
process dies. This module adds three things; :class:`viasd.harness.grid.GridCallback` wires them:

* ``hydra/launcher=viasd_local`` (the Hydra plugin ``hydra_plugins/viasd_launcher``; Hydra loads
  launchers only from that namespace): the submitit local launcher running at most
  ``max_parallel`` cells (default 2), the next one starting when one ends; a job that dies is a
  failed cell in the grid's summary, not the end of the sweep.
* The grid's liveness lock (:class:`GridLock`): the grid process holds an exclusive lock on a
  file for its whole life and names it in ``VIASD_GRID_LOCK``. A cell running in another process
  of the same host (:func:`in_cell_process`) watches it (:func:`watch_grid`): once the lock is
  free the grid process is gone, however it died, and the cell stops as on Ctrl-C (its partial
  run stays resumable by the next identical command).
* Decode slots (:func:`take_slot`): such a cell waits for one of ``VIASD_GRID_SLOTS`` slot locks
  before it loads anything, so even a launcher that starts every cell at once decodes at most
  that many at a time.

SLURM jobs run on other hosts and are left alone: a cluster job outlives the submitting shell by
design, and the next identical command skips the runs it finished.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["ENV_LOCK", "ENV_SLOTS", "GridLock", "in_cell_process", "watch_grid", "take_slot"]

ENV_LOCK, ENV_HOST, ENV_PID, ENV_SLOTS = "VIASD_GRID_LOCK", "VIASD_GRID_HOST", "VIASD_GRID_PID", "VIASD_GRID_SLOTS"
_HELD: list[FileLock] = []  # a cell's slot lock, held until its process ends


class GridLock:
    """The grid process's liveness lock and the cells' decode slots (see the module docstring);
    :meth:`release` at the end of the grid. ``slots``: cells decoding at once in other processes."""

    def __init__(self, slots: int):
        self.path = Path(tempfile.gettempdir()) / f"viasd-grid-{os.getpid()}.lock"
        self.slots = max(1, int(slots))
        self.lock = FileLock(self.path)
        self.lock.acquire(timeout=0)
        os.environ.update({ENV_LOCK: str(self.path), ENV_HOST: socket.gethostname(), ENV_PID: str(os.getpid()),
                           ENV_SLOTS: str(self.slots)})

    def release(self) -> None:
        self.lock.release()
        for p in [self.path, *(_slot_path(self.path, i) for i in range(self.slots))]:
            p.unlink(missing_ok=True)
        for k in (ENV_LOCK, ENV_HOST, ENV_PID, ENV_SLOTS):
            os.environ.pop(k, None)


def _slot_path(lock: Path, i: int) -> Path:
    return lock.with_name(f"{lock.stem}.slot{i}.lock")


def in_cell_process() -> bool:
    """True in a cell that a launcher runs in a process of its own on the grid's host."""
    pid = os.environ.get(ENV_PID)
    return bool(pid) and pid != str(os.getpid()) and os.environ.get(ENV_HOST) == socket.gethostname()


def _grid_alive(path: str) -> bool:
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def watch_grid(poll_s: float = 1.0, grace_s: float = 30.0) -> None:
    """Stop this cell (SIGINT, then exit after ``grace_s``) once the grid process is gone. Call it
    from the main thread: a process started in the background ignores SIGINT until this."""
    path = os.environ[ENV_LOCK]
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def loop() -> None:
        while _grid_alive(path):
            time.sleep(poll_s)
        print("[viasd] the grid process is gone: stopping this cell (its partial run is resumed by the next "
              "identical command)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(grace_s)
        os._exit(130)

    threading.Thread(target=loop, name="viasd-grid-watch", daemon=True).start()


def take_slot(poll_s: float = 1.0) -> None:
    """Wait for one of the grid's decode slots and hold it until this process ends."""
    lock, slots = Path(os.environ[ENV_LOCK]), int(os.environ.get(ENV_SLOTS, "1"))
    said = False
    while True:
        for i in range(slots):
            slot = FileLock(_slot_path(lock, i))
            try:
                slot.acquire(timeout=0)
            except Timeout:
                continue
            _HELD.append(slot)
            return
        if not said:
            print(f"[viasd] waiting for a decode slot ({slots} cells decode at a time)", file=sys.stderr, flush=True)
            said = True
        time.sleep(poll_s)
