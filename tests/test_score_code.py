"""``experiments.score_code``: pass@1 of sample files and finished runs, per-sample results with reasons.

Synthetic problem files only; the real HumanEval/MBPP checks are in test_code_scoring_data.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from experiments import score_code
from viasd.tasks import sandbox

needs_isolation = pytest.mark.skipif(
    sandbox._isolation()[0] is None, reason=f"sandbox isolation unavailable here ({sandbox._isolation()[1]})"
)

HE_PROBLEMS = [
    {"task_id": "T/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
     "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"},
    {"task_id": "T/1", "prompt": "def neg(x):\n", "canonical_solution": "    return -x\n",
     "test": "def check(candidate):\n    assert candidate(4) == -4\n", "entry_point": "neg"},
]  # fmt: skip
MBPP_PROBLEMS = [
    {"task_id": 11, "text": "Add two numbers.", "code": "def add(a, b):\n    return a + b",
     "test_list": ["assert add(2, 3) == 5", "assert add(0, 0) == 0"], "test_setup_code": "",
     "challenge_test_list": []},
]  # fmt: skip


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _results(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(str(path) + "_results.jsonl").read_text().splitlines()]


@needs_isolation
def test_humaneval_samples_file(tmp_path, capsys):
    problems = _jsonl(tmp_path / "problems.jsonl", HE_PROBLEMS)
    samples = _jsonl(tmp_path / "samples.jsonl", [
        {"task_id": "T/0", "completion": "    return a + b\n"},
        {"task_id": "T/0", "completion": "    return None\nimport os\nos._exit(0)\n"},
        {"task_id": "T/1", "completion": "    return -x\nif __name__ == '__main__':\n    raise SystemExit(1)\n"},
        {"task_id": "T/1", "completion": "    raise SystemExit(0)\n"},
    ])  # fmt: skip
    pass1 = score_code.main(["--task", "humaneval", "--samples", str(samples), "--problems", str(problems)])
    assert pass1 == pytest.approx(50.0)  # (1/2 + 1/2) / 2 tasks
    out = _results(samples)
    assert [r["passed"] for r in out] == [True, False, True, False]
    assert out[1]["result"] == "exited before the checks completed (exit status 0)"
    assert out[3]["result"] == "SystemExit in the checks"
    assert all(isinstance(r["passed"], bool) and r["result"] for r in out)
    assert "pass@1 = 50.00" in capsys.readouterr().out


@needs_isolation
def test_mbpp_samples_file(tmp_path):
    problems = _jsonl(tmp_path / "mbpp.jsonl", MBPP_PROBLEMS)
    samples = _jsonl(tmp_path / "s.jsonl", [
        {"task_id": 11, "completion": "def add(a, b):\n    return a + b\n"},
        {"task_id": 11, "completion": "def add(a, b):\n    return 0\nimport sys\nsys.exit(0)\n"},
    ])  # fmt: skip
    assert score_code.main(["--task", "mbpp", "--samples", str(samples), "--problems", str(problems)]) == 50.0
    assert [r["passed"] for r in _results(samples)] == [True, False]


@needs_isolation
def test_rescoring_a_finished_run(tmp_path):
    problems = _jsonl(tmp_path / "problems.jsonl", HE_PROBLEMS)
    run = tmp_path / "runs" / "pair__ar__humaneval__abc"
    run.mkdir(parents=True)
    task_cfg = {"name": "humaneval", "source": "offline", "offline_file": str(problems), "n_examples": 2}
    (run / "config.yaml").write_text(yaml.safe_dump({"task": task_cfg, "method": {"name": "ar"}}))
    _jsonl(run / "examples.jsonl", [
        {"id": "T/0", "prediction": "    return a + b", "score": {"pass@1": 100.0}},
        {"id": "T/1", "prediction": "    return x\nimport os\nos._exit(0)", "score": {"pass@1": 100.0}},
    ])  # fmt: skip
    assert score_code.main(["--samples", str(run)]) == 50.0
    out = _results(run / "examples.jsonl")
    assert [r["passed"] for r in out] == [True, False] and out[0]["id"] == "T/0"


def test_bad_input_is_one_line(tmp_path, capsys):
    problems = _jsonl(tmp_path / "problems.jsonl", HE_PROBLEMS)
    cases = [
        (["--task", "humaneval", "--samples", str(tmp_path / "missing.jsonl")], "samples file not found"),
        (["--samples", str(_jsonl(tmp_path / "a.jsonl", [{"task_id": "T/0", "completion": ""}]))], "--task"),
        (["--task", "humaneval", "--problems", str(problems),
          "--samples", str(_jsonl(tmp_path / "b.jsonl", [{"task_id": "X/9", "completion": ""}]))], "not in humaneval"),
        (["--task", "humaneval", "--samples", str(_jsonl(tmp_path / "c.jsonl", [{"completion": "x"}]))], "task_id"),
    ]  # fmt: skip
    for argv, needle in cases:
        with pytest.raises(SystemExit) as e:
            score_code.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
