"""The kernel surface a sandboxed sample may reach: its seccomp filter and its session keyring.

This module owns the seccomp policy of :mod:`viasd.tasks.sandbox` (which system calls a
scored program is denied, compiled once per process to a BPF program by libseccomp through
its ``pyseccomp`` binding; the sandboxed driver loads those bytes with one ``prctl`` before
the program runs) and :func:`spawn_in_fresh_keyring`, which starts a sample from a thread
that first joins a new, empty anonymous session keyring (owned by the harness's uid, root)
for the sample to inherit in place of the harness's. Why these tools: ``docs/sandbox.md``.

Denied (``EPERM``, so Python raises an ordinary ``PermissionError``): kernel keyrings
(``add_key``, ``keyctl``, ``request_key``), new namespaces (``unshare``, ``setns``, ``clone``
with any ``CLONE_NEW*`` flag; ``clone3``, whose flags a filter cannot read, answers
``ENOSYS`` so that libc falls back to ``clone``), mounts and root changes, tracing and
other processes' memory (``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd``,
``kcmp``), kernel programs and counters (``bpf``, ``perf_event_open``, ``userfaultfd``,
``io_uring_*``, ``fanotify_init``), file handles, modules, kexec, reboot, swap, clocks,
host names, ``iopl``/``ioperm``, making the process dumpable again
(``prctl(PR_SET_DUMPABLE)``), and creating ``AF_UNIX`` sockets with ``socket`` (a filter
cannot read ``connect``'s address, so no Unix socket of the host can be connected to;
``socketpair`` stays allowed, its two ends reach nothing outside the sample). System calls of another ABI (i386 or x32 on x86-64) kill the
process.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import subprocess
import tempfile
import threading

try:
    import pyseccomp
except (ImportError, OSError, RuntimeError) as e:  # the binding, or libseccomp.so.2, is missing
    pyseccomp = None
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"
else:
    _IMPORT_ERROR = ""

__all__ = [
    "DENIED",
    "filter_program",
    "join_fresh_session_keyring",
    "seccomp_unavailable",
    "spawn_in_fresh_keyring",
]

DENIED = (
    "add_key", "keyctl", "request_key",
    "unshare", "setns",
    "mount", "umount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "fanotify_init", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "iopl", "ioperm",
)  # fmt: skip

# clone(2) flags that create a namespace (CLONE_NEWTIME, 0x80, exists only for clone3/unshare).
_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_PR_SET_DUMPABLE = 4
_AF_UNIX = 1
_KEYCTL_JOIN_SESSION_KEYRING = 1
_SCMP_ERROR = -1  # libseccomp's answer for a name it does not know on this architecture


def seccomp_unavailable() -> str:
    """Why no filter can be compiled here ("" when it can): names the package to install."""
    if pyseccomp is None:
        return (
            f"libseccomp is unavailable ({_IMPORT_ERROR}; pip install pyseccomp, apt-get install libseccomp2)"
        )
    try:
        filter_program()
    except OSError as e:
        return f"libseccomp could not compile the sandbox's filter ({e})"
    return ""


def _syscall_number(name: str) -> int:
    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


@functools.lru_cache(maxsize=1)
def filter_program() -> bytes:
    """The sandbox's seccomp filter as raw BPF (``struct sock_filter`` array, 8 bytes an instruction).

    Default allow; the calls in :data:`DENIED`, namespace-creating ``clone`` and
    ``socket(AF_UNIX, …)`` fail with ``EPERM``, ``clone3`` with ``ENOSYS``; a foreign ABI kills the process. Raises OSError when
    libseccomp is missing or refuses.
    """
    if pyseccomp is None:
        raise OSError(errno.ENOSYS, f"libseccomp is unavailable ({_IMPORT_ERROR})")
    sc = pyseccomp
    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in DENIED:
        nr = _syscall_number(name)
        if nr != _SCMP_ERROR:  # not every call exists on every architecture (iopl, umount)
            f.add_rule(deny, nr)
    flags_arg = 1 if sc.system_arch() in (sc.Arch.S390, sc.Arch.S390X) else 0  # s390 swaps clone's args
    for flag in _CLONE_NEW:
        f.add_rule(deny, "clone", sc.Arg(flags_arg, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(deny, "prctl", sc.Arg(0, sc.EQ, _PR_SET_DUMPABLE))
    f.add_rule(deny, "socket", sc.Arg(0, sc.EQ, _AF_UNIX))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


_libc = ctypes.CDLL(None, use_errno=True)


def join_fresh_session_keyring() -> bool:
    """Give the calling thread a new empty anonymous session keyring; children inherit it.

    Called (as root) in a thread that exists only to start one sample, so the keyring is
    owned by root, holds nothing of the harness's, and dies with the sample; the harness's
    other threads keep theirs. False when keyrings are unavailable here (``ENOSYS``), an
    outer policy denies them (``EPERM``/``EACCES``, e.g. a container's seccomp profile; then
    the sample cannot use them either) or the harness's key quota is spent (``EDQUOT``, as a
    non-root user); the sample's filter denies every keyring call in any case. Raises OSError
    on any other failure.
    """
    if pyseccomp is None:
        return False
    if _libc.syscall(_syscall_number("keyctl"), _KEYCTL_JOIN_SESSION_KEYRING, None) >= 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EDQUOT):
        return False
    raise OSError(err, f"joining a fresh session keyring failed: {errno.errorcode.get(err, err)}")


def spawn_in_fresh_keyring(cmd: list[str], **popen_kw) -> subprocess.Popen:
    """``Popen(cmd)`` from a thread of its own that first joins a fresh session keyring.

    The sample inherits that keyring (empty, owned by the harness's uid, gone with the
    sample), not the harness's; the harness's own threads keep theirs.
    """
    box: dict = {}

    def start() -> None:
        try:
            join_fresh_session_keyring()
            box["proc"] = subprocess.Popen(cmd, **popen_kw)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=start, name="viasd-sandbox-spawn")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["proc"]
