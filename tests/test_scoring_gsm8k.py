"""GSM8K answers read whole after their cue (issue 62.8): a fraction compares as a fraction, an
expression by its value, a clock time is no number; and the committed runs are scored by that rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from viasd.tasks.scoring import extract_answer_number, extract_gsm8k_gold, numbers_equal

RESULTS = Path(__file__).resolve().parents[1] / "results" / "runs"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("So, it will take 2/9 hours to fully charge the phone. The answer is 2/9.", "2/9"),  # not 2
        ("The answer is 1:30 pm.", None),  # a clock time, not 1
        ("The answer is 5 - 3 = 2", "2"),  # the result, not 5
        ("The answer is 150 - 10 = 140.", "140"),
        ("The answer is 3 x 4 dollars.", "12"),  # an expression by its value, units dropped
        ("The answer is 60 / 3 minutes", "20"),
        ("The answer is 1/8.", "0.125"),  # a terminating fraction reads as its decimal
        ("The answer is -(3 - 5).", "2"),
        ("The answer is (2/9)", "2/9"),
        ("The answer is \\boxed{\\frac{2}{9}}", "2/9"),
        ("#### 1/3", "1/3"),
        ("The answer is 18 (since 9 * 2 = 18).", "18"),
        ("The answer is 1,234,567.", "1234567"),  # thousands separators
        ("The answer is $1,234.50 in total.", "1234.5"),  # dollar sign, decimals, words after
        ("The answer is -7.", "-7"),  # negative, trailing period
        ("The answer is 0.6667 hours.", "0.6667"),  # decimal, unit
        ("The answer is 25%.", "25"),
        ("The answer is:\n\n42", "42"),  # the number on a later line
        ("The answer is 10/0.", "10"),  # no division by zero: the number before it
        ("The answer is that she keeps 18 eggs.", "18"),  # words before the number
        ("She has 2/9 left", "2/9"),  # no cue: the last number, a fraction whole
        ("The answer is 2" + "0" * 44 + ".", "2" + "0" * 44),
    ],
)
def test_the_answer_after_the_cue_is_read_whole(text, expected):
    assert extract_answer_number(text) == expected


def test_a_fraction_compares_as_a_fraction():
    assert not numbers_equal(extract_answer_number("The answer is 2/9."), "2")
    assert numbers_equal(extract_answer_number("The answer is 4/2."), "2")
    assert numbers_equal("1/2", "0.5") and numbers_equal("18", "18.00")
    assert not numbers_equal("1/3", "0.3333") and not numbers_equal("2/9", None)
    assert not numbers_equal(extract_answer_number("The answer is 1:30 pm."), "1")


def test_no_text_is_evaluated_beyond_arithmetic():
    """Names, calls and powers are words that end the answer, never code (nothing is eval()'d)."""
    assert extract_answer_number("The answer is 2 ** 100.") == "2"
    assert extract_answer_number("The answer is __import__('os').getpid()") is None
    assert extract_answer_number("The answer is " + "1 + " * 5000 + "1") is not None  # bounded, no recursion error


def test_committed_gsm8k_runs_are_scored_by_the_current_rule():
    """Every committed GSM8K run's per-example scores and accuracy are what the scorer gives its
    stored predictions now (problem 328, "The answer is 2/9." against gold 2, scores 0) — but for the run a
    DIMR search hashes as its calibration text (re-scoring it would change the search's run id)."""
    from viasd.tracking.rescore import inputs_of_other_runs

    runs = sorted(p for p in RESULTS.glob("*__gsm8k__*") if (p / "summary.json").is_file())
    inputs = inputs_of_other_runs(RESULTS, {p.name for p in runs})
    assert set(inputs) == {"qwen2.5-coder-0.5b-1.5b__ar__gsm8k__90651b7400"}  # DIMR calibration text: kept as scored
    for run in (p for p in runs if p.name not in inputs):
        summary = json.loads((run / "summary.json").read_text())
        if "metric/accuracy" not in summary:
            continue
        records = [json.loads(line) for line in (run / "examples.jsonl").read_text().splitlines() if line.strip()]
        scores = [100.0 * numbers_equal(extract_answer_number(r["prediction"]), extract_gsm8k_gold(str(r["reference"])))
                  for r in records]
        assert [r["score"]["accuracy"] for r in records] == scores, run.name
        assert summary["metric/accuracy"] == pytest.approx(sum(scores) / len(scores)), run.name


def _as_scored_before(run: Path, proofs: Path) -> None:
    """Put a copied run back in the state the old rule left it (328 credited), every checksum re-made."""
    import hashlib

    from viasd.tracking.proof import record_sha256

    lines = (run / "examples.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    recs = [json.loads(x) for x in lines]
    lines = [json.dumps({**r, "score": {"accuracy": 100.0}}, ensure_ascii=False) + "\n" if r["id"] == "328" else x
             for r, x in zip(recs, lines, strict=True)]
    data = "".join(lines).encode()
    (run / "examples.jsonl").write_bytes(data)
    meta = json.loads((run / "meta.json").read_text())
    meta.pop("rescored", None)
    (run / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    summary = json.loads((run / "summary.json").read_text())
    summary["metric/accuracy"] = 52.5
    summary["examples_sha256"] = hashlib.sha256(data).hexdigest()
    (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    proofs.write_text(json.dumps({run.name: record_sha256(summary, meta)}, indent=2) + "\n")


def test_rescoring_a_store_keeps_every_run_proven(tmp_path, capsys):
    """The re-scorer rewrites the score that moved, the summary's metric and every checksum (here the
    store's _proofs.json entry of a run older than record_sha256), records it in meta.json, is idempotent,
    and leaves a run that does not prove itself alone."""
    import shutil

    from experiments import rescore
    from viasd.tracking.proof import inspect

    name = "qwen2.5-coder-0.5b-1.5b__ar__gsm8k__941720fb08"
    store = tmp_path / "runs"
    shutil.copytree(RESULTS / name, store / name)
    _as_scored_before(store / name, store / "_proofs.json")
    assert inspect(store / name).finished
    before = (store / name / "examples.jsonl").read_bytes()
    assert rescore.main(["--store", str(store), "--dry-run"]) == 0
    assert "would re-score" in capsys.readouterr().out and (store / name / "examples.jsonl").read_bytes() == before
    assert rescore.main(["--store", str(store)]) == 0
    assert "accuracy 52.5 → 50 (328 100→0)" in capsys.readouterr().out
    verdict = inspect(store / name)
    assert verdict.finished, verdict.reason
    assert verdict.summary["metric/accuracy"] == 50.0
    meta = json.loads((store / name / "meta.json").read_text())
    assert meta["rescored"][-1]["changed"] == {"328": [100.0, 0.0]}
    after = [json.loads(x) for x in (store / name / "examples.jsonl").read_text().splitlines()]
    assert [r for r in after if r["score"] != {"accuracy": 0.0 if r["id"] == "328" else r["score"]["accuracy"]}] == []
    changed = [a != b for a, b in zip(before.splitlines(), (store / name / "examples.jsonl").read_bytes().splitlines())]
    assert sum(changed) == 1  # only the moved example's line is rewritten
    assert rescore.main(["--store", str(store)]) == 0 and "nothing to re-score" in capsys.readouterr().out
    # a run edited by hand (it does not prove itself) is never re-scored into a valid one
    _as_scored_before(store / name, store / "_proofs.json")
    (store / name / "summary.json").write_text((store / name / "summary.json").read_text().replace("52.5", "53.5"))
    assert not inspect(store / name).finished
    assert rescore.main(["--store", str(store)]) == 0 and "nothing to re-score" in capsys.readouterr().out


def test_a_run_other_runs_hash_is_left_as_scored(tmp_path, capsys):
    """A DIMR search hashes its calibration runs' examples.jsonl into its run id: such a run is listed, not
    rewritten (re-scoring it would change the search's id)."""
    import shutil

    import yaml

    from experiments import rescore

    name = "qwen2.5-coder-0.5b-1.5b__ar__gsm8k__941720fb08"
    store = tmp_path / "runs"
    shutil.copytree(RESULTS / name, store / name)
    _as_scored_before(store / name, store / "_proofs.json")
    search = store / "qwen2.5-coder-0.5b-1.5b__dimr_search__calibration__0123456789"
    search.mkdir()
    (search / "config.yaml").write_text(yaml.safe_dump({"inputs": {"search.calibration_runs": {name: "ab"}}}))
    before = {f.name: f.read_bytes() for f in (store / name).iterdir()}
    assert rescore.main(["--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert f"left as scored: {name} (the input of 1 runs" in out and "re-scored" not in out
    assert {f.name: f.read_bytes() for f in (store / name).iterdir()} == before
