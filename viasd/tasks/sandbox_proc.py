"""Process plumbing for the code sandbox (:mod:`viasd.tasks.sandbox`).

This module owns the parts of running a sandboxed program that do not depend on how it is
isolated: reading its output and result pipes against a deadline and an output cap,
killing everything it started, naming how it ended, and deleting its directory whatever
the program left there.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import stat
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["collect", "exit_words", "kill_group", "remove_tree"]


def remove_tree(path: str | os.PathLike) -> bool:
    """Delete ``path`` however deep or oddly permissioned its tree is; never raises.

    Iterative (no recursion limit); makes each directory accessible before emptying it.
    Returns False (with a warning) when something could not be removed.
    """
    root = os.fspath(path)
    stack, failed = [root], set()
    while stack:
        d = stack[-1]
        subdirs = []
        try:
            os.chmod(d, stat.S_IRWXU, follow_symlinks=False)
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        if e.path not in failed:
                            subdirs.append(e.path)
                    else:
                        try:
                            os.unlink(e.path)
                        except FileNotFoundError:
                            pass
        except FileNotFoundError:
            stack.pop()
            continue
        except OSError:
            pass
        if subdirs:
            stack.extend(subdirs)
            continue
        stack.pop()
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            failed.add(d)
    if failed or os.path.lexists(root):
        log.warning("could not fully remove sandbox directory %s", root)
        return False
    return True


def kill_group(proc: subprocess.Popen, namespace: bool) -> None:
    """SIGKILL everything the program started, then reap the launched process.

    In namespace mode the children of ``unshare`` (the namespace's init) die first, so that
    ``unshare`` is still there to reap it; then the whole process group (unsafe mode).
    """
    kids: list[str] = []
    if namespace:
        try:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            pass
    for k in kids:
        try:
            os.kill(int(k), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
    if kids:
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def collect(
    proc: subprocess.Popen, out_r: int, res_r: int, timeout_s: float, max_output: int, keep_chars: int = 2000
) -> tuple[str, bytes, str]:
    """Read the output pipe (keeping its tail) and the result pipe until both close.

    Returns ``(last keep_chars of output, result bytes (at most 4 KiB), stop)`` where ``stop``
    is ``"timeout"`` (``timeout_s`` passed), ``"output"`` (more than ``max_output`` bytes) or ``""``.
    """
    deadline = time.monotonic() + timeout_s
    tail, result, total, stop = bytearray(), bytearray(), 0, ""
    open_fds = {out_r, res_r}
    exited_at: float | None = None
    while True:
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and (not open_fds or now > exited_at + 1.0):
            break  # done, or leftovers (unsafe mode) hold the pipes: they get killed
        if now >= deadline:
            stop = "timeout"
            break
        wait = min(deadline, exited_at + 1.0 if exited_at else deadline) - now
        if not open_fds:  # output done: wait for the launcher itself
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
            continue
        ready, _, _ = select.select(list(open_fds), [], [], min(wait, 0.05))
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                open_fds.discard(fd)
            elif fd == out_r:
                total += len(data)
                tail += data
                del tail[: -4 * keep_chars]
            else:
                result += data[: max(0, 4096 - len(result))]
        if total > max_output:
            stop = "output"
            break
    text = tail.decode("utf-8", "replace")
    lines = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("unshare: ")]
    return "".join(lines)[-keep_chars:], bytes(result), stop


def exit_words(rc: int, namespace: bool) -> str:
    """``"exit status N"`` or ``"killed by SIGX"`` (a namespace's sh reports signal N as 128 + N)."""
    sig = -rc if rc < 0 else (rc - 128 if namespace and 128 < rc < 128 + 65 else 0)
    if not sig:
        return f"exit status {rc}"
    try:
        return f"killed by {signal.Signals(sig).name}"
    except ValueError:
        return f"killed by signal {sig}"
