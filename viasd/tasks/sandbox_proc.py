"""Process plumbing for the code sandbox (:mod:`viasd.tasks.sandbox`).

This module owns the parts of running a sandboxed program that do not depend on how it is
isolated: drawing its uid, reading its output and result pipes against a deadline and an
output cap, killing everything it started, naming how it ended, turning what the result
channel carried into a status and a reason (:func:`judge`), and deleting its directory
whatever the program left there.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import select
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

from viasd.tasks.sandbox_scripts import KEY_BYTES, READY, SETUP_MARKER

log = logging.getLogger(__name__)

__all__ = ["UID_BASE", "collect", "exit_words", "free_uid", "judge", "kill_group", "remove_tree", "take_uid"]

SETUP_S = 30.0  # the most a sample's sandbox may take to start, on top of its timeout
UID_BASE = 1_500_000  # sandbox uids have no passwd entry: nothing on disk is owned by them
_UID_SPAN = 1 << 24  # drawn at random; never two live samples of this process on one uid
_uids_live: set[int] = set()
_uid_lock = threading.Lock()


def take_uid() -> int:
    """A random sandbox uid no live sample of this process has (release with :func:`free_uid`)."""
    with _uid_lock:
        uid = UID_BASE + secrets.randbelow(_UID_SPAN)
        for _ in range(100):
            if uid not in _uids_live:
                break
            uid = UID_BASE + secrets.randbelow(_UID_SPAN)
        _uids_live.add(uid)
        return uid


def free_uid(uid: int | None) -> None:
    """Give back a uid from :func:`take_uid` (None: nothing to do)."""
    with _uid_lock:
        _uids_live.discard(uid)


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
    is ``"timeout"``, ``"output"`` (more than ``max_output`` bytes) or ``""``. The clock of
    ``timeout_s`` starts when the result pipe says ``READY`` (the sandbox's own start-up does
    not count against the program); before that, the sandbox has ``SETUP_S`` + ``timeout_s``.
    """
    deadline = time.monotonic() + SETUP_S + timeout_s
    tail, result, total, stop, started = bytearray(), bytearray(), 0, "", False
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
                if not started and result.startswith(READY):
                    started, deadline = True, time.monotonic() + timeout_s
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


_FAILED = re.compile(rb" failed (program|checks) ([A-Za-z0-9_.]{1,80})\n")


def judge(
    channel: bytes, key: bytes, how: str, stop: str = "", stop_reason: str = "", oom: str = ""
) -> tuple[str, str]:
    """``(status, reason)`` of a sample from its result ``channel`` (see :mod:`~viasd.tasks.sandbox_scripts`).

    ``key`` is the run's key, ``how`` the launcher's :func:`exit_words`, ``stop`` what
    :func:`collect` returned (``"timeout"``, ``"output"`` or ``""``) with ``stop_reason`` the
    words for it, ``oom`` a reason when the sample's cgroup saw an OOM kill. Nothing the program
    could write is taken as text: before ``READY`` only the harness's own stages write (a
    setup failure is status ``error``); after it only a record that starts with the key
    counts, and its reason is composed here from a stage and a validated class name.
    """
    if not channel.startswith(READY):
        if channel.startswith(SETUP_MARKER):
            line = channel[len(SETUP_MARKER) :].split(b"\n", 1)[0].decode("utf-8", "replace")
            return "error", f"sandbox setup failed: {line}"
        waited = "in time" if stop == "timeout" else f"({how})"
        return "error", f"the sandbox did not start {waited}"
    body = channel[len(READY) :]
    if stop:
        return ("timeout" if stop == "timeout" else "failed"), stop_reason
    keyed = len(key) == KEY_BYTES and body.startswith(key)
    if keyed and body[KEY_BYTES:] == b" passed\n":
        return "passed", "the checks ran to completion"
    m = _FAILED.fullmatch(body[KEY_BYTES:]) if keyed else None
    if m:
        return "failed", f"{m.group(2).decode()} in the {m.group(1).decode()}"
    if oom:
        return "failed", oom
    if body:
        return "failed", f"the result channel was tampered with ({how})"
    return "failed", f"exited before the checks completed ({how})"
