"""Issue 62 item 1: a program cannot make the scorer import, evaluate or call anything by a name it
supplies, and nothing the checks raise (``SystemExit``, ``KeyboardInterrupt``, …) ends the scorer: it is
that sample's failure.

The payload that broke it: a completion ending ``import types; add = types.ModuleType("venv.__main__")``
was answered to the checks as ``("module", "venv.__main__")`` and imported in the scorer, which ran
venv's command line on the scorer's own ``sys.argv``. The first tests drive :func:`run_checks` with a
scripted program (no sandbox needed); the rest go through the sandbox, ``experiments.score_code`` and a
run. Every test runs in an empty working directory with a harmless ``sys.argv``, so a regression shows
as a failure, not as venvs made in the checkout.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.tasks import sandbox
from viasd.tasks.base import Task
from viasd.tasks.families.coding import HumanEvalTask
from viasd.tasks.sandbox.rpc import CHECK_MODULES, run_checks

needs_isolation = pytest.mark.skipif(
    sandbox._isolation()[0] is None, reason=f"sandbox isolation unavailable here ({sandbox._isolation()[1]})"
)

CHECKS = "def check(candidate):\n    assert candidate(2, 3) == 5\n\ncheck(add)\n"
NAME_ERROR = "NameError in the checks"
# Modules whose import has side effects (venv's and unittest's __main__ run a command line, antigravity
# opens a browser, this prints), the scorer's own __main__, nested names, and modules no check needs.
# (Not ensurepip.__main__ nor idlelib.idle: a regression would install pip into this venv or start IDLE.)
EVIL = ["venv.__main__", "venv", "unittest.__main__", "turtledemo.__main__", "antigravity", "this",
        "__main__", "json.tool", "os.path", "xml.dom.minidom", "os", "subprocess", "importlib",
        "builtins"]  # fmt: skip
INPUTS = {"samples.jsonl", "problems.jsonl", "samples.jsonl_results.jsonl"}  # what the score_code test writes


@pytest.fixture(autouse=True)
def work(tmp_path, monkeypatch):
    """An empty working directory and an argv that names nothing there (a module's command line, if one
    ran by mistake, would act on these and leave a trace the test sees)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["scorer-under-test"])
    yield cwd
    assert {p.name for p in cwd.iterdir()} - INPUTS == set()


class Scripted:
    """A program behind a link that answers every look-up from ``answers`` (name → reply) and every call
    with ``("ok", 5)``; it records what the checks asked for."""

    def __init__(self, answers: dict[str, tuple]) -> None:
        self.answers, self.asked = answers, []

    def call(self, request: tuple):
        self.asked.append(request)
        if request[0] == "look":
            return self.answers.get(request[1], ("missing",))
        return ("ok", 5)


def _new_modules(name: str, before: set[str]) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))} & (set(sys.modules) - before)


@pytest.mark.parametrize("name", EVIL)
def test_a_module_the_program_names_is_never_imported(name):
    before = set(sys.modules)
    # as the entry point (the payload) and under its own name, looked up by the checks
    link = Scripted({"add": ("module", name), name.split(".")[0]: ("module", name)})
    assert run_checks(link, CHECKS)[:2] == ("failed", NAME_ERROR)
    top = name.split(".")[0]
    if top.isidentifier():
        status, reason, _ = run_checks(link, f"{top}\n")
        assert (status, reason) == ("failed", NAME_ERROR)
    assert _new_modules(name, before) == set()


def test_an_allowed_module_resolves_only_under_its_own_name():
    # MBPP 596's checks call sys.getsizeof after the program's `import sys`; HumanEval/MBPP need no other
    assert "sys" in CHECK_MODULES and "math" in CHECK_MODULES and "os" not in CHECK_MODULES
    assert all(m.__name__ in sys.stdlib_module_names for m in CHECK_MODULES.values())
    ok = Scripted({"math": ("module", "math"), "add": ("call",)})
    checks = "assert math.isclose(math.pi, 3.1416, rel_tol=1e-4)\nassert add(2, 3) == 5\n"
    assert run_checks(ok, checks)[:2] == ("passed", "the checks ran to completion")
    for answers in ({"math": ("module", "os")},  # `import os as math`: not the checks' math
                    {"math": ["module", "math"]},  # not the driver's reply (a tuple)
                    {"math": ("module", "math", "extra")},
                    {"math": ("module", 7)}):  # fmt: skip
        assert run_checks(Scripted(answers), "math.pi\n")[:2] == ("failed", NAME_ERROR), answers


@pytest.mark.parametrize("raise_", ["raise SystemExit(0)", "raise SystemExit(2)", "import sys\nsys.exit()",
                                    "raise KeyboardInterrupt", "raise GeneratorExit",
                                    "class Own(BaseException):\n    pass\nraise Own"])  # fmt: skip
