"""Sandboxed execution of generated code, for pass@1 (HumanEval, MBPP); design in ``docs/sandbox.md``.

This package is the code sandbox, on its own (the tasks use it; it imports nothing of the rest of
:mod:`viasd` but :mod:`viasd.errors`): ``codec`` (the plain data that crosses), ``scripts`` (the
driver and the root stage), ``rpc`` (the checks, run in the harness), ``proc`` (uids, kill, the
verdict when the checks reached none), ``kernel`` (seccomp filter, session keyring), ``isolation``
(the levels and their probes), ``cgroups`` (per-sample cgroup). This module, its entry point, owns
running one untrusted program and its checks and deciding whether the checks ran to completion. A
harness-owned driver runs the program in a fresh ``python -I`` process (its namespace's
``__name__`` is not ``"__main__"``, as in OpenAI's human-eval); the checks never enter that
process: they run here and call the program's functions over a pipe, with only plain data
crossing. Status and reason come from the harness, never from text the program wrote; exit
statuses are never trusted: early exits, signals and timeouts fail, each with its reason.

Isolation levels, chosen once per process: ``root namespaces`` when root, ``rootless namespaces``
when not root and unprivileged user namespaces work, else refused unless waived (``unsafe``). Both
namespace levels (util-linux ``unshare``/``setpriv``/``mount``/``findmnt``, libseccomp) give each
sample fresh network, PID, mount, IPC and UTS namespaces, a fresh empty session keyring, a minimal
root (the interpreter's installation and system libraries read-only, private ``/tmp`` and
``/dev/shm``, a few device nodes; nothing else of the host), no capabilities, ``no_new_privs``,
not dumpable, the seccomp filter — as a random unprivileged uid when root, as the caller's uid
(root of its user namespace, no capability) when rootless; a ``sh`` is PID 1, so everything left
dies with it. A per-sample cgroup (where one can be created) bounds memory, tasks and CPU
bandwidth; without one the program may not fork. Per process: address space, file size, CPU
seconds, open files; output past ``max_output_mb`` kills the sample.

Fail closed: when neither namespace level is available (no unprivileged user namespaces, no
``CAP_SYS_ADMIN``, tools or libseccomp missing, or the self-test of the whole chain fails),
:func:`run_programs` raises a :class:`~viasd.errors.ConfigError` naming the opt-in,
``VIASD_UNSAFE_EXEC=1`` or the task's ``unsafe_exec: true``. With it, programs run with the
resource limits (and the filter where libseccomp is there) only, as a fresh uid when root, else as
the harness's own user, with a warning per call. ``VIASD_SANDBOX_PYTHON`` picks the interpreter
(default: the first of ``sys.executable``, ``/usr/bin/python3`` that the sandbox uid runs as the
same installation).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from viasd.errors import ConfigError
from viasd.tasks.sandbox.cgroups import SampleCgroup
from viasd.tasks.sandbox.isolation import UNSAFE, Plan, candidates, first_usable, userns_unavailable
from viasd.tasks.sandbox.kernel import filter_program, seccomp_unavailable, spawn_in_fresh_keyring
from viasd.tasks.sandbox.proc import SETUP_S, exit_words, free_uid, judge, kill_group, remove_tree, take_uid
from viasd.tasks.sandbox.rpc import Link, converse
from viasd.tasks.sandbox.scripts import driver_source, minimal_env, namespace_prefix

log = logging.getLogger(__name__)

__all__ = [
    "UNSAFE_ENV",
    "SandboxResult",
    "drops_privileges",
    "isolation_level",
    "levels",
    "remove_tree",
    "require_isolation",
    "run_program",
    "run_programs",
    "sandbox_mode",
    "sandbox_python",
]

UNSAFE_ENV = "VIASD_UNSAFE_EXEC"
_DETAIL_CHARS = 2000


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


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


# The self-test of the whole chain: the filter is in place (no user namespaces) and the checks pass.
_SELF_TEST = (
    "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "assert libc.unshare(0x10000000) == -1 and ctypes.get_errno() == errno.EPERM\n"
)


@functools.lru_cache(maxsize=1)
def _isolation() -> tuple[Plan | None, str]:
    """(the isolated plan — root or rootless namespaces — or None, why not); probes once per process."""
    cands = candidates()
    if not cands:
        return None, "no Python interpreter found for the sandbox (set VIASD_SANDBOX_PYTHON)"
    mode = "namespace" if _is_root() else "rootless"
    if mode == "rootless":
        why = userns_unavailable()
        if why:
            return None, f"not running as root, and {why}"
    tools = ("unshare", "setpriv", "mount", "sh", "cp") + (("findmnt",) if mode == "rootless" else ())
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        return None, f"missing tools {missing} (Debian: apt-get install util-linux mount)"
    why = seccomp_unavailable()
    if why:
        return None, why
    py = first_usable(cands, mode)
    if py is None:
        return None, ("creating the namespaces failed (no CAP_SYS_ADMIN, or a seccomp/AppArmor policy)"
                      if mode == "namespace" else "creating the rootless namespaces failed (no interpreter "
                      "readable by this user, or a mount refused in the user namespace; set VIASD_SANDBOX_PYTHON)")
    plan = Plan(mode, py, mode == "namespace")
    r = _run(plan, _SELF_TEST, "pass", timeout_s=20, memory_mb=256, max_procs=4,
             max_file_mb=1, max_disk_mb=1, max_output_mb=1, max_cpus=1.0)  # fmt: skip
    if not r.passed:
        return None, f"the sandbox's self-test did not pass ({r.status}: {r.reason})"
    return plan, ""


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
            f"refusing to execute generated code: the sandbox is unavailable ({why}). Run as root, or as a user "
            "allowed unprivileged user namespaces, with util-linux unshare/setpriv and libseccomp, or accept "
            f"running it unsandboxed with {UNSAFE_ENV}=1 (or task.unsafe_exec=true)"
        )


def _plan(unsafe: bool) -> Plan:
    require_isolation(unsafe)
    plan, why = _isolation()
    return plan if plan is not None else _unsafe_plan(why)


@functools.lru_cache(maxsize=1)
def _unsafe_plan(why: str) -> Plan:
    if _is_root():
        py = first_usable(candidates(), "unsafe")
        if py is None:
            raise ConfigError("no interpreter is usable by an unprivileged uid; set VIASD_SANDBOX_PYTHON "
                              "to a world-readable python (generated code never runs as root)")  # fmt: skip
        return Plan("unsafe", py, True)
    return Plan("unsafe", os.environ.get("VIASD_SANDBOX_PYTHON") or sys.executable, False)


def sandbox_mode(unsafe: bool = False) -> str:
    """``"namespace"`` (root), ``"rootless"``, or ``"unsafe"`` when isolation is unavailable and waived
    (else ConfigError)."""
    return _plan(unsafe).mode


def isolation_level(unsafe: bool = False) -> str:
    """The level samples run at here, as a scored run records it: ``root namespaces``, ``rootless
    namespaces`` or ``unsafe`` (:mod:`viasd.tasks.sandbox.isolation`); ConfigError when refused."""
    return _plan(unsafe).level


def levels() -> dict[str, Plan]:
    """Every isolation level this process runs samples at, by name (the bench compares them): its
    own isolated level (``root namespaces`` as root, ``rootless namespaces`` otherwise) when
    available, and ``unsafe``, the floor (resource limits and the filter only). Root gets no
    rootless level: its user namespace would map the sample to the host's root, which is no
    measure of a user's sandbox (run the bench as that user instead)."""
    plan, _ = _isolation()
    out = {plan.level: plan} if plan is not None else {}
    out[UNSAFE] = _unsafe_plan("the floor")
    return out


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
    max_cpus: float = 1.0,
    unsafe: bool = False,
    plan: Plan | None = None,
) -> SandboxResult:
    """Run ``code`` then ``checks`` in the sandbox; passed iff both ran to completion.

    ``timeout_s`` bounds the program's wall time (counted from when the sandbox is up);
    ``memory_mb`` the memory of the whole sample (its cgroup) and of each process (address
    space); ``max_procs`` its processes and threads; ``max_cpus`` the CPUs' worth of time it
    may use at once (its cgroup, where the cpu controller is there; each process also gets
    ``RLIMIT_CPU`` of ⌈``timeout_s``⌉ + 1 s); ``max_file_mb`` any one file (and memfd);
    ``max_disk_mb`` all files it writes (a tmpfs); ``max_output_mb`` its stdout+stderr.
    Never raises for anything the program does (whatever the checks raise, ``SystemExit``
    included, is the sample's failure); raises a ConfigError (before running
    anything) when the sandbox is unavailable and ``unsafe``/``VIASD_UNSAFE_EXEC`` does not
    waive it. ``plan``: run at that level instead (one of :func:`levels`; the bench).
    """
    plan = plan or _plan(unsafe)
    return _run(
        plan, code, checks, timeout_s, memory_mb, max_procs, max_file_mb, max_disk_mb, max_output_mb, max_cpus
    )


