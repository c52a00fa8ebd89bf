"""Sandboxed execution of generated code, for pass@1 (HumanEval, MBPP).

This module owns running one untrusted Python program and reporting whether it exited
cleanly. Every program runs in its own ``python -I`` process, with:

* a wall-clock timeout; the whole process group is killed with SIGKILL when it expires;
* resource limits set by a bootstrap inside the sandboxed interpreter before the program
  starts (hard and soft): address space (``memory_mb``), processes/threads
  (``RLIMIT_NPROC``), file size, CPU seconds, open files, no core dumps;
* a fresh temporary working directory, deleted afterwards; a minimal environment; stdin
  at end of file; no inherited file descriptors except the output file.

Two modes, chosen once per process by :func:`sandbox_mode`:

``namespace`` (root with util-linux ``unshare``/``setpriv``/``mount``, as in our CI):
  the program runs in fresh network, PID and mount namespaces (``unshare``), as a fresh
  unprivileged uid/gid with no capabilities and ``no_new_privs`` (``setpriv``). The network
  namespace has only a downed loopback, so every connection fails. In the PID namespace a
  root-owned ``sh`` is PID 1 and the program its child: when the program ends or is killed,
  ``sh`` exits and the kernel kills every process left in the namespace; the program cannot
  see or signal host processes (``/proc`` is the namespace's own). ``RLIMIT_NPROC`` is
  enforced because the uid is not root and is unique to the run, so a fork bomb stops at
  ``max_procs`` processes and cannot starve concurrent runs. ``/tmp``, ``/var/tmp``,
  ``/run/lock`` and ``/dev/shm`` (the world-writable places) are replaced by small private
  tmpfs mounts, and the working directory is bind-mounted at ``/tmp/work``; everything else
  is owned by root, so writing outside the working directory fails (or lands in a tmpfs
  that vanishes with the run).

``basic`` (the tools are missing or fail, or forced): a new session, the same resource
  limits, a temporary working directory, and an audit hook that refuses socket creation.
  As root the program still runs as a fresh unprivileged uid (so ``RLIMIT_NPROC`` holds and
  root-owned files are read-only to it), but the world-writable directories are shared and
  there is no PID namespace (leftover processes are killed through the process group). As
  a normal user the filesystem is protected only by that user's permissions. Generated
  code is never run as root: if no interpreter works for the fresh uid, runs report
  ``"error"``.

Set ``VIASD_SANDBOX_MODE=basic`` to force the fallback and ``VIASD_SANDBOX_PYTHON`` to pick
the interpreter (default: the first of ``sys.executable``, ``/usr/bin/python3`` that the
sandbox uid can run as the same installation).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = [
    "SandboxResult",
    "drops_privileges",
    "run_program",
    "run_programs",
    "sandbox_mode",
    "sandbox_python",
]

# Exit status the setup stage uses when the sandbox itself could not be built.
_SETUP_FAILED = 125
_SETUP_MARKER = "viasd-sandbox-setup-failed"
_DETAIL_CHARS = 2000
_UID_BASE = 1_500_000  # fresh uids with no passwd entry: nothing on disk is owned by them
_uid_counter = itertools.count()
_uid_lock = threading.Lock()

# Runs inside the sandboxed interpreter before the program: lower the resource limits
# (allowed to any user, and impossible to raise back), optionally block sockets, then run
# the program as __main__. argv: limits as ints (a negative process limit is relative to the
# tasks the user already has), "1"/"0" for the socket guard, program path.
_BOOTSTRAP = r"""
import resource, sys
_as, _nproc, _fsize, _cpu, _nofile, _guard = (int(a) for a in sys.argv[1:7])
_path = sys.argv[7]
if _nproc < 0:  # basic mode: the limit counts every task of this user, so add what exists
    import os
    _mine = [p for p in os.listdir("/proc") if p.isdigit()]
    _n = 0
    for _p in _mine:
        try:
            if os.stat("/proc/" + _p).st_uid == os.getuid():
                _n += len(os.listdir("/proc/" + _p + "/task"))
        except OSError:
            pass
    _nproc = _n - _nproc
    del os, _mine, _n, _p
