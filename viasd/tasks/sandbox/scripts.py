"""The two programs a sandboxed sample runs, and the command and environment that start them.

This module owns the text of the harness-owned Python driver and of the root ``sh`` stage
of namespace mode, plus :func:`namespace_prefix` and :func:`minimal_env`.
:mod:`viasd.tasks.sandbox` decides when and how they run.

The result channel (one pipe to the harness) carries, in order: ``READY`` (written by the
driver once its limits and seccomp filter are in place, before any code of the program
runs), then ``serving`` (the program's top-level code returned) or ``failed program <Name>``,
then length-framed replies to the harness's requests, which come on a second pipe. A setup
failure (the root stage's, or the driver's before ``READY``) is ``SETUP_MARKER`` and a line.
The checks are never sent: they run in the harness (:mod:`viasd.tasks.sandbox.rpc`).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Sequence

__all__ = [
    "DRIVER", "READY", "SETUP_MARKER", "STAGE", "SYSTEM_DIRS", "driver_source", "minimal_env", "namespace_prefix",
    "root_binds",
]  # fmt: skip

READY = b"ready\n"
SETUP_MARKER = b"viasd-sandbox-setup-failed: "

# The harness-owned driver, run by the sandboxed interpreter after the codec's source
# (:mod:`viasd.tasks.sandbox.codec`, see :func:`driver_source`). argv: result fd, request fd,
# the limits (address space, processes, file size, CPU s, open files), "1"/"0" socket guard,
# the seccomp filter as hex ("-": none). It runs the program, then clears every trace and
# profile hook and serves the harness's requests (look up a name of the program's namespace,
# call one of its functions, with arguments that may name the program's own objects) until
# told to end; the checks never exist in this process.
DRIVER = r"""
def _viasd_driver(argv):
    import _signal, builtins, ctypes, os, resource, sys, types
    read, write, exit_, set_blocking = os.read, os.write, os._exit, os.set_blocking
    exec_, compile_, type_, Base = exec, compile, type, BaseException
    name_of, encode_str = type.__dict__["__name__"].__get__, str.encode
    Module, enc, dec, frame_, unframe = types.ModuleType, encode, decode, frame, unframe_length
    settrace, setprofile = sys.settrace, sys.setprofile
    set_events = getattr(getattr(sys, "monitoring", None), "set_events", None)
    stdout, stderr, print_exc = sys.stdout, sys.stderr, sys.__excepthook__  # (C: no traceback import)
    res_fd, req_fd = int(argv[1]), int(argv[2])

    def setup_failed(what):
        write(res_fd, b"viasd-sandbox-setup-failed: %s (errno %d)\n" % (what, ctypes.get_errno()))
        exit_(125)

    for lim, val in zip((resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE,
                         resource.RLIMIT_CPU, resource.RLIMIT_NOFILE), map(int, argv[3:8])):
        if val >= 0:
            resource.setrlimit(lim, (val, val))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    # no_new_privs (a filter needs it), then not dumpable: /proc/self/mem and the like
    # become root's, and the filter keeps it so.
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(4, 0, 0, 0, 0):
        setup_failed(b"prctl")
    if argv[9] != "-":
        bpf = bytes.fromhex(argv[9])

        class Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

        if libc.prctl(22, 2, ctypes.byref(Prog(len(bpf) // 8, bpf)), 0, 0):  # PR_SET_SECCOMP, filter
            setup_failed(b"loading the seccomp filter")
    if argv[8] == "1":
        def no_net(event, args):
            if event.startswith("socket.") and event != "socket.gethostname":
                raise PermissionError("network access is disabled in the sandbox")
        sys.addaudithook(no_net)
    with open("program.py", "rb") as f:
        src = f.read().decode("utf-8")
    sys.argv = ["program.py"]
    keep = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_."
    not_name = bytes(c for c in range(256) if c not in keep)

    def class_name(e):
        try:
            return encode_str(name_of(type_(e)), "ascii", "replace").translate(None, not_name)[:80] or b"Exception"
        except Base:
            return b"Exception"

    g = {"__name__": "__candidate__", "__builtins__": builtins}
    write(res_fd, b"ready\n")
    try:
        exec_(compile_(src, "program.py", "exec"), g)
        record = b"serving\n"
    except Base as e:
        record = b"failed program " + class_name(e) + b"\n"
        try:
            sys.stderr = stderr
            print_exc(type_(e), e, e.__traceback__)
        except Base:
            pass

    def quiet():
        settrace(None)
        setprofile(None)
        th = sys.modules.get("threading")
        for hook in ("settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads"):
            try:
                getattr(th, hook)(None)
            except Base:
                pass
        if set_events is not None:
            for tool in range(6):
                try:
                    set_events(tool, 0)
                except Base:
                    pass
        try:
            stdout.flush()
            stderr.flush()
        except Base:
            pass

    def read_exact(n):
        buf = b""
        while len(buf) < n:
            chunk = read(req_fd, n - len(buf))
            if not chunk:
                exit_(0)
            buf += chunk
        return buf

    try:
        quiet()
        set_blocking(req_fd, True)  # the program may have made it non-blocking
        write(res_fd, record)
        while record == b"serving\n":
            req = dec(read_exact(unframe(read_exact(8))))
            if req[0] == "end":
                break
            obj = g.get(req[1], g)
            try:
                if req[0] == "look":
                    if obj is g:
                        reply = ("missing",)
                    elif isinstance(obj, Module):
                        reply = ("module", obj.__name__)
                    elif callable(obj):
                        reply = ("call",)
                    else:
                        try:
                            enc(obj)
                            reply = ("value", obj)
                        except Base:
                            reply = ("ref",)  # stays here; the checks may pass it back by name
                else:
                    args = list(req[2])
                    for i, ref in req[4].items():
                        args[i] = g[ref]
                    reply = ("ok", obj(*args, **req[3]))
            except Base as e:
                reply = ("raise", class_name(e).decode())
            quiet()
            try:
                data = enc(reply)
            except Base as e:
                data = enc(("bad", "the program's %s returned a value that %s" % (req[1], e)))
            write(res_fd, frame_(data))
    finally:
        exit_(0)
_viasd_driver(__import__("sys").argv)
"""


@functools.lru_cache(maxsize=1)
def driver_source() -> str:
    """The driver's full source: the codec's functions, then :data:`DRIVER` (read once per process,
    so a checkout that changes under a long scoring run cannot change what its samples run)."""
    from viasd.tasks.sandbox import codec

    return inspect.getsource(codec) + "\n" + DRIVER


# Root stage of namespace mode, run by sh as PID 1 of the new namespaces: join the sample's
# cgroup, lower the IPC limits, build the sample's minimal root and pivot_root into it, then
# run the driver as the fresh uid without capabilities (rootless, uid "-": the stage is root of
# a user namespace mapping the caller, and the driver stays that uid, without capabilities).
# The minimal root is a tmpfs holding read-only bind mounts of the interpreter's installation
# and the system directories it needs ($6), the symlinks among them (merged /usr), a fresh
# /proc of the PID namespace, a few device nodes, private size-limited tmpfs /tmp (the working
# directory /tmp/work, with the program copied in) and /dev/shm; nothing else of the host
# (repository, data, home directories, /run and its sockets) exists there. sh stays PID 1 (a
# program that kills itself must not be PID 1); when it exits, the kernel kills whatever is
# left. Inside a user namespace the host's mounts are locked: a read-only bind remount must
# keep the flags of the mount it copies (nosuid, nodev, noexec, the atime mode), so rootless
# binds repeat them (findmnt). $1 result fd (setup failures go there), $2 uid ("-": rootless),
# $3 tmpfs size, $4 IPC byte limit, $5 cgroup.procs files (space separated, may be empty), $6
# the paths to bind (space separated); the rest is the command.
STAGE = r"""
res=$1; uid=$2; size=$3; ipc=$4; cgs=$5; binds=$6; shift 6
fail() { echo "viasd-sandbox-setup-failed: $*" > "/proc/self/fd/$res"; exit 125; }  # dash: fds > 9
for f in $cgs; do echo 0 > "$f" || fail "join cgroup $f"; done
echo "$ipc" > /proc/sys/kernel/shmmax && echo $((ipc / 4096)) > /proc/sys/kernel/shmall &&
  echo 4 > /proc/sys/kernel/shmmni && echo 4 > /proc/sys/kernel/msgmni &&
  echo 4 > /proc/sys/fs/mqueue/queues_max || fail "IPC limits"
R=/tmp  # the new root: a tmpfs over /tmp of this mount namespace (the working directory stays reachable)
mount -t tmpfs -o "size=1m,mode=755,nosuid,nodev" tmpfs "$R" || fail "mount the minimal root"
dirs="$R/proc $R/dev/shm $R/tmp $R/.old"; links=""
for p in $binds; do
  if [ -L "$p" ]; then links="$links $p"; elif [ -d "$p" ]; then dirs="$dirs $R$p"; fi
done
mkdir -p $dirs && touch "$R/dev/null" "$R/dev/zero" "$R/dev/full" "$R/dev/random" "$R/dev/urandom" ||
  fail "prepare the minimal root"
for p in $links; do ln -s "$(readlink "$p")" "$R$p" || fail "link $p"; done
for p in $binds; do
  [ -L "$p" ] || [ ! -d "$p" ] && continue
  keep=""
  if [ "$uid" = - ]; then  # e.g. "rw,nosuid,relatime" -> ",nosuid,relatime"
    keep=$(findmnt -n -o VFS-OPTIONS -T "$p") || fail "read the flags of $p"
    keep=${keep#r[ow]}
  fi
  mount -o "bind,ro,nosuid,nodev$keep" "$p" "$R$p" || fail "bind $p"
done
mount -t proc -o nosuid,nodev,noexec proc "$R/proc" || fail "mount /proc"
if [ "$uid" = - ]; then  # rootless: the sample is the caller's uid, which may view the caller's keys there,
  for f in keys key-users; do mount -o bind /dev/null "$R/proc/$f" || fail "hide /proc/$f"; done
  # and root of the user namespace owning its IPC namespace, whose limits (set above) it could raise
  mount -o bind,ro,nosuid,nodev,noexec "$R/proc/sys" "$R/proc/sys" || fail "read-only /proc/sys"
fi
for n in null zero full random urandom; do mount -o bind "/dev/$n" "$R/dev/$n" || fail "bind /dev/$n"; done
ln -s /proc/self/fd "$R/dev/fd" || fail "link /dev/fd"
mount -t tmpfs -o "size=1m,mode=1777,nosuid,nodev" tmpfs "$R/dev/shm" || fail "mount /dev/shm"
mount -t tmpfs -o "size=$size,mode=1777,nosuid,nodev" tmpfs "$R/tmp" || fail "mount /tmp"
mkdir -m 700 "$R/tmp/work" && cp program.py "$R/tmp/work/" || fail "prepare /tmp/work"
[ "$uid" = - ] || chown -R "$uid:$uid" "$R/tmp/work" || fail "prepare /tmp/work"
cd "$R" && PATH="/usr/sbin:/sbin:$PATH" pivot_root . .old && umount -l /.old && rmdir /.old || fail "pivot_root"
mount -o remount,bind,ro,nosuid,nodev / || fail "remount / read-only"
cd /tmp/work || fail "cd /tmp/work"
unset OLDPWD
if [ "$uid" = - ]; then  # root of the user namespace, without a capability, and no way to regain one
  setpriv --no-new-privs --inh-caps=-all --bounding-set=-all \
    --securebits=+noroot,+noroot_locked,+no_setuid_fixup,+no_setuid_fixup_locked,+keep_caps_locked "$@"
else
  setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs \
    --inh-caps=-all --bounding-set=-all "$@"
fi
exit $?
"""

# The host directories a minimal root needs besides the interpreter's installation (those
# that exist; symlinks, as in merged /usr, are recreated as symlinks).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def root_binds(python: str) -> list[str]:
    """The host paths a sample's minimal root shows, read-only: the system directories and
    the installation of ``python`` (the directory above its real ``bin/``), when elsewhere."""
    real = os.path.realpath(python)
    install = os.path.dirname(os.path.dirname(real))
    paths = [p for p in SYSTEM_DIRS if os.path.lexists(p)]
    inside = any(install == p or install.startswith(p + "/") for p in paths)
    if not inside and install not in ("/", "") and " " not in install:
        paths.append(install)
    return paths


def minimal_env(home: str) -> dict[str, str]:
    """The whole environment of a sandboxed process (nothing inherited from the harness)."""
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


def namespace_prefix(
    res_fd: int, uid: int | None, tmpfs_mb: int, ipc_bytes: int, cgroup_procs: Sequence[str], python: str
) -> list[str]:
    """``unshare … sh -c STAGE`` for uid ``uid``: the command that precedes the driver in namespace mode.

    ``uid`` None is the rootless level: a new user namespace mapping the caller to root comes
    first, and the sample stays the caller's uid. ``python`` is the interpreter the driver runs
    with (its installation is bound into the sample's minimal root).
    """
    user = ["--user", "--map-root-user"] if uid is None else []
    return [
        "unshare", *user, "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--ipc", "--uts",
        "sh", "-c", STAGE, "viasd-sandbox", str(res_fd), "-" if uid is None else str(uid), f"{tmpfs_mb}m", str(ipc_bytes),
        " ".join(cgroup_procs), " ".join(root_binds(python)),
    ]  # fmt: skip
