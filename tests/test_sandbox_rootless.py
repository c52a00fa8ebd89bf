"""The rootless isolation level, for real: the scorer runs as a user who is not root.

When the tests run as root, the scorer runs in a child process as ``nobody`` (``setpriv
--reuid=65534``, nothing on the host changed), with an interpreter and site-packages that user
can read; when they run as another user, the child is that user. Each check skips with the reason
where that is impossible (no setpriv, no interpreter nobody can read) or where the machine has no
unprivileged user namespaces (e.g. a CI container): then the non-root scorer refuses, which
test_sandbox_fail_closed.py covers. The five attacks of issue 46 are the reproducers of
test_sandbox_attacks.py; run unsandboxed by the same user, the host-file one works, which shows
it is the rootless level that stops it (unsandboxed, the audit hook already stops sockets).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.helpers.synthetic_data import write_synthetic_data
from tests.test_sandbox_attacks import (
    ABS_CHECKS,
    ABS_SWAP,
    CHECKS,
    KERNEL,
    READ_CHECKS,
    READ_HOST,
    RIGHT,
    TRACE_SWAP,
    WRONG,
    listening_socket,
)
from viasd.paths import PROJECT_ROOT, data_dir
from viasd.report.shared import shared_header, shared_table
from viasd.tracking.store import RunStore

NOBODY = 65534

# Run in the unprivileged child: JSON {"programs": [[code, checks], ...], "unsafe": bool} on stdin →
# JSON {"uid", "level", "results": [[status, reason, detail], ...]} (or {"uid", "refused"}) on stdout.
# "unsafe": the control, as if this machine had no isolation and the user waived it.
RUNNER = """
import json, os, sys
from viasd.errors import ConfigError
from viasd.tasks import sandbox
job = json.load(sys.stdin)
if job["unsafe"]:
    sandbox._isolation = lambda: (None, "the test's unsandboxed control")
try:
    level = sandbox.isolation_level(job["unsafe"])
    res = sandbox.run_programs([c for c, _ in job["programs"]], [k for _, k in job["programs"]], workers=2,
                               unsafe=job["unsafe"])
    out = {"level": level, "results": [[r.status, r.reason, r.detail] for r in res]}
except ConfigError as e:
    out = {"refused": str(e)}
