"""Process plumbing for the code sandbox (:mod:`viasd.tasks.sandbox`).

This module owns the parts of running a sandboxed program that do not depend on how it is
isolated: drawing its uid, killing everything it started, naming how it ended, turning what
the result channel carried into a status and a reason when the checks reached no verdict
(:func:`judge`), and deleting its directory
whatever the program left there.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import stat
import subprocess
import threading
from pathlib import Path

from viasd.tasks.sandbox.scripts import READY, SETUP_MARKER

log = logging.getLogger(__name__)

__all__ = ["SETUP_S", "UID_BASE", "exit_words", "free_uid", "judge", "kill_group", "remove_tree", "take_uid"]

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


def exit_words(rc: int, namespace: bool) -> str:
    """``"exit status N"`` or ``"killed by SIGX"`` (a namespace's sh reports signal N as 128 + N)."""
    sig = -rc if rc < 0 else (rc - 128 if namespace and 128 < rc < 128 + 65 else 0)
    if not sig:
        return f"exit status {rc}"
    try:
        return f"killed by {signal.Signals(sig).name}"
    except ValueError:
        return f"killed by signal {sig}"


_FAILED = re.compile(rb"failed program ([A-Za-z0-9_.]{1,80})\n")


def judge(channel: bytes, stop: str, how: str, stop_reason: str = "", oom: str = "") -> tuple[str, str]:
    """``(status, reason)`` of a sample whose checks did not run to a verdict.

    ``channel`` is what the result pipe carried before any call (see
    :mod:`~viasd.tasks.sandbox.scripts`), ``stop`` why the harness stopped listening
    (``"timeout"``, ``"output"``, ``"exited"``, ``"tampered"``) with ``stop_reason`` the words
    for it, ``how`` the launcher's :func:`exit_words`, ``oom`` a reason when the sample's cgroup
    saw an OOM kill. Before ``READY`` only the harness's own stages write (a setup failure is
    status ``error``); after it, a reason is composed here from a validated class name, never
    taken from the program's text.
    """
    if not channel.startswith(READY):
        if channel.startswith(SETUP_MARKER):
            line = channel[len(SETUP_MARKER) :].split(b"\n", 1)[0].decode("utf-8", "replace")
            return "error", f"sandbox setup failed: {line}"
        waited = "in time" if stop == "timeout" else f"({how})"
        return "error", f"the sandbox did not start {waited}"
    body = channel[len(READY) :]
    if stop in ("timeout", "output"):
        return ("timeout" if stop == "timeout" else "failed"), stop_reason
    m = _FAILED.fullmatch(body)
    if m:
        return "failed", f"{m.group(1).decode()} in the program"
    if oom:
        return "failed", oom
    if stop == "tampered":
        return "failed", f"the result channel was tampered with ({how})"
    return "failed", f"exited before the checks completed ({how})"