for _lim, _val in ((resource.RLIMIT_AS, _as), (resource.RLIMIT_NPROC, _nproc),
                   (resource.RLIMIT_FSIZE, _fsize), (resource.RLIMIT_CPU, _cpu),
                   (resource.RLIMIT_NOFILE, _nofile), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(_lim, (_val, _val))
if _guard:
    def _no_net(event, args):
        if event.startswith("socket.") and event != "socket.gethostname":
            raise PermissionError("network access is disabled in the sandbox")
    sys.addaudithook(_no_net)
sys.argv = [_path]
with open(_path, encoding="utf-8") as _f:
    _code = compile(_f.read(), _path, "exec")
_g = {"__name__": "__main__", "__file__": _path, "__builtins__": __builtins__}
del resource, _as, _nproc, _fsize, _cpu, _nofile, _guard, _lim, _val, _f
exec(_code, _g)
"""

# Root stage of namespace mode, run by sh inside the new namespaces: mask world-writable
# directories with private tmpfs mounts, bind the working directory at /tmp/work, then run
# the command as the fresh uid with no capabilities. $1 = uid, $2 = tmpfs size; the rest is
# the command. sh stays as PID 1 of the namespace (not exec'd away): PID 1 ignores signals
# it has no handler for, so a program that kills itself must not be PID 1. When sh exits,
# the kernel kills whatever the program left behind. A program killed by signal N makes sh
# exit with 128 + N.
_STAGE = r"""
fail() { echo "viasd-sandbox-setup-failed: $*" >&2; exit 125; }
uid=$1; size=$2; shift 2
mount -t tmpfs -o "size=$size,mode=1777,nosuid,nodev" tmpfs /tmp || fail "mount /tmp"
for d in /var/tmp /run/lock /dev/shm; do
  if [ -d "$d" ]; then mount -t tmpfs -o "size=1m,mode=1777,nosuid,nodev" tmpfs "$d" || fail "mount $d"; fi
done
mkdir /tmp/work || fail "mkdir /tmp/work"
mount --no-canonicalize --bind . /tmp/work || fail "bind working directory"
cd /tmp/work || fail "cd /tmp/work"
setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs \
  --inh-caps=-all --bounding-set=-all "$@"
exit $?
"""


@dataclass
class SandboxResult:
    """Outcome of one sandboxed program.

    ``status`` is ``"passed"`` (exit status 0), ``"failed"`` (non-zero exit, uncaught
    exception, killed by a limit), ``"timeout"`` (wall clock exceeded) or ``"error"`` (the
    sandbox itself could not run the program). ``detail`` is the tail of the program's
    combined stdout/stderr, or the reason. ``seconds`` is the wall time.
    """

    passed: bool
    status: str
    detail: str
    seconds: float


def _tools_present() -> bool:
    return all(shutil.which(t) for t in ("unshare", "setpriv", "mount", "sh"))


def _next_uid() -> int:
    with _uid_lock:
        n = next(_uid_counter)
    return _UID_BASE + (os.getpid() % 20_000) * 1_000 + n % 1_000


def _namespace_prefix(uid: int | None, tmpfs_mb: int) -> list[str]:
    return [
        "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
        "sh", "-c", _STAGE, "viasd-sandbox", str(uid), f"{tmpfs_mb}m",
    ]  # fmt: skip


def _probe_version(cmd: list[str], cwd: str | None = None, user: int | None = None) -> str | None:
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    try:
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=_minimal_env(cwd or "/tmp"),
            **kw,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


_VERSION_CODE = "import sys; print(sys.version, sys.prefix)"


@dataclass(frozen=True)
class _Plan:
    mode: str  # namespace | basic
    python: str
    drop_uid: bool  # run as a fresh unprivileged uid (we are root)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _first_usable(candidates: list[str], namespace: bool) -> str | None:
    """The first interpreter a fresh uid runs as the same installation root sees."""
    workdir = tempfile.mkdtemp(prefix="viasd-sbx-probe-")
    try:
        uid = _next_uid()
        os.chown(workdir, uid, uid)
        for py in candidates:
            as_root = _probe_version([py, "-I", "-c", _VERSION_CODE])
            if namespace:
                cmd = _namespace_prefix(uid, 16) + [py, "-I", "-c", _VERSION_CODE]
                sandboxed = _probe_version(cmd, cwd=workdir)
            else:
                sandboxed = _probe_version([py, "-I", "-c", _VERSION_CODE], cwd=workdir, user=uid)
            # Same version and prefix: not, e.g., a system libpython picked up because the
            # real one sits under a private /root.
            if as_root and sandboxed == as_root:
                return py
        return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@functools.lru_cache(maxsize=1)
def _select() -> _Plan:
    """How this process runs sandboxed programs; probes the tools once."""
    forced = os.environ.get("VIASD_SANDBOX_MODE", "").strip().lower()
    if forced not in ("", "basic", "namespace"):
        log.warning("VIASD_SANDBOX_MODE=%r ignored (use basic or namespace)", forced)
        forced = ""
    env_py = os.environ.get("VIASD_SANDBOX_PYTHON")
    candidates = [env_py] if env_py else [sys.executable, "/usr/bin/python3", shutil.which("python3") or ""]
    candidates = [c for i, c in enumerate(candidates) if c and c not in candidates[:i] and os.path.exists(c)]
    if not candidates:
        raise RuntimeError("no Python interpreter found for the sandbox; set VIASD_SANDBOX_PYTHON")

    if forced != "basic" and _is_root() and _tools_present():
        py = _first_usable(candidates, namespace=True)
        if py:
            return _Plan("namespace", py, True)
        msg = f"namespace sandbox unavailable (unshare/setpriv probe failed for {candidates})"
        if forced == "namespace":
            raise RuntimeError(msg)
        log.warning("%s; using basic mode", msg)
    elif forced == "namespace":
        raise RuntimeError("VIASD_SANDBOX_MODE=namespace needs root and util-linux unshare/setpriv/mount")
    if _is_root():
        py = _first_usable(candidates, namespace=False)
        if py:
            log.warning(
                "code sandbox in basic mode: fresh unprivileged uid and resource limits, but no "
                "network/PID/mount namespaces (sockets are refused by an audit hook)"
            )
            return _Plan("basic", py, True)
        raise RuntimeError(
            f"no interpreter among {candidates} is usable by an unprivileged uid; refusing to run "
            "generated code as root. Set VIASD_SANDBOX_PYTHON to a world-readable python"
        )
    log.warning(
        "code sandbox in basic mode (not root): resource limits and a socket audit hook, no "
        "namespaces; the filesystem is protected only by the current user's permissions"
    )
    return _Plan("basic", env_py or sys.executable, False)


def sandbox_mode() -> str:
    """``"namespace"`` or ``"basic"``: how :func:`run_program` isolates programs here."""
    return _select().mode


def sandbox_python() -> str:
    """The interpreter that sandboxed programs run with."""
    return _select().python


def drops_privileges() -> bool:
    """True when programs run as a fresh unprivileged uid (the harness runs as root)."""
    return _select().drop_uid


def _minimal_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _tail(f) -> str:
    """The last characters of the program's output, without ``unshare``'s own notices."""
    try:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 4 * _DETAIL_CHARS))
        text = f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
    lines = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("unshare: ")]
    return "".join(lines)[-_DETAIL_CHARS:]


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    """``proc.wait(timeout_s)`` without the polling latency, via a pidfd where available."""
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(proc.pid)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                ready, _, _ = select.select([fd], [], [], timeout_s)
            finally:
                os.close(fd)
            if not ready:
                raise subprocess.TimeoutExpired(proc.args, timeout_s)
            return proc.wait()
    return proc.wait(timeout=timeout_s)


def _kill_group(proc: subprocess.Popen, namespace: bool) -> None:
    """SIGKILL everything the program started, then reap the launched process.

    The children of the launched process are killed first: in namespace mode that is the
    PID-namespace init, whose death takes the whole namespace down while ``unshare`` is
    still alive to reap it (killing ``unshare`` first would leave the init a zombie of the
    host's init). Then the whole process group goes, for anything left (basic mode).
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


def run_program(
    code: str,
    timeout_s: float = 10,
    memory_mb: int = 1024,
    *,
    max_procs: int = 16,
    max_file_mb: int = 16,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandbox; passed iff it exits with status 0.

    ``timeout_s`` bounds the wall time (the process group is killed on expiry),
    ``memory_mb`` the address space of each process, ``max_procs`` the processes and
    threads of the program, ``max_file_mb`` the size of any file it writes (and of its
    output). Never raises for anything the program does: a crash, hang, fork bomb or
    memory bomb comes back as a failed :class:`SandboxResult`.
    """
    t0 = time.monotonic()
    try:
        plan = _select()
    except RuntimeError as e:
        return SandboxResult(False, "error", str(e), time.monotonic() - t0)
    workdir = tempfile.mkdtemp(prefix="viasd-sbx-")
    out = tempfile.TemporaryFile()
    proc: subprocess.Popen | None = None
    try:
        prog = Path(workdir) / "program.py"
        prog.write_text(code, encoding="utf-8")
        nproc = max_procs if plan.drop_uid else -max_procs  # relative to the user's tasks (see _BOOTSTRAP)
        limits = [memory_mb * 1024 * 1024, nproc, max_file_mb * 1024 * 1024, math.ceil(timeout_s) + 1, 256]
        guard = "0" if plan.mode == "namespace" else "1"
        boot = [plan.python, "-I", "-B", "-c", _BOOTSTRAP, *map(str, limits), guard, "program.py"]
        popen_kw: dict = {}
        uid = _next_uid() if plan.drop_uid else None
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
            os.chown(prog, uid, uid)
        if plan.mode == "namespace":
            cmd = _namespace_prefix(uid, max(16, max_file_mb * 2)) + boot
            env = _minimal_env("/tmp/work")
        else:
            cmd = boot
            env = _minimal_env(workdir)
            if uid is not None:
                popen_kw = {"user": uid, "group": uid, "extra_groups": []}
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,
                **popen_kw,
            )
        except OSError as e:
            return SandboxResult(False, "error", f"could not start the sandbox: {e}", time.monotonic() - t0)
        try:
            rc = _wait(proc, timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc, plan.mode == "namespace")
            return SandboxResult(
                False, "timeout", f"timed out after {timeout_s:g} s\n{_tail(out)}", time.monotonic() - t0
            )
        # The program's children die with it (PID namespace); in basic mode kill stragglers.
        _kill_group(proc, plan.mode == "namespace")
        detail = _tail(out)
        seconds = time.monotonic() - t0
        if rc == 0:
            return SandboxResult(True, "passed", detail, seconds)
        if rc == _SETUP_FAILED and _SETUP_MARKER in detail:
            return SandboxResult(False, "error", detail, seconds)
        sig = -rc if rc < 0 else (rc - 128 if plan.mode == "namespace" and 128 < rc < 128 + 65 else 0)
        if sig:
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            detail = f"killed by {name}\n{detail}"
        else:
            detail = f"exit status {rc}\n{detail}"
        return SandboxResult(False, "failed", detail, seconds)
    except Exception as e:  # the harness must survive whatever a sample does
        if proc is not None:
            _kill_group(proc, plan.mode == "namespace")
        return SandboxResult(False, "error", f"{type(e).__name__}: {e}", time.monotonic() - t0)
    finally:
        out.close()
        shutil.rmtree(workdir, ignore_errors=True)


def run_programs(
    codes: Sequence[str],
    timeout_s: float = 10,
    memory_mb: int = 1024,
    workers: int | None = None,
) -> list[SandboxResult]:
    """Run several programs with :func:`run_program`, ``workers`` at a time (default: CPUs, ≤ 8).

    Results are in input order; one sample's crash or hang never affects the others.
    """
    if not codes:
        return []
    n = workers or min(8, os.cpu_count() or 1)
    sandbox_mode()  # probe once before the threads start
    if n <= 1 or len(codes) == 1:
        return [run_program(c, timeout_s, memory_mb) for c in codes]
    with ThreadPoolExecutor(max_workers=n) as ex:
        return list(ex.map(lambda c: run_program(c, timeout_s, memory_mb), codes))
