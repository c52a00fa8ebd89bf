"""Without full isolation, executing generated code is refused unless explicitly waived.

Runs on any machine: the unavailability is simulated.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from experiments import score_code
from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT
from viasd.tasks import build_task, loading, sandbox
from viasd.tasks.base import Example
from viasd.tasks.sandbox import isolation as sandbox_levels
from viasd.tasks.sandbox import kernel as sandbox_kernel
from viasd.tasks.sandbox import rpc as sandbox_rpc
from viasd.tasks.sandbox import run_program, run_programs

RIGHT = "def add(a, b):\n    return a + b\n"
WRONG_EXIT = "def add(a, b):\n    return None\nimport os\nos._exit(0)\n"
CHECKS = "def check(f):\n    assert f(2, 3) == 5\n\ncheck(add)\n"
UNSAFE = "VIASD_UNSAFE_EXEC=1"


@pytest.fixture
def no_isolation(monkeypatch):
    """Simulate a machine where the namespaces cannot be created."""
    monkeypatch.setattr(sandbox, "_isolation", lambda: (None, "simulated: no CAP_SYS_ADMIN"))
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)


def test_unavailable_isolation_refuses_without_opt_in(no_isolation):
    with pytest.raises(ConfigError, match="VIASD_UNSAFE_EXEC=1") as e:
        run_programs([RIGHT], [CHECKS])
    assert "\n" not in str(e.value) and "simulated: no CAP_SYS_ADMIN" in str(e.value)
    with pytest.raises(ConfigError, match="unsafe_exec"):
        run_program(RIGHT, CHECKS)


def test_opt_in_runs_with_a_warning_per_call(no_isolation, monkeypatch, caplog):
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    for _ in range(2):
        with caplog.at_level(logging.WARNING, logger="viasd.tasks.sandbox"):
            results = run_programs([RIGHT, WRONG_EXIT], [CHECKS] * 2, workers=1)
        assert [r.status for r in results] == ["passed", "failed"]
        assert sum("WITHOUT the sandbox" in m for m in caplog.messages) == 1
        caplog.clear()
    monkeypatch.delenv(sandbox.UNSAFE_ENV)
    assert run_programs([RIGHT], [CHECKS], unsafe=True)[0].passed  # the config value opts in too


def test_code_task_refuses_before_generation(no_isolation):
    task = build_task({"name": "humaneval"})
    with pytest.raises(ConfigError, match="VIASD_UNSAFE_EXEC"):
        task.preflight()
    ex = Example(id="t/0", prompt="", reference=CHECKS, meta={"code_prompt": ""})
    with pytest.raises(ConfigError, match="VIASD_UNSAFE_EXEC"):
        task.score([RIGHT], [ex])
    build_task({"name": "humaneval", "unsafe_exec": True}).preflight()  # waived: no error


def test_root_without_cap_sys_admin_refuses_for_real(tmp_path):
    """End to end: score_code under root minus CAP_SYS_ADMIN exits 2 with one line naming the opt-in."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or sandbox._isolation()[0] is None:
        pytest.skip("needs root, setpriv and a working sandbox to take CAP_SYS_ADMIN away from")
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps({"task_id": "T/0", "prompt": "def add(a, b):\n", "canonical_solution": "",
                                    "test": "def check(c):\n    assert c(2, 3) == 5\n", "entry_point": "add"}) + "\n")  # fmt: skip
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"task_id": "T/0", "completion": "    return a + b\n"}) + "\n")
    cmd = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-m",
           "experiments.score_code", "--task", "humaneval", "--samples", str(samples), "--problems", str(problems)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != sandbox.UNSAFE_ENV}
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "VIASD_UNSAFE_EXEC=1" in lines[0], proc.stderr[-2000:]
    assert not Path(str(samples) + "_results.jsonl").exists()


NO_USERNS = "unprivileged user namespaces are disabled (simulated)"


