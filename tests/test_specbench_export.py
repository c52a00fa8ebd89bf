"""``experiments.store export RUN --format specbench``: Spec-Bench's answer files from viasd runs.

Spec-Bench's speed metric (``evaluation/speed.py``: the mean over questions of per-question tokens/s,
its ratio to the baseline file's, the mean accept length over all steps), recomputed here from the
exported files, equals the harness's own numbers; ``task=specbench`` reports its six task groups.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.store import main as store_main
from tests.helpers.app import run_app
from viasd.errors import ConfigError
from viasd.tracking.specbench import GROUPS, answers, group_rows


def specbench_speed(path, base_path):
    """Spec-Bench's speed metric, as its evaluation script computes it over two answer files (the
    baseline's tokens taken from its new_tokens instead of re-tokenizing its text)."""
    data = [json.loads(line) for line in open(path)]
    speeds = [sum(d["choices"][0]["new_tokens"]) / sum(d["choices"][0]["wall_time"]) for d in data]
    accept = [a for d in data for a in d["choices"][0]["accept_lengths"]]
    base = [json.loads(line) for line in open(base_path)]
    speeds0 = [sum(d["choices"][0]["new_tokens"]) / sum(d["choices"][0]["wall_time"]) for d in base]
    return np.mean(speeds), np.mean(speeds0), np.mean(speeds) / np.mean(speeds0), np.mean(accept)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, synthetic_data_dir):
    root = tmp_path_factory.mktemp("specbench_runs")
    r = run_app("-m", "pair=tiny-llama", "task=specbench", "method=ar,sd", "generation.max_new_tokens=6",
                runs=root, data=synthetic_data_dir, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return root, synthetic_data_dir


def _export(root, data, monkeypatch, capsys, *args):
    """``python -m experiments.store export ARGS`` in this process → (exit status, stdout, stderr)."""
    monkeypatch.setenv("VIASD_RUNS_DIR", str(root))
    monkeypatch.setenv("VIASD_DATA_DIR", str(data))
    try:
        code = store_main(["export", *args])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_exported_files_give_the_harness_numbers(runs, tmp_path, monkeypatch, capsys):
    root, data = runs
    out = tmp_path / "sd.jsonl"
    code, stdout, stderr = _export(root, data, monkeypatch, capsys, "tiny-llama__sd", "--format", "specbench",
                                   "--out", str(out), "--baseline", "tiny-llama__ar")
    assert code == 0, stderr
    for group in GROUPS:  # task=specbench: one row per Spec-Bench task group, then overall
        assert f"| {group} " in stdout
    base = tmp_path / "sd.baseline.jsonl"
    tps, tps0, speedup, accept = specbench_speed(out, base)
    (sd,) = root.glob("tiny-llama__sd__*")
    (ar,) = root.glob("tiny-llama__ar__*")
    recs = [json.loads(line) for line in (sd / "examples.jsonl").read_text().splitlines()]
    base_recs = [json.loads(line) for line in (ar / "examples.jsonl").read_text().splitlines()]
    summary = json.loads((sd / "summary.json").read_text())
    assert tps == pytest.approx(np.mean([e["tokens_per_s"] for e in recs]))
    assert tps0 == pytest.approx(np.mean([e["tokens_per_s"] for e in base_recs]))
    assert speedup == pytest.approx(tps / tps0)
    assert accept == pytest.approx(summary["mean_accepted"])  # the harness's tokens per round
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == summary["n_examples"]
    assert all(set(line["choices"][0]) >= {"turns", "new_tokens", "wall_time", "accept_lengths", "decoding_steps"}
               for line in lines)
    assert {line["category"] for line in lines} <= {c for cats in GROUPS.values() for c in cats}
    overall = group_rows(lines, [json.loads(x) for x in base.read_text().splitlines()])[-1]
    assert overall["speedup"] == pytest.approx(speedup) and overall["mean_accepted"] == pytest.approx(accept)


def test_untimed_or_missing_runs_are_one_line(runs, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="has no timing for 1 of its 1 examples"):
        answers("r", [{"id": "1", "new_tokens": 3, "rounds": 2}], None, "prompts")
    root, data = runs
    code, _, stderr = _export(root, data, monkeypatch, capsys, "no_such_run", "--format", "specbench")
    err = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(err) == 1 and "no finished run 'no_such_run'" in err[0], stderr


def test_runs_without_recorded_accept_lengths_keep_the_exact_mean():
    (line,) = answers("r", [{"id": "7", "new_tokens": 10, "rounds": 4, "wall_s": 0.5, "raw_output": "x"}], None, "gsm8k")
    choice = line["choices"][0]
    assert choice["accept_lengths"] == [3, 3, 2, 2] and choice["accept_lengths_exact"] is False
    assert line["category"] == "gsm8k" and line["question_id"] == 7