def test_whatever_the_checks_raise_is_the_samples_failure(raise_):
    status, reason, trace = run_checks(Scripted({}), raise_ + "\n")
    name = raise_.split("raise ")[-1].split("(")[0] if "raise" in raise_ else "SystemExit"
    assert (status, reason) == ("failed", f"{name} in the checks") and name in trace


def _payload(module: str) -> str:
    """A wrong solution that rebinds every function of the program to a module named ``module``."""
    return ("def add(a, b):\n    return 0\nimport types\n"
            "for _k in [k for k, v in list(globals().items()) if callable(v) and not k.startswith('_')]:\n"
            f"    globals()[_k] = types.ModuleType({module!r})\n")  # fmt: skip


@needs_isolation
def test_the_sandbox_scores_the_payloads_as_failures():
    names = ["venv.__main__", "antigravity", "this", "__main__", "unittest.__main__", "xml.dom.minidom",
             "math"]  # fmt: skip
    before = set(sys.modules)
    results = sandbox.run_programs([_payload(n) for n in names], [CHECKS] * len(names), workers=2)
    assert [(r.status, r.reason) for r in results] == [("failed", NAME_ERROR)] * len(names), results
    assert set().union(*(_new_modules(n, before) for n in names)) == set()
    r = sandbox.run_program("def add(a, b):\n    return a + b\n", CHECKS + "raise SystemExit(0)\n")
    assert (r.status, r.reason) == ("failed", "SystemExit in the checks"), r


@needs_isolation
def test_score_code_reports_the_sample_as_failed_and_finishes(work):
    """The issue's reproduction: `experiments.score_code` exited 2 with no results file."""
    problem = {"task_id": "T/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
               "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
               "entry_point": "add"}  # fmt: skip
    (work / "problems.jsonl").write_text(json.dumps(problem) + "\n")
    payload = '    return a + b\nimport types\nadd = types.ModuleType("{}")\n'
    rows = [{"task_id": "T/0", "completion": "    return a + b\n"},
            {"task_id": "T/0", "completion": payload.format("venv.__main__")},
            {"task_id": "T/0", "completion": payload.format("antigravity")}]  # fmt: skip
    (work / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "experiments.score_code", "--task", "humaneval", "--samples",
           "samples.jsonl", "--problems", "problems.jsonl", "--workers", "2"]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT), "HOME": str(work.parent)}
    out = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    res = [json.loads(x) for x in (work / "samples.jsonl_results.jsonl").read_text().splitlines()]
    assert [(r["passed"], r["result"]) for r in res] == [
        (True, "the checks ran to completion"), (False, NAME_ERROR), (False, NAME_ERROR)]
    assert "pass@1 = 33.33" in out.stdout and "usage: venv" not in out.stderr


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@needs_isolation
def test_a_run_scores_the_payload_as_failed_and_finishes(runs_dir, synthetic_data, monkeypatch):
    """Under `experiments.run` the payload made venvs in the working directory and ended the run with
    status 0, unfinished: here whatever the model writes is the payload (every function of the program
    rebound to a module named venv.__main__)."""
    body = "    return None\n" + _payload("venv.__main__").split("return 0\n", 1)[1]
    monkeypatch.setattr(HumanEvalTask, "postprocess", lambda self, text: body)
    s = run(_cfg("pair=tiny-llama", "method=ar", "task=humaneval", "task.n_examples=2",
                 "generation.max_new_tokens=2"))
    assert s["metric/pass@1"] == 0.0 and s["n_examples"] == 2
    assert (runs_dir / s["run_id"] / "summary.json").is_file()
    rows = [json.loads(x) for x in (runs_dir / s["run_id"] / "examples.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows] == [body, body] and all(r["score"]["pass@1"] == 0.0 for r in rows)


def test_a_run_that_meets_sys_exit_does_not_end_with_its_status(runs_dir, monkeypatch):
    """Defence in depth: whatever calls sys.exit during a run (a scorer, a library) leaves it unfinished and
    raises an error, never a SystemExit whose status 0 would report an unfinished run as a success."""

    def exits(self, predictions, examples):
        raise SystemExit(0)

    monkeypatch.setattr(Task, "score", exits)
    with pytest.raises(RuntimeError, match=r"sys\.exit\(0\) was called during the run; .* is unfinished"):
        run(_cfg("pair=tiny-llama", "method=ar", "task.n_examples=1", "generation.max_new_tokens=2"))
    (folder,) = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))]
    assert (folder / "examples.jsonl").is_file() and not (folder / "summary.json").exists()