@pytest.fixture
def not_root(monkeypatch):
    """Simulate a harness that does not run as root on a machine without unprivileged user namespaces
    (the probes are cached per process: reset them)."""
    monkeypatch.setattr(sandbox, "_is_root", lambda: False)
    monkeypatch.setattr(sandbox, "userns_unavailable", lambda: NO_USERNS)
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    monkeypatch.delenv("VIASD_SANDBOX_PYTHON", raising=False)
    sandbox._isolation.cache_clear()
    sandbox._unsafe_plan.cache_clear()
    yield
    sandbox._isolation.cache_clear()
    sandbox._unsafe_plan.cache_clear()


def test_not_root_refuses_then_runs_as_the_calling_user_when_waived(not_root):
    """Not root, no user namespaces: no isolation; waived, programs run unsandboxed as this user."""
    assert sandbox._isolation() == (None, f"not running as root, and {NO_USERNS}")
    with pytest.raises(ConfigError, match=r"sandbox is unavailable \(not running as root, and unprivileged user "
                                          r"namespaces are disabled \(simulated\)\).*user namespaces") as e:
        sandbox.require_isolation()
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="VIASD_UNSAFE_EXEC=1"):
        run_program(RIGHT, CHECKS)
    assert sandbox.sandbox_mode(unsafe=True) == "unsafe" and not sandbox.drops_privileges(unsafe=True)
    assert sandbox.isolation_level(unsafe=True) == "unsafe"
    assert sandbox.sandbox_python(unsafe=True) == sys.executable
    r = run_program("import os\nprint(os.getuid())", unsafe=True)
    assert r.passed and r.detail.strip().splitlines()[-1] == str(os.getuid()), r
    assert [r.status for r in run_programs([RIGHT, WRONG_EXIT], [CHECKS] * 2, workers=1, unsafe=True)] == [
        "passed", "failed"]


