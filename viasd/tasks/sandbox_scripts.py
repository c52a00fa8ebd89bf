"""The two programs a sandboxed sample runs, and the command and environment that start them.

This module owns the text of the harness-owned Python driver (executes the program, then the
checks, and writes the run's key to the result pipe only when both returned) and of the root
``sh`` stage of namespace mode (joins the sample's cgroup, lowers IPC limits, mounts private
tmpfs, drops to the fresh uid), plus :func:`namespace_prefix` and :func:`minimal_env`.
:mod:`viasd.tasks.sandbox` decides when and how they run.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DRIVER", "SETUP_FAILED", "SETUP_MARKER", "STAGE", "minimal_env", "namespace_prefix"]

#: Exit status and stderr marker of a failed namespace setup (not the program's doing).
SETUP_FAILED = 125
SETUP_MARKER = "viasd-sandbox-setup-failed"

# The harness-owned driver, run by the sandboxed interpreter. argv: key fd, result fd, the
# limits (address space, processes, file size, CPU s, open files), "1"/"0" socket guard.
# It takes everything it needs before the program runs, so a program that replaces
# os.write/os._exit or sys.stderr can only make its own sample fail.
DRIVER = r"""
def _viasd_driver(argv):
    import builtins, os, resource, sys, traceback
    write, exit_, close = os.write, os._exit, os.close
    key_fd, res_fd = int(argv[1]), int(argv[2])
    key = os.read(key_fd, 64)
    close(key_fd)
    lims = [int(a) for a in argv[3:8]]
    for lim, val in zip((resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE,
                         resource.RLIMIT_CPU, resource.RLIMIT_NOFILE), lims):
        if val >= 0:
            resource.setrlimit(lim, (val, val))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if argv[8] == "1":
        def no_net(event, args):
            if event.startswith("socket.") and event != "socket.gethostname":
                raise PermissionError("network access is disabled in the sandbox")
        sys.addaudithook(no_net)
    sys.argv = ["program.py"]
    g = {"__name__": "__candidate__", "__builtins__": builtins}
    sources = {}
    for stage in ("program", "checks"):  # both read before anything runs: the program may rewrite files
        with open(stage + ".py", encoding="utf-8") as f:
            sources[stage] = f.read()
    try:
        for stage in ("program", "checks"):
            exec(compile(sources[stage], stage + ".py", "exec"), g)
        verdict = key + b" passed"
    except BaseException as e:
        try:
            what = type(e).__name__
        except BaseException:
            what = "exception"
        verdict = ("failed %s in the %s" % (what, stage)).encode("ascii", "replace")
        try:
            traceback.print_exc()
        except BaseException:
            pass
    try:
        write(res_fd, verdict)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        exit_(0)
_viasd_driver(__import__("sys").argv)
"""

# Root stage of namespace mode, run by sh as PID 1 of the new namespaces: join the sample's
# cgroup, lower the IPC limits, mount private tmpfs over the world-writable directories,
# copy the program into /tmp/work, then run the driver as the fresh uid without
# capabilities. sh stays PID 1 (a program that kills itself must not be PID 1); when it
# exits, the kernel kills whatever is left. $1 uid, $2 tmpfs size, $3 IPC byte limit, $4
# cgroup.procs files (space separated, may be empty); the rest is the command.
STAGE = r"""
fail() { echo "viasd-sandbox-setup-failed: $*" >&2; exit 125; }
uid=$1; size=$2; ipc=$3; cgs=$4; shift 4
for f in $cgs; do echo 0 > "$f" || fail "join cgroup $f"; done
echo "$ipc" > /proc/sys/kernel/shmmax && echo $((ipc / 4096)) > /proc/sys/kernel/shmall &&
  echo 4 > /proc/sys/kernel/shmmni && echo 4 > /proc/sys/kernel/msgmni &&
  echo 4 > /proc/sys/fs/mqueue/queues_max || fail "IPC limits"
mount -t tmpfs -o "size=$size,mode=1777,nosuid,nodev" tmpfs /tmp || fail "mount /tmp"
for d in /var/tmp /run/lock /dev/shm; do
  if [ -d "$d" ]; then mount -t tmpfs -o "size=1m,mode=1777,nosuid,nodev" tmpfs "$d" || fail "mount $d"; fi
done
mkdir -m 700 /tmp/work && cp program.py checks.py /tmp/work/ && chown -R "$uid:$uid" /tmp/work ||
  fail "prepare /tmp/work"
cd /tmp/work || fail "cd /tmp/work"
unset OLDPWD
setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs \
  --inh-caps=-all --bounding-set=-all "$@"
exit $?
"""


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


def namespace_prefix(uid: int, tmpfs_mb: int, ipc_bytes: int, cgroup_procs: Sequence[str]) -> list[str]:
    """``unshare … sh -c STAGE`` for uid ``uid``: the command that precedes the driver in namespace mode."""
    return [
        "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--ipc", "--uts",
        "sh", "-c", STAGE, "viasd-sandbox", str(uid), f"{tmpfs_mb}m", str(ipc_bytes), " ".join(cgroup_procs),
    ]  # fmt: skip
