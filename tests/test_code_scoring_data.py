"""Real HumanEval/MBPP through the project's scoring path: references pass, spoofed successes score 0.

Needs the offline data folder (VIASD_DATA_DIR) and working sandbox isolation; skips otherwise.
"""

from __future__ import annotations

import pytest

from experiments.score_code import score_samples
from viasd.paths import data_dir
from viasd.tasks import build_task, sandbox

pytestmark = [
    pytest.mark.skipif(
        data_dir(required=False) is None, reason="offline data folder not found (set VIASD_DATA_DIR)"
    ),
    pytest.mark.skipif(
        sandbox._isolation()[0] is None,
        reason=f"sandbox isolation unavailable here ({sandbox._isolation()[1]})",
    ),
]
WORKERS = 4  # sandboxed runs wait on the kernel (namespaces, cgroups) more than they compute

# Each spoof follows a wrong body ("return None"), as a model's completion would.
SPOOFS = [
    "import os\nos._exit(0)",
    "import sys\nsys.exit(0)",
    "raise SystemExit",
    "exit()",
    "quit()",
    "import sys\nsys.exit(256)",
    "import atexit, os\natexit.register(os._exit, 0)",
    "import sys, os\nsys.excepthook = lambda *a: os._exit(0)",
    'import sys\nif __name__ == "__main__":\n    sys.exit(0)',
]


def test_humaneval_canonical_solutions_pass_164_of_164():
    task = build_task({"name": "humaneval"})
    rows = [{"task_id": e.id, "completion": e.meta["canonical_solution"]} for e in task.examples()]
    assert len(rows) == 164
    pass1, out = score_samples(task, rows, workers=WORKERS)
    assert [(r["task_id"], r["status"], r["result"]) for r in out if not r["passed"]] == [] and pass1 == 100.0


def test_mbpp_reference_solutions_pass():
    task = build_task({"name": "mbpp", "n_examples": None})  # task_id 11-510
    rows = [{"task_id": e.id, "completion": e.meta["canonical_solution"]} for e in task.examples()]
    assert len(rows) == 500
    # Task 123's reference takes seconds of pure Python: a generous timeout for a loaded machine.
    pass1, out = score_samples(task, rows, workers=WORKERS, timeout_s=60)
    assert [(r["task_id"], r["result"]) for r in out if not r["passed"]] == [] and pass1 == 100.0


@pytest.mark.parametrize("form", ["completion", "chat"])
def test_humaneval_spoofed_exits_score_zero(form):
    task = build_task({"name": "humaneval", "n_examples": 2, "timeout_s": 5.0})
    examples = task.examples()
    preds, exs = [], []
    for e in examples:
        for spoof in SPOOFS + ["raise SystemExit(0)"]:
            body = (
                "    return None\n" + spoof + "\n"
                if spoof != "raise SystemExit(0)"
                else "    raise SystemExit(0)\n"
            )
            if form == "chat":  # the whole function in a fenced block, as chat models reply
                body = f"Here you go:\n```python\n{e.meta['code_prompt']}{body}```\n"
            preds.append(task.postprocess(body))
            exs.append(e)
    corpus, per = task.score(preds, exs)
    assert corpus["pass@1"] == 0.0 and all(p["pass@1"] == 0.0 for p in per)


def test_mbpp_spoofed_exits_score_zero():
    task = build_task({"name": "mbpp", "n_examples": 2, "timeout_s": 5.0})
    examples = task.examples()
    preds = []
    for e in examples:
        name = e.reference.split("assert ", 1)[1].split("(", 1)[0].strip()
        preds += [f"def {name}(*args):\n    return None\n{spoof}\n" for spoof in SPOOFS]
    exs = [e for e in examples for _ in SPOOFS]
    corpus, _ = task.score(preds, exs)
    assert corpus["pass@1"] == 0.0