def test_not_root_refuses_before_reading_the_problems(not_root, tmp_path, monkeypatch, capsys):
    """A root-made datasets cache this user cannot write must not come before the one-line refusal."""
    def unwritable_cache() -> str:
        raise PermissionError(13, "Permission denied", "/tmp/viasd-datasets-cache")

    monkeypatch.setattr(loading, "_datasets_cache_dir", unwritable_cache)
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps({"task_id": "T/0", "prompt": "def add(a, b):\n", "canonical_solution": "",
                                    "test": "def check(c):\n    assert c(2, 3) == 5\n", "entry_point": "add"}) + "\n")  # fmt: skip
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"task_id": "T/0", "completion": "    return a + b\n"}) + "\n")
    with pytest.raises(SystemExit) as e:
        score_code.main(["--task", "humaneval", "--samples", str(samples), "--problems", str(problems)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "not running as root" in err and UNSAFE in err, err


@pytest.fixture
def fresh_probe():
    """Let a test re-probe the isolation (cached per process) and leave the real answer behind."""
    sandbox._isolation.cache_clear()
    yield
    sandbox._isolation.cache_clear()


def test_missing_libseccomp_refuses(monkeypatch, fresh_probe):
    monkeypatch.setattr(sandbox_kernel, "pyseccomp", None)
    assert "pip install pyseccomp" in sandbox_kernel.seccomp_unavailable()
    monkeypatch.setattr(sandbox, "_is_root", lambda: True)
    monkeypatch.setattr(sandbox.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    py, why = sandbox._isolation()
    assert py is None and why.startswith("libseccomp is unavailable"), why


def test_a_failing_self_test_refuses(monkeypatch):
    if sandbox._isolation()[0] is None:
        pytest.skip("needs a working sandbox whose self-test can be made to fail")
    monkeypatch.setattr(sandbox, "_SELF_TEST", "raise SystemExit(3)")
    sandbox._isolation.cache_clear()
    try:
        assert sandbox._isolation() == (
            None, "the sandbox's self-test did not pass (failed: SystemExit in the program)")  # fmt: skip
    finally:
        sandbox._isolation.cache_clear()


@pytest.fixture
def fresh_userns_probe():
    sandbox_levels.userns_unavailable.cache_clear()
    yield
    sandbox_levels.userns_unavailable.cache_clear()


def test_disabled_user_namespaces_are_named(tmp_path, monkeypatch, fresh_userns_probe):
    off = tmp_path / "max_user_namespaces"
    off.write_text("0\n")
    monkeypatch.setattr(sandbox_levels, "_SYSCTLS", ((str(off), "user.max_user_namespaces = 0"),))
    assert sandbox_levels.userns_unavailable() == (
        "unprivileged user namespaces are disabled (user.max_user_namespaces = 0)")  # fmt: skip


def test_a_failing_user_namespace_probe_names_apparmor(tmp_path, monkeypatch, fresh_userns_probe):
    apparmor = tmp_path / "apparmor_restrict_unprivileged_userns"
    apparmor.write_text("1\n")
    monkeypatch.setattr(sandbox_levels, "_SYSCTLS", ())
    monkeypatch.setattr(sandbox_levels, "_APPARMOR", str(apparmor))
    monkeypatch.setattr(sandbox_levels, "USERNS_PROBE",
                        ["sh", "-c", "echo 'unshare: write failed /proc/self/uid_map: Operation not permitted' >&2; "
                                     "exit 1"])  # fmt: skip
    why = sandbox_levels.userns_unavailable()
    assert why.startswith("creating an unprivileged user namespace failed: unshare: write failed") and \
        "kernel.apparmor_restrict_unprivileged_userns = 1" in why, why


def test_not_root_with_user_namespaces_chooses_the_rootless_level(monkeypatch):
    """The choice only (the rootless level for real, as nobody: test_sandbox_rootless.py)."""
    if shutil.which("unshare") is None or sandbox_levels.userns_unavailable():
        pytest.skip("no unprivileged user namespaces here")
    monkeypatch.setattr(sandbox, "_is_root", lambda: False)
    sandbox._isolation.cache_clear()
    try:
        plan, why = sandbox._isolation()
        assert why == "" and plan.mode == "rootless" and plan.level == "rootless namespaces" and not plan.drop_uid
    finally:
        sandbox._isolation.cache_clear()


# --- the machine's hiccups are not the program's failures --------------------------------------------


def test_a_sample_the_sandbox_could_not_run_is_run_again(monkeypatch, caplog):
    calls: dict[str, int] = {}

    def fake(code, checks, *a, **kw):
        calls[code] = calls.get(code, 0) + 1
        if code == "broken" or (code == "flaky" and calls[code] == 1):
            return sandbox.SandboxResult(False, "error", "SystemError: a harness thread's hiccup", "", 0.0)
        return sandbox.SandboxResult(code != "wrong", "passed" if code != "wrong" else "failed", "", "", 0.0)

    monkeypatch.setattr(sandbox, "run_program", fake)
    with caplog.at_level(logging.WARNING, logger=sandbox.log.name):
        out = run_programs(["ok", "flaky", "wrong", "broken"], workers=2, unsafe=True)
    assert [r.status for r in out] == ["passed", "passed", "failed", "error"]
    assert calls == {"ok": 1, "flaky": 2, "wrong": 1, "broken": 1 + sandbox.ERROR_RETRIES}  # a failure is final
    assert "could not run 2 of 4 samples" in caplog.text


def test_the_harness_parses_programs_from_many_threads_without_a_systemerror():
    # python/cpython#106905: a collection inside ast.parse that runs a finalizer which yields the GIL let a
    # second thread's parse corrupt the first's recursion depth (1 SystemError in 160 parses without the lock)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    code = Path(sandbox.__file__).read_text()
    errors: list[str] = []

    class Finalized:
        def __init__(self):
            self.me = self  # a cycle: freed by the collector, mid-parse

        def __del__(self):
            time.sleep(0)

    def work():
        for _ in range(40):
            try:
                [Finalized() for _ in range(50)]
                sandbox_rpc.builtin_shadows(code)
            except SystemError as e:
                errors.append(str(e))

    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