print(json.dumps({"uid": os.geteuid(), **out}))
"""


def _pythonpath() -> str:
    """The repository and this interpreter's site-packages, for a child on another interpreter."""
    paths = [str(PROJECT_ROOT), *site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    return os.pathsep.join(dict.fromkeys(paths))


# The child imports the sandbox and can start its own interpreter again (as that user, not only via setpriv).
PROBE = "import subprocess, sys, viasd.tasks.sandbox\nsubprocess.run([sys.executable, '-c', ''], check=True)\n"


def _unprivileged() -> tuple[list[str], dict[str, str]] | str:
    """``(command prefix, environment)`` that runs Python as a user who is not root, or why not."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONPATH": _pythonpath()}  # fmt: skip
    if os.geteuid() != 0:
        return [sys.executable], env
    if not shutil.which("setpriv"):
        return "running as root without util-linux setpriv to become nobody"
    for py in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", py]
        probe = subprocess.run([*cmd, "-c", PROBE], env=env, cwd="/", capture_output=True, timeout=120)
        if probe.returncode == 0:
            return cmd, env
    return "no interpreter with the project's dependencies is readable by nobody"


_HOW = _unprivileged()
pytestmark = pytest.mark.skipif(isinstance(_HOW, str), reason=str(_HOW))


def as_user(*argv: str, stdin: str = "", cwd: str = "/", **env: str) -> subprocess.CompletedProcess:
    """Run ``python argv…`` as the unprivileged user (``env``: added to its environment)."""
    cmd, base = _HOW
    return subprocess.run([*cmd, *argv], input=stdin, env={**base, **env}, cwd=cwd, capture_output=True,
                          text=True, timeout=1800)  # fmt: skip


def score_as_user(programs: list[tuple[str, str]], unsafe: bool = False) -> dict:
    """Score ``programs`` (code, checks) in the unprivileged child; skips where it cannot isolate."""
    proc = as_user("-c", RUNNER, stdin=json.dumps({"programs": programs, "unsafe": unsafe}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["uid"] != 0
    if "refused" in out:
        pytest.skip(f"no rootless isolation for a non-root user here: {out['refused']}")
    return out


@pytest.fixture
def shared_dir():
    """A folder of the host every user can read and write (pytest's own are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="viasd-rootless-test-"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# Without a cgroup delegated to the user a sample may not fork (RLIMIT_NPROC 1): say so instead of failing.
NO_FORK_OK = (
    "import subprocess\n_run = subprocess.run\n"
    "def run(*a, **k):\n    try:\n        return _run(*a, **k)\n"
    "    except BlockingIOError:\n        return type('R', (), {'returncode': 'no fork', 'stdout': ''})()\n"
    "subprocess.run = run\n"
)


def test_a_non_root_scorer_runs_at_the_rootless_level_without_capabilities():
    keys = "print('keys:', repr(open('/proc/keys').read() + open('/proc/key-users').read()))\n"
    ipc = ("import errno\ntry:\n    open('/proc/sys/kernel/shmmni', 'w').write('4096')\n"
           "except OSError as e:\n    print('shmmni:', errno.errorcode[e.errno])\n")  # fmt: skip
    out = score_as_user([(RIGHT, CHECKS), (WRONG, CHECKS), (NO_FORK_OK + KERNEL, ""), (keys + ipc, "")])
    assert out["level"] == "rootless namespaces"
    (right, _, _), (wrong, reason, _), (kernel, _, detail), (_, _, seen) = out["results"]
    assert seen.split() == ["keys:", "''", "shmmni:", "EROFS"], seen  # the caller's keys are hidden, and the
    # IPC limits, which root of the sample's user namespace owns, cannot be raised
    assert (right, wrong, reason) == ("passed", "failed", "AssertionError in the checks"), out
    assert kernel == "passed", detail
    got = dict(ln.split(" = ", 1) for ln in detail.splitlines() if " = " in ln)
    for name in ("unshare", "clone", "setns", "mount", "ptrace", "bpf", "request_key", "dumpable"):
        assert got.get(name) == "EPERM", (name, detail)
    assert got.get("unshare -Urm") in ("1 False", "no fork False"), detail  # no user namespace inside either
    status = dict(ln.split(":", 1) for ln in detail.splitlines() if ln.startswith(("Cap", "NoNewPrivs", "Seccomp:")))
    assert {k: v.strip() for k, v in status.items()} == {
        "CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16, "CapAmb": "0" * 16,
        "NoNewPrivs": "1", "Seccomp": "2"}, detail  # fmt: skip


def test_the_five_attacks_fail_rootless_and_the_host_ones_work_unsandboxed(shared_dir):
    dataset = shared_dir / "humaneval.py"
    dataset.write_text(RIGHT)
    dataset.chmod(0o644)
    run = Path("/run") if os.access("/run", os.W_OK) else shared_dir  # where real hosts keep their sockets
    with listening_socket(run) as (sock_path, srv):
        connect = (f"import os, socket\nprint('socket visible:', os.path.exists({str(sock_path)!r}))\n"
                   "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                   f"s.connect({str(sock_path)!r})\n" + RIGHT)  # fmt: skip
        attacks = {
            "read the checks": (READ_CHECKS, CHECKS + "# CHECKS-MARKER-5\n"),
            "host files": (f"PATHS = {[str(dataset), '/work', '/root', '/home', '/etc']!r}\n" + WRONG + READ_HOST,
                           CHECKS),
            "trace hook": (TRACE_SWAP, CHECKS),
            "gc finds abs": (ABS_SWAP, ABS_CHECKS),
            "unix socket": (connect, CHECKS),
        }
        rootless = score_as_user(list(attacks.values()))
        reasons = dict(zip(attacks, ((s, r) for s, r, _ in rootless["results"])))
        assert reasons == {
            "read the checks": ("failed", "AssertionError in the checks"),
            "host files": ("failed", "FileNotFoundError in the program"),
            "trace hook": ("failed", "AssertionError in the checks"),
            "gc finds abs": ("failed", "AssertionError in the checks"),
            "unix socket": ("failed", "PermissionError in the program"),
        }, rootless["results"]
        assert "socket visible: False" in rootless["results"][-1][2], rootless["results"][-1]
        with pytest.raises(BlockingIOError):
            srv.accept()
        unsafe = score_as_user([attacks["host files"]], unsafe=True)
        assert unsafe["level"] == "unsafe"
        assert unsafe["results"][0][0] == "passed", unsafe["results"]  # the attack is real for this user


def test_score_code_as_non_root_scores_canonical_100_and_wrong_0_and_names_the_level(shared_dir):
    data = write_synthetic_data(shared_dir / "data")
    for p in [data, *data.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    problems = data / "code/HumanEval.jsonl"
    rows = [json.loads(line) for line in problems.read_text().splitlines()]
    for name, completion, want in (("canonical", None, "100.00"), ("wrong", "    return None\n", "0.00")):
        samples = shared_dir / f"{name}.jsonl"
        samples.write_text("".join(json.dumps({"task_id": r["task_id"],
                                               "completion": completion or r["canonical_solution"]}) + "\n"
                                   for r in rows))  # fmt: skip
        proc = as_user("-m", "experiments.score_code", "--task", "humaneval", "--samples", str(samples), "--problems", str(problems),
                       cwd=str(PROJECT_ROOT), VIASD_CACHE_DIR=str(shared_dir / "cache"))  # fmt: skip
        if proc.returncode == 2 and "refusing to execute generated code" in proc.stderr:
            pytest.skip(f"no rootless isolation for a non-root user here: {proc.stderr.strip()}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"pass@1 = {want} (humaneval: " in proc.stdout, proc.stdout
        assert "isolation: rootless namespaces" in proc.stdout, proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(data_dir(required=False) is None, reason="offline data folder not found (set VIASD_DATA_DIR)")
@pytest.mark.parametrize(("task", "n"), [("humaneval", 164), ("mbpp", 500)])
def test_real_canonical_solutions_pass_rootless(task, n, shared_dir):
    """Every canonical solution (164 HumanEval, 500 MBPP test split) passes when a non-root user scores it."""
    code = (
        "import sys\nfrom experiments.score_code import score_samples\nfrom viasd.tasks import build_task, sandbox\n"
        "task = build_task({'name': sys.argv[1], 'n_examples': None})\n"
        "rows = [{'task_id': e.id, 'completion': e.meta['canonical_solution']} for e in task.examples()]\n"
        "pass1, out = score_samples(task, rows, workers=4, timeout_s=60)\n"
        "print(len(rows), pass1, sandbox.isolation_level(), [r['task_id'] for r in out if not r['passed']])\n"
    )
    proc = as_user("-c", code, task, cwd=str(PROJECT_ROOT), VIASD_DATA_DIR=str(data_dir()),
                   VIASD_CACHE_DIR=str(shared_dir / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"{n} 100.0 rootless namespaces []", proc.stdout


def test_a_run_by_a_non_root_user_records_the_rootless_level(shared_dir):
    """A code task's run (the tiny random pair: its completions are wrong, pass@1 0) made by the
    non-root user records ``rootless namespaces`` in its sealed meta, and the table shows it."""
    data = write_synthetic_data(shared_dir / "data")
    for p in [data, *data.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    runs = shared_dir / "runs"
    proc = as_user("-m", "experiments.run", "pair=tiny-llama", "method=ar", "task=humaneval", "task.n_examples=2",
                   "generation.max_new_tokens=4", cwd=str(PROJECT_ROOT), VIASD_DATA_DIR=str(data),
                   VIASD_CACHE_DIR=str(shared_dir / "cache"), VIASD_RUNS_DIR=str(runs), WANDB_MODE="disabled",
                   HF_HUB_OFFLINE="1")  # fmt: skip
    if proc.returncode == 2 and "refusing to execute generated code" in proc.stderr:
        pytest.skip(f"no rootless isolation for a non-root user here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = runs.iterdir()
    assert json.loads((folder / "meta.json").read_text())["isolation"] == "rootless namespaces"
    assert json.loads((folder / "summary.json").read_text())["metric/pass@1"] == 0.0
    rows, _, _ = shared_table(RunStore(runs), folder.name, [])  # the run proves itself, meta included
    assert shared_header(rows)[-1] == "code isolation" and rows[0][-1] == "rootless namespaces"