def _run(plan: Plan, code: str, checks: str, timeout_s: float, memory_mb: int, max_procs: int,
         max_file_mb: int, max_disk_mb: int, max_output_mb: int, max_cpus: float) -> SandboxResult:  # fmt: skip
    """:func:`run_program` under ``plan``."""
    t0 = time.monotonic()

    def result(status: str, reason: str, detail: str = "", peak: float | None = None) -> SandboxResult:
        return SandboxResult(status == "passed", status, reason, detail, time.monotonic() - t0, peak)

    namespace, rootless = plan.namespaces, plan.mode == "rootless"
    workdir: str | None = None
    cg: SampleCgroup | None = None
    proc: subprocess.Popen | None = None
    uid: int | None = None
    fds: list[int] = []
    try:
        workdir = tempfile.mkdtemp(prefix=f"viasd-sbx-{os.getpid()}-")  # the scorer's pid: whose leftovers
        Path(workdir, "program.py").write_text(code, encoding="utf-8")  # the checks never become a file
        mb = 1024 * 1024
        if namespace:
            try:
                cg = SampleCgroup.create(memory_mb * mb, max_procs + 2, max_cpus)
            except OSError as e:
                return result("error", f"could not create the sample's cgroup: {e}")
        nofile = 256 if cg or not namespace else max(16, memory_mb // max(1, max_file_mb))
        nproc = (max_procs if cg else 1) if plan.drop_uid or rootless else -1  # rootless: counted per user ns
        limits = [memory_mb * mb, nproc, max_file_mb * mb, math.ceil(timeout_s) + 1, nofile]
        try:
            bpf = filter_program().hex()
        except OSError:
            bpf = "-"  # only in unsafe mode: the namespace levels require the filter (_isolation)
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        fds = [req_r, req_w, res_r, res_w, out_r, out_w]
        driver = [plan.python, "-I", "-B", "-c", driver_source(), str(res_w), str(req_r), *map(str, limits)]
        driver += ["0" if namespace else "1", bpf]
        popen_kw: dict = {}
        uid = take_uid() if plan.drop_uid else None
        if namespace:
            procs = cg.procs_files if cg else []
            cmd = namespace_prefix(res_w, uid, max_disk_mb, max_file_mb * mb, procs, plan.python) + driver
            env = minimal_env("/tmp/work")
        else:
            cmd, env = driver, minimal_env(workdir)
            if uid is not None:
                for p in (workdir, Path(workdir, "program.py")):
                    os.chown(p, uid, uid)
                popen_kw = {"user": uid, "group": uid, "extra_groups": []}
        try:
            proc = spawn_in_fresh_keyring(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out_w,
                                          stderr=out_w, pass_fds=(req_r, res_w), start_new_session=True,
                                          **popen_kw)  # fmt: skip
        except OSError as e:
            return result("error", f"could not start the sandbox: {e}")
        for fd in (req_r, res_w, out_w):
            os.close(fd)
            fds.remove(fd)
        link = Link(proc, out_r, res_r, req_w, timeout_s, max_output_mb * mb, SETUP_S, _DETAIL_CHARS)
        status, reason, stop, trace = converse(link, checks, code)
        if stop in ("exited", "tampered"):
            link.drain()
        kill_group(proc, namespace)  # leftovers die with the PID namespace; in unsafe mode, here
        link.drain(0.2)
        peak = cg.peak_bytes() if cg else None
        peak_mb = None if peak is None else peak / mb
        how = exit_words(proc.returncode, namespace)
        if status is None:
            oom = (
                f"the sample exceeded its memory limit of {memory_mb} MB ({how})"
                if cg and cg.oom_killed()
                else ""
            )
            words = {
                "timeout": f"timed out after {timeout_s:g} s",
                "output": f"output exceeded {max_output_mb} MB",
            }
            status, reason = judge(bytes(link.channel), stop, how, words.get(stop, ""), oom)
        detail = (link.output() + trace)[-_DETAIL_CHARS:]
        return result(status, reason, detail, None if status == "error" else peak_mb)
    except BaseException as e:  # noqa: BLE001 - the harness must survive whatever a sample does
        if proc is not None and proc.poll() is None:
            kill_group(proc, namespace)
        if isinstance(e, KeyboardInterrupt):  # the user's Ctrl-C (the checks' own end in run_checks)
            raise
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
        free_uid(uid)


#: How many more times :func:`run_programs` runs a sample whose sandbox could not run it (status ``error``).
ERROR_RETRIES = 2


def run_programs(
    codes: Sequence[str],
    checks: Sequence[str] | None = None,
    timeout_s: float = 10,
    memory_mb: int = 1024,
    workers: int | None = None,
    *,
    unsafe: bool = False,
    plan: Plan | None = None,
    **limits: int,
) -> list[SandboxResult]:
    """:func:`run_program` over ``zip(codes, checks)``, ``workers`` at a time (default: CPUs, ≤ 8).

    Results are in input order; one sample's crash or hang never affects the others. A sample
    whose sandbox could not run it (status ``"error"``: a start-up failure, a harness exception
    under load) is run again, one at a time, up to ``ERROR_RETRIES`` times, so the machine's
    hiccup does not score as the program's failure. Raises a ConfigError before running anything
    when isolation is unavailable and not waived; when it is waived, logs a warning on every call.
    """
    checks = list(checks) if checks is not None else [""] * len(codes)
    if len(checks) != len(codes):
        raise ValueError(f"{len(codes)} programs but {len(checks)} checks")
    if not codes:
        return []
    plan = plan or _plan(unsafe)
    if not plan.namespaces:
        log.warning(
            "executing generated code WITHOUT the sandbox (%s; %s=1 or unsafe_exec=true): only resource "
            "limits apply%s", _isolation()[1] or "the unsafe level was asked for", UNSAFE_ENV,
            "" if plan.drop_uid else "; the code runs as this user and can read its files and environment",
        )  # fmt: skip
    n = workers or min(8, os.cpu_count() or 1)

    def one(i: int) -> SandboxResult:
        return run_program(codes[i], checks[i], timeout_s, memory_mb, unsafe=unsafe, plan=plan, **limits)

    if n <= 1 or len(codes) == 1:
        results = [one(i) for i in range(len(codes))]
    else:
        with ThreadPoolExecutor(max_workers=n) as ex:
            results = list(ex.map(one, range(len(codes))))
    for _ in range(ERROR_RETRIES):
        again = [i for i, r in enumerate(results) if r.status == "error"]
        if not again:
            break
        log.warning("the sandbox could not run %d of %d samples (e.g. %s); running them again, one at a time",
                    len(again), len(codes), results[again[0]].reason)  # fmt: skip
        for i in again:
            results[i] = one(i)
    return results
