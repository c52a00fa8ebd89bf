"""The code sandbox's isolation levels and the probes that decide which one this process gets.

This module owns the three levels of :mod:`viasd.tasks.sandbox` (their names, as a scored
run's meta records them), the :class:`Plan` a level runs under, the once-per-process probe of
unprivileged user namespaces (:func:`userns_unavailable`) and the choice of the interpreter a
sample runs with (:func:`first_usable`). The chain of a level (tools, seccomp, the self-test)
is checked by :func:`viasd.tasks.sandbox._isolation`, which uses these.

* ``root namespaces`` — the harness is root: fresh network, PID, mount, IPC and UTS
  namespaces, the minimal root, a fresh unprivileged uid per sample;
* ``rootless namespaces`` — not root, unprivileged user namespaces available: the same
  namespaces inside a new user namespace that maps the caller to root, the same minimal root,
  the sample with no capabilities (it stays the caller's uid on the host);
* ``unsafe`` — waived (``VIASD_UNSAFE_EXEC=1`` or ``unsafe_exec: true``): resource limits
  (and the filter) only.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from viasd.tasks.sandbox.proc import free_uid, remove_tree, take_uid
from viasd.tasks.sandbox.scripts import minimal_env, namespace_prefix

__all__ = [
    "LEVELS", "ROOT", "ROOTLESS", "UNSAFE", "Plan", "candidates", "first_usable", "probe_version",
    "userns_unavailable",
]  # fmt: skip

ROOT, ROOTLESS, UNSAFE = "root namespaces", "rootless namespaces", "unsafe"
LEVELS = {"namespace": ROOT, "rootless": ROOTLESS, "unsafe": UNSAFE}  # plan mode → recorded level


@dataclass(frozen=True)
class Plan:
    """How samples run: ``mode`` (``namespace`` | ``rootless`` | ``unsafe``), the interpreter,
    and whether each sample gets a fresh unprivileged uid (the harness is root)."""

    mode: str
    python: str
    drop_uid: bool

    @property
    def level(self) -> str:
        """The isolation level's name (:data:`LEVELS`)."""
        return LEVELS[self.mode]

    @property
    def namespaces(self) -> bool:
        """True when samples run in their own namespaces and minimal root (either namespace level)."""
        return self.mode != "unsafe"


_SYSCTLS = (
    ("/proc/sys/user/max_user_namespaces", "user.max_user_namespaces = 0"),
    ("/proc/sys/kernel/unprivileged_userns_clone", "kernel.unprivileged_userns_clone = 0"),
)
_APPARMOR = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
USERNS_PROBE = ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork",
                "true"]  # fmt: skip


@functools.lru_cache(maxsize=1)
def userns_unavailable() -> str:
    """Why this (non-root) process cannot create unprivileged user namespaces ("" when it can).

    Reads the sysctls that switch them off, then creates one for real with util-linux
    ``unshare`` (with the mount, PID, network, IPC and UTS namespaces a sample gets); probed
    once per process.
    """
    for path, words in _SYSCTLS:
        try:
            if Path(path).read_text().strip() == "0":
                return f"unprivileged user namespaces are disabled ({words})"
        except OSError:
            pass
    if not shutil.which("unshare"):
        return "util-linux unshare is missing (Debian: apt-get install util-linux)"
    try:
        out = subprocess.run(USERNS_PROBE, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return f"creating an unprivileged user namespace failed ({type(e).__name__}: {e})"
    if out.returncode == 0:
        return ""
    last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
    try:
        apparmor = Path(_APPARMOR).read_text().strip() == "1"
    except OSError:
        apparmor = False
    hint = " (AppArmor restricts them: kernel.apparmor_restrict_unprivileged_userns = 1)" if apparmor else ""
    return f"creating an unprivileged user namespace failed: {last}{hint}"


_VERSION_CODE = "import sys; print(sys.version, sys.prefix)"


def probe_version(cmd: list[str], cwd: str, user: int | None = None) -> str | None:
    """What ``cmd`` (an interpreter printing :data:`_VERSION_CODE`) printed, or None when it failed."""
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL,
                             cwd=cwd, env=minimal_env(cwd), **kw)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def first_usable(cands: list[str], mode: str) -> str | None:
    """The first interpreter that runs as the same installation inside a sample of ``mode``
    (``namespace``: a fresh uid in the namespaces; ``rootless``: the caller in a user
    namespace; ``unsafe``: a fresh uid, the harness being root) as outside it."""
    workdir = tempfile.mkdtemp(prefix="viasd-sbx-probe-")
    uid = take_uid() if mode != "rootless" else None
    try:
        for name in ("program.py", "checks.py"):
            Path(workdir, name).write_text("")
        if mode == "unsafe":
            os.chown(workdir, uid, uid)
        for py in cands:
            as_caller = probe_version([py, "-I", "-c", _VERSION_CODE], workdir)
            if mode == "unsafe":
                sandboxed = probe_version([py, "-I", "-c", _VERSION_CODE], workdir, user=uid)
            else:
                cmd = namespace_prefix(2, uid, 16, 1 << 20, [], py) + [py, "-I", "-c", _VERSION_CODE]
                sandboxed = probe_version(cmd, workdir)
            if as_caller and sandboxed == as_caller:
                return py
        return None
    finally:
        free_uid(uid)
        remove_tree(workdir)


def candidates() -> list[str]:
    """The interpreters to try: ``VIASD_SANDBOX_PYTHON`` alone when set, else ``sys.executable``,
    ``/usr/bin/python3`` and the first ``python3`` on ``PATH`` (those that exist, once each)."""
    env_py = os.environ.get("VIASD_SANDBOX_PYTHON")
    cands = [env_py] if env_py else [sys.executable, "/usr/bin/python3", shutil.which("python3") or ""]
    return [c for i, c in enumerate(cands) if c and c not in cands[:i] and os.path.exists(c)]
