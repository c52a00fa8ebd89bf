"""Sandboxed execution of generated code, for pass@1 (HumanEval, MBPP).

This module owns running one untrusted program and its checks and deciding whether the
checks ran to completion. A harness-owned driver runs inside a fresh ``python -I``
process: it executes the program, then the checks, in one namespace (whose ``__name__`` is
not ``"__main__"``, as in OpenAI's human-eval, so ``if __name__ == "__main__":`` blocks do
not run) and, only when both returned, writes a per-run random key to a result pipe. A
sample passes iff the harness reads exactly that key back. Exit statuses are never
trusted: ``os._exit(0)``, ``sys.exit``, ``SystemExit``, ``exit()``/``quit()``, ``atexit``
and ``sys.excepthook`` tricks, signals and timeouts all end before the key is written, so
they fail, each with its reason. (The key lives in the driver's frame: a program written
to inspect the driver's frames could forge it, as it could under human-eval.)

Isolation (``namespace`` mode, the only one used unless explicitly waived): root with
util-linux ``unshare``/``setpriv``/``mount``. Each sample gets fresh network (downed
loopback only), PID, mount, IPC and UTS namespaces; SysV shared memory, semaphores and
message queues and POSIX queues die with the IPC namespace. A root ``sh`` is PID 1 of the
namespace and the driver its child, run as a fresh unprivileged uid with no capabilities
and ``no_new_privs``; when it ends, the kernel kills everything left. ``/tmp`` (holding the
working directory ``/tmp/work``), ``/var/tmp``, ``/run/lock`` and ``/dev/shm`` are private
size-limited tmpfs mounts, so nothing the program writes reaches the host disk and all of
it vanishes with the namespace. The whole sample (every process, its files, memfds and
shared memory) is bounded by a per-sample cgroup (:mod:`viasd.tasks.cgroups`: memory and
number of tasks). Without a usable cgroup, the program may not fork or start threads
(``RLIMIT_NPROC`` 1 for its uid) and open files × file size is kept within the memory
budget, with IPC sysctls lowered in its namespace. Per process there are also limits on
address space, file size, CPU seconds and open files. Output goes through a pipe; past
``max_output_mb`` the sample is killed. (util-linux rather than bubblewrap: run by root,
bwrap can change the uid only inside a user namespace that maps it back to root on the
host, which leaves root-owned files writable; util-linux is in every Debian base image.)

Fail closed: when namespace mode is unavailable (not root, no ``CAP_SYS_ADMIN``, tools
missing), :func:`run_programs` raises a :class:`~viasd.errors.ConfigError` naming the
opt-in, ``VIASD_UNSAFE_EXEC=1`` or the task's ``unsafe_exec: true``. With the opt-in,
programs run with the resource limits only (as a fresh uid when root, else as the
harness's own user, which can read its files and environment), with a warning per call.
``VIASD_SANDBOX_PYTHON`` picks the interpreter (default: the first of ``sys.executable``,
``/usr/bin/python3`` that the sandbox uid runs as the same installation). The driver and
the namespace stage themselves are in :mod:`viasd.tasks.sandbox_scripts`, process handling
in :mod:`viasd.tasks.sandbox_proc`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from viasd.errors import ConfigError
from viasd.tasks.cgroups import SampleCgroup
from viasd.tasks.sandbox_proc import collect, exit_words, kill_group, remove_tree
from viasd.tasks.sandbox_scripts import DRIVER, SETUP_FAILED, SETUP_MARKER, minimal_env, namespace_prefix

log = logging.getLogger(__name__)

__all__ = [
    "UNSAFE_ENV",
    "SandboxResult",
    "drops_privileges",
    "remove_tree",
    "require_isolation",
    "run_program",
    "run_programs",
    "sandbox_mode",
    "sandbox_python",
]

UNSAFE_ENV = "VIASD_UNSAFE_EXEC"
_DETAIL_CHARS = 2000
_UID_BASE = 1_500_000  # fresh uids with no passwd entry: nothing on disk is owned by them
_uid_counter = itertools.count()
_uid_lock = threading.Lock()

@dataclass
class SandboxResult:
    """Outcome of one sandboxed program and its checks.

    ``status``: ``"passed"`` (the checks ran to completion), ``"failed"`` (an exception,
    an early exit, a signal, a limit), ``"timeout"`` or ``"error"`` (the sandbox could not
    run it). ``reason`` is one line saying why; ``detail`` the tail of the combined
    stdout/stderr; ``seconds`` the wall time; ``peak_memory_mb`` the sample's peak memory
    charge when a cgroup bounded it (else None).
    """

    passed: bool
    status: str
    reason: str
    detail: str
    seconds: float
    peak_memory_mb: float | None = None


@dataclass(frozen=True)
class _Plan:
    mode: str  # namespace | unsafe
    python: str
    drop_uid: bool  # run as a fresh unprivileged uid (we are root)


def _next_uid() -> int:
    with _uid_lock:
        n = next(_uid_counter)
    return _UID_BASE + (os.getpid() % 20_000) * 1_000 + n % 1_000


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


_VERSION_CODE = "import sys; print(sys.version, sys.prefix)"


def _probe_version(cmd: list[str], cwd: str, user: int | None = None) -> str | None:
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL,
                             cwd=cwd, env=minimal_env(cwd), **kw)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _first_usable(candidates: list[str], namespace: bool) -> str | None:
    """The first interpreter a fresh uid runs (in the namespaces) as the same installation."""
    workdir = tempfile.mkdtemp(prefix="viasd-sbx-probe-")
    try:
        for name in ("program.py", "checks.py"):
            Path(workdir, name).write_text("")
        uid = _next_uid()
        if not namespace:
            os.chown(workdir, uid, uid)
        for py in candidates:
            as_root = _probe_version([py, "-I", "-c", _VERSION_CODE], workdir)
            if namespace:
                cmd = namespace_prefix(uid, 16, 1 << 20, []) + [py, "-I", "-c", _VERSION_CODE]
                sandboxed = _probe_version(cmd, workdir)
            else:
                sandboxed = _probe_version([py, "-I", "-c", _VERSION_CODE], workdir, user=uid)
            if as_root and sandboxed == as_root:
                return py
        return None
    finally:
        remove_tree(workdir)


def _candidates() -> list[str]:
    env_py = os.environ.get("VIASD_SANDBOX_PYTHON")
    cands = [env_py] if env_py else [sys.executable, "/usr/bin/python3", shutil.which("python3") or ""]
    return [c for i, c in enumerate(cands) if c and c not in cands[:i] and os.path.exists(c)]


@functools.lru_cache(maxsize=1)
def _isolation() -> tuple[str | None, str]:
    """(interpreter usable in namespace mode or None, why not); probes once per process."""
    cands = _candidates()
    if not cands:
        return None, "no Python interpreter found for the sandbox (set VIASD_SANDBOX_PYTHON)"
    if not _is_root():
        return None, "not running as root"
    missing = [t for t in ("unshare", "setpriv", "mount", "sh", "cp") if not shutil.which(t)]
    if missing:
        return None, f"missing tools {missing} (Debian: apt-get install util-linux mount)"
    py = _first_usable(cands, namespace=True)
    if py is None:
        return None, "creating the namespaces failed (no CAP_SYS_ADMIN, or a seccomp/AppArmor policy)"
    return py, ""


def _unsafe_requested(unsafe: bool) -> bool:
    return unsafe or os.environ.get(UNSAFE_ENV, "").strip().lower() in ("1", "true", "yes")


def require_isolation(unsafe: bool = False) -> None:
    """Raise a one-line ConfigError unless generated code can run fully isolated here (or is waived).

    ``unsafe`` (a task's ``unsafe_exec``) or ``VIASD_UNSAFE_EXEC=1`` waives it. Cheap after
    the first call; call it before generating, so a run cannot fail only at scoring time.
    """
    py, why = _isolation()
    if py is None and not _unsafe_requested(unsafe):
        raise ConfigError(
            f"refusing to execute generated code: the sandbox is unavailable ({why}). Run as root "
            f"with util-linux unshare/setpriv, or accept running it unsandboxed with {UNSAFE_ENV}=1 "
            "(or task.unsafe_exec=true)"
        )


def _plan(unsafe: bool) -> _Plan:
    require_isolation(unsafe)
    py, why = _isolation()
    if py is not None:
        return _Plan("namespace", py, True)
    return _unsafe_plan(why)


@functools.lru_cache(maxsize=1)
def _unsafe_plan(why: str) -> _Plan:
    if _is_root():
        py = _first_usable(_candidates(), namespace=False)
        if py is None:
            raise ConfigError("no interpreter is usable by an unprivileged uid; set VIASD_SANDBOX_PYTHON "
                              "to a world-readable python (generated code never runs as root)")  # fmt: skip
        return _Plan("unsafe", py, True)
    return _Plan("unsafe", os.environ.get("VIASD_SANDBOX_PYTHON") or sys.executable, False)


def sandbox_mode(unsafe: bool = False) -> str:
    """``"namespace"``, or ``"unsafe"`` when isolation is unavailable and waived (else ConfigError)."""
    return _plan(unsafe).mode


def sandbox_python(unsafe: bool = False) -> str:
    """The interpreter that sandboxed programs run with."""
    return _plan(unsafe).python


def drops_privileges(unsafe: bool = False) -> bool:
    """True when programs run as a fresh unprivileged uid (the harness runs as root)."""
    return _plan(unsafe).drop_uid


def run_program(
    code: str,
    checks: str = "",
    timeout_s: float = 10,
    memory_mb: int = 1024,
    *,
    max_procs: int = 16,
    max_file_mb: int = 16,
    max_disk_mb: int = 32,
    max_output_mb: int = 4,
    unsafe: bool = False,
) -> SandboxResult:
    """Run ``code`` then ``checks`` in the sandbox; passed iff both ran to completion.

    ``timeout_s`` bounds the wall time; ``memory_mb`` the memory of the whole sample (its
    cgroup) and of each process (address space); ``max_procs`` its processes and threads;
    ``max_file_mb`` any one file (and memfd); ``max_disk_mb`` all files it writes (a
    tmpfs); ``max_output_mb`` its stdout+stderr. Never raises for anything the program
    does; raises a ConfigError (before running anything) when the sandbox is unavailable
    and ``unsafe``/``VIASD_UNSAFE_EXEC`` does not waive it.
    """
    plan = _plan(unsafe)
    t0 = time.monotonic()

    def result(status: str, reason: str, detail: str = "", peak: float | None = None) -> SandboxResult:
        return SandboxResult(status == "passed", status, reason, detail, time.monotonic() - t0, peak)

    namespace = plan.mode == "namespace"
    workdir: str | None = None
    cg: SampleCgroup | None = None
    proc: subprocess.Popen | None = None
    fds: list[int] = []
    try:
        workdir = tempfile.mkdtemp(prefix="viasd-sbx-")
        Path(workdir, "program.py").write_text(code, encoding="utf-8")
        Path(workdir, "checks.py").write_text(checks, encoding="utf-8")
        if namespace:
            try:
                cg = SampleCgroup.create(memory_mb * 1024 * 1024, max_procs + 2)
            except OSError as e:
                return result("error", f"could not create the sample's cgroup: {e}")
        mb = 1024 * 1024
        nofile = 256 if cg or not namespace else max(16, memory_mb // max(1, max_file_mb))
        nproc = (max_procs if cg else 1) if plan.drop_uid else -1
        limits = [memory_mb * mb, nproc, max_file_mb * mb, int(timeout_s) + 2, nofile]
        key = secrets.token_hex(16).encode()
        key_r, key_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        fds = [key_r, key_w, res_r, res_w, out_r, out_w]
        os.write(key_w, key)
        driver = [plan.python, "-I", "-B", "-c", DRIVER, str(key_r), str(res_w), *map(str, limits)]
        driver.append("0" if namespace else "1")
        popen_kw: dict = {}
        uid = _next_uid() if plan.drop_uid else None
        if namespace:
            procs = cg.procs_files if cg else []
            cmd = namespace_prefix(uid, max_disk_mb, max_file_mb * mb, procs) + driver
            env = minimal_env("/tmp/work")
        else:
            cmd, env = driver, minimal_env(workdir)
            if uid is not None:
                for p in (workdir, Path(workdir, "program.py"), Path(workdir, "checks.py")):
                    os.chown(p, uid, uid)
                popen_kw = {"user": uid, "group": uid, "extra_groups": []}
        try:
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out_w,
                                    stderr=out_w, pass_fds=(key_r, res_w), start_new_session=True,
                                    **popen_kw)  # fmt: skip
        except OSError as e:
            return result("error", f"could not start the sandbox: {e}")
        for fd in (key_r, key_w, res_w, out_w):
            os.close(fd)
            fds.remove(fd)
        detail, verdict, stop = collect(proc, out_r, res_r, timeout_s, max_output_mb * mb, _DETAIL_CHARS)
        kill_group(proc, namespace)  # leftovers die with the PID namespace; in unsafe mode, here
        peak = cg.peak_bytes() if cg else None
        peak_mb = None if peak is None else peak / mb
        if stop == "timeout":
            return result("timeout", f"timed out after {timeout_s:g} s", detail, peak_mb)
        if stop == "output":
            return result("failed", f"output exceeded {max_output_mb} MB", detail, peak_mb)
        if verdict == key + b" passed":
            return result("passed", "the checks ran to completion", detail, peak_mb)
        rc = proc.returncode
        if rc == SETUP_FAILED and SETUP_MARKER in detail:
            return result("error", "sandbox setup failed: " + detail.strip().splitlines()[-1], detail)
        if verdict.startswith(b"failed ") and key not in verdict:
            return result("failed", verdict[7:200].decode("ascii", "replace"), detail, peak_mb)
        if cg is not None and cg.oom_killed():
            reason = f"the sample exceeded its memory limit of {memory_mb} MB ({exit_words(rc, namespace)})"
            return result("failed", reason, detail, peak_mb)
        how = exit_words(rc, namespace)
        if verdict:
            return result("failed", f"the result channel was tampered with ({how})", detail, peak_mb)
        return result("failed", f"exited before the checks completed ({how})", detail, peak_mb)
    except Exception as e:  # the harness must survive whatever a sample does
        if proc is not None and proc.poll() is None:
            kill_group(proc, namespace)
        return result("error", f"{type(e).__name__}: {e}")
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if cg is not None:
            cg.remove()
        if workdir is not None:
            remove_tree(workdir)


def run_programs(
    codes: Sequence[str],
    checks: Sequence[str] | None = None,
    timeout_s: float = 10,
    memory_mb: int = 1024,
    workers: int | None = None,
    *,
    unsafe: bool = False,
    **limits: int,
) -> list[SandboxResult]:
    """:func:`run_program` over ``zip(codes, checks)``, ``workers`` at a time (default: CPUs, ≤ 8).

    Results are in input order; one sample's crash or hang never affects the others. Raises
    a ConfigError before running anything when isolation is unavailable and not waived;
    when it is waived, logs a warning on every call.
    """
    checks = list(checks) if checks is not None else [""] * len(codes)
    if len(checks) != len(codes):
        raise ValueError(f"{len(codes)} programs but {len(checks)} checks")
    if not codes:
        return []
    if _plan(unsafe).mode != "namespace":
        log.warning(
            "executing generated code WITHOUT the sandbox (%s; %s=1 or unsafe_exec=true): only resource "
            "limits apply%s", _isolation()[1], UNSAFE_ENV,
            "" if drops_privileges(unsafe) else "; the code runs as this user and can read its files and environment",
        )  # fmt: skip
    n = workers or min(8, os.cpu_count() or 1)

    def one(i: int) -> SandboxResult:
        return run_program(codes[i], checks[i], timeout_s, memory_mb, unsafe=unsafe, **limits)

    if n <= 1 or len(codes) == 1:
        return [one(i) for i in range(len(codes))]
    with ThreadPoolExecutor(max_workers=n) as ex:
        return list(ex.map(one, range(len(codes))))
