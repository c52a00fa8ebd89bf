"""The sandbox's cost: canonical HumanEval samples scored at each isolation level this process can run.

This module owns ``python -m experiments.bench --sandbox``'s measurement (the code sandbox is
:mod:`viasd.tasks.sandbox`). For a few fixed canonical HumanEval samples (the first
``n_samples`` problems of the offline file; synthetic ones in the same shape when the data folder
is absent) it times, per level this process runs (``root namespaces`` as root, ``rootless
namespaces`` as another user; ``unsafe``, the floor), each sample alone (``reps`` rounds, levels interleaved per sample so machine load hits
all alike) and the whole set with ``workers`` at a time (samples/s). Two floors name what
dominates: the interpreter's start-up (``python -I -c pass``) and, per namespace level, the
namespaces and minimal root without the interpreter (the root stage ending in ``true``).
The orderings these numbers are expected to show (a namespace level costs more than the unsafe
floor; its floor is below a whole sample) are checked here, by the measurement (:func:`orderings`,
printed and written with the rows), never by a timed unit test.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from viasd.errors import ConfigError
from viasd.paths import data_dir
from viasd.tasks.sandbox import levels, remove_tree, run_program, run_programs
from viasd.tasks.sandbox.isolation import ROOT, ROOTLESS, UNSAFE, Plan
from viasd.tasks.sandbox.proc import free_uid, take_uid
from viasd.tasks.sandbox.scripts import minimal_env, namespace_prefix

__all__ = ["COLUMNS", "bench_samples", "orderings", "sandbox_bench"]

# Synthetic canonical samples in HumanEval's shape (prompt + canonical solution; test + check call).
SYNTHETIC = [
    ("has_close_elements",
     "def has_close_elements(numbers, threshold):\n    return any(abs(a - b) < threshold\n"
     "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n",
     "def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3)\n"
     "    assert not candidate([1.0, 2.0, 3.0], 0.5)\n    assert candidate([1.0, 1.05], 0.1)\n"
     "    assert not candidate([], 1.0)\n\ncheck(has_close_elements)\n"),
    ("below_zero",
     "def below_zero(operations):\n    balance = 0\n    for op in operations:\n        balance += op\n"
     "        if balance < 0:\n            return True\n    return False\n",
     "def check(candidate):\n    assert candidate([]) is False\n    assert candidate([1, 2, -4, 5]) is True\n"
     "    assert candidate([1, -1, 2, -2]) is False\n\ncheck(below_zero)\n"),
    ("separate_paren_groups",
     "def separate_paren_groups(s):\n    out, cur, depth = [], '', 0\n    for c in s.replace(' ', ''):\n"
     "        cur += c\n        depth += {'(': 1, ')': -1}[c]\n        if depth == 0:\n"
     "            out.append(cur)\n            cur = ''\n    return out\n",
     "def check(candidate):\n    assert candidate('(()) ()') == ['(())', '()']\n"
     "    assert candidate('') == []\n\ncheck(separate_paren_groups)\n"),
    ("intersperse",
     "def intersperse(numbers, delimeter):\n    out = []\n    for n in numbers:\n"
     "        out += [n, delimeter]\n    return out[:-1]\n",
     "def check(candidate):\n    assert candidate([], 7) == []\n    assert candidate([5, 6, 3, 2], 8) == "
     "[5, 8, 6, 8, 3, 8, 2]\n\ncheck(intersperse)\n"),
]  # fmt: skip

COLUMNS = [("level", "{}"), ("samples", "{}"), ("median_ms", "{:.1f}"), ("min_ms", "{:.1f}"),
           ("samples_per_s", "{:.2f}"), ("x_unsafe", "{:.2f}"), ("x_root", "{:.2f}"), ("floor_ms", "{:.1f}"),
           ("cgroup", "{}")]  # fmt: skip


def bench_samples(n: int) -> tuple[list[tuple[str, str, str]], str]:
    """``([(name, program, checks)], source)``: the first ``n`` canonical HumanEval samples of the
    offline file (``source`` its path), else ``n`` synthetic ones (``source`` ``"synthetic"``)."""
    from viasd.tasks import build_task

    if data_dir(required=False) is not None:
        try:
            task = build_task({"name": "humaneval", "n_examples": None})
            exs = task.examples()[:n]
            progs = task.metric_predictions([e.meta["canonical_solution"] for e in exs], exs)
            checks = task.metric_references(exs)
            return [(e.id, p, c) for e, p, c in zip(exs, progs, checks)], str(task.cfg["offline_file"])
        except ConfigError:
            pass
    return [SYNTHETIC[i % len(SYNTHETIC)] for i in range(n)], "synthetic"


def _stage_floor(plan: Plan, reps: int) -> float:
    """Median seconds of the namespaces and the minimal root alone (the stage runs ``true``)."""
    times = []
    for _ in range(reps):
        workdir = tempfile.mkdtemp(prefix="viasd-sbx-bench-")
        uid = take_uid() if plan.drop_uid else None
        try:
            Path(workdir, "program.py").write_text("")
            cmd = namespace_prefix(2, uid, 16, 1 << 20, [], plan.python) + ["true"]
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=workdir, env=minimal_env(workdir), stdin=subprocess.DEVNULL,
                           capture_output=True, check=True)  # fmt: skip
            times.append(time.perf_counter() - t0)
        finally:
            free_uid(uid)
            remove_tree(workdir)
    return statistics.median(times)


def _interpreter_floor(python: str, reps: int) -> float:
    """Median seconds of ``python -I -c pass``."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([python, "-I", "-c", "pass"], check=True, env=minimal_env(tempfile.gettempdir()))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sandbox_bench(n_samples: int = 6, reps: int = 3, workers: int = 2) -> tuple[list[dict[str, Any]], dict]:
    """Rows (:data:`COLUMNS`, one per level, plus the interpreter floor) and meta of the sandbox bench.

    ``median_ms``/``min_ms``: one sample alone, over ``n_samples × reps`` runs; ``samples_per_s``:
    the set run ``workers`` at a time, best of ``reps``; ``x_unsafe``/``x_root``: the median's
    ratio to the unsafe floor's and to root namespaces'; ``floor_ms``: the level's namespaces and
    minimal root without an interpreter; ``cgroup``: whether samples got a per-sample cgroup.
    Raises ConfigError when a canonical sample does not pass (the timing would not be of scoring).
    """
    samples, source = bench_samples(n_samples)
    plans = levels()
    alone: dict[str, list[float]] = {name: [] for name in plans}
    cgroup: dict[str, bool] = {}
    for _ in range(reps):
        for name, prog, checks in samples:
            for level, plan in plans.items():  # interleaved: load drift hits every level alike
                r = run_program(prog, checks, plan=plan)
                if not r.passed:
                    raise ConfigError(f"canonical sample {name} did not pass at level {level} ({r.status}: "
                                      f"{r.reason}); the sandbox bench times passing samples only")
                alone[level].append(r.seconds)
                cgroup[level] = r.peak_memory_mb is not None
    rate = {}
    for level, plan in plans.items():
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            run_programs([p for _, p, _ in samples], [c for _, _, c in samples], workers=workers, plan=plan)
            best = min(best, time.perf_counter() - t0)
        rate[level] = len(samples) / best
    med = {level: statistics.median(ts) for level, ts in alone.items()}
    rows = [{"level": level, "samples": len(alone[level]), "median_ms": med[level] * 1e3,
             "min_ms": min(alone[level]) * 1e3, "samples_per_s": rate[level],
             "x_unsafe": med[level] / med[UNSAFE], "x_root": med[level] / med[ROOT] if ROOT in med else float("nan"),
             "floor_ms": _stage_floor(plan, reps) * 1e3 if plan.namespaces else float("nan"),
             "cgroup": "yes" if cgroup[level] else "no (rlimits)"}
            for level, plan in plans.items()]  # fmt: skip
    py = plans[UNSAFE].python
    rows.append({"level": f"interpreter start ({os.path.basename(py)} -I -c pass)", "samples": reps,
                 "median_ms": _interpreter_floor(py, reps) * 1e3})
    meta = {"source": source, "n_samples": len(samples), "reps": reps, "workers": workers,
            "uid": os.geteuid(), "python": {level: p.python for level, p in plans.items()},
            "load_avg": os.getloadavg(), "orderings": orderings(rows)}  # fmt: skip
    return rows, meta


def orderings(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """What the measurement is expected to show, each statement → whether these ``rows`` show it:
    per namespace level, that it costs more than the unsafe floor (``x_unsafe > 1``) and that its
    floor (namespaces and minimal root, no interpreter) is below a whole sample (``floor_ms <
    median_ms``). A ``False`` on a loaded machine says to measure again, not that scoring is wrong."""
    out = {}
    for row in rows:
        if row["level"] in (ROOT, ROOTLESS):
            out[f"{row['level']} costs more than unsafe"] = bool(row["x_unsafe"] > 1.0)
            out[f"{row['level']} floor below a sample"] = bool(0 < row["floor_ms"] < row["median_ms"])
    return out
