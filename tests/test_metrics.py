"""Metric modules against known values, offline loading, and HumanEval pass@1 end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import sacrebleu

from tests.conftest import REAL_DATA_DIR
from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT
from viasd.tasks import sandbox
from viasd.tasks.metrics import available_metrics, load_metric
from viasd.tasks.scoring import (
    extract_answer_number,
    extract_gsm8k_gold,
    normalize_answer,
    numbers_equal,
    qa_exact_match,
    qa_f1,
    split_sentences,
)

needs_sandbox = pytest.mark.skipif(
    sandbox._isolation()[0] is None, reason=f"sandbox isolation unavailable here ({sandbox._isolation()[1]})"
)
ALL = ("bleu", "code_pass_at_1", "gsm8k_accuracy", "rouge", "squad_qa")


def test_metric_modules_are_shipped_and_unknown_names_suggest():
    assert set(ALL) <= set(available_metrics())
    with pytest.raises(ConfigError, match="Did you mean 'rouge'"):
        load_metric("rouge_")


def test_metrics_load_by_path_fully_offline(tmp_path):
    """A fresh interpreter with the hub switched off and a dead proxy loads and runs all five."""
    code = textwrap.dedent(
        """
        import json
        from viasd.tasks.metrics import load_metric
        out = {
            "rouge": load_metric("rouge").compute(predictions=["a b c"], references=["a b c"]),
            "bleu": load_metric("bleu").compute(predictions=["a b c d"], references=["a b c d"]),
            "gsm8k_accuracy": load_metric("gsm8k_accuracy").compute(predictions=["7"], references=["#### 7"]),
            "squad_qa": load_metric("squad_qa").compute(predictions=["x"], references=[["x"]]),
            "code_pass_at_1": load_metric("code_pass_at_1").compute(
                predictions=["def f():\\n    return 1"], references=["assert f() == 1"]),
        }
        print("RESULT" + json.dumps(out))
        """
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_EVALUATE_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HF_HOME": str(tmp_path / "hf"),  # empty caches: nothing pre-downloaded to lean on
        "VIASD_UNSAFE_EXEC": "1",  # a trivial program; lets this offline-loading test run where the sandbox cannot
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    out = json.loads(line[len("RESULT") :])
    assert out["rouge"]["rouge1"] == pytest.approx(100)
    assert out["bleu"]["bleu"] == pytest.approx(100)
    assert out["gsm8k_accuracy"]["accuracy"] == 100
    assert out["squad_qa"]["exact_match"] == 100
    assert out["code_pass_at_1"]["pass@1"] == 100


# --- ROUGE ---------------------------------------------------------------------------


def test_rouge_identical_is_100():
    text = "The cat sat on the mat. It was happy! Dr. Smith agreed."
    out = load_metric("rouge").compute(predictions=[text], references=[text])
    for k in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert out[k] == pytest.approx(100.0)


def test_rouge_hand_checked_pair():
    # pred: the cat sat on the mat / ref: a dog sat on the mat (6 tokens each)
    # unigrams in common: the, sat, on, mat = 4 → P = R = 4/6 → F = 66.67
    # bigrams: "sat on", "on the", "the mat" = 3 of 5 → 60
    # LCS: "sat on the mat" = 4 → 66.67
    out = load_metric("rouge").compute(
        predictions=["the cat sat on the mat"], references=["a dog sat on the mat"]
    )
    assert out["rouge1"] == pytest.approx(200 / 3)
    assert out["rouge2"] == pytest.approx(60.0)
    assert out["rougeL"] == pytest.approx(200 / 3)


def test_rouge_lsum_splits_sentences_without_nltk():
    # Swapped sentences: the LCS over the whole text covers one sentence, the summary-level
    # LCS (Lsum) matches both, so Lsum must be 100 while L is not.
    pred = "The storm closed the harbour. Fishermen stayed at home."
    ref = "Fishermen stayed at home. The storm closed the harbour."
    out = load_metric("rouge").compute(predictions=[pred], references=[ref])
    assert out["rougeLsum"] == pytest.approx(100.0)
    assert out["rougeL"] < 80


def test_rouge_stemming_multi_reference_and_per_example():
    out = load_metric("rouge").compute(
        predictions=["the runners were running", "x y"],
        references=[["the runner runs", "the runners were running"], ["a b"]],
        per_example=True,
    )
    assert out["per_example"][0]["rouge1"] == pytest.approx(100.0)
    assert out["per_example"][1]["rouge1"] == 0.0
    assert out["rouge1"] == pytest.approx(50.0)
    stem = load_metric("rouge").compute(predictions=["running"], references=["runs"])
    assert stem["rouge1"] == pytest.approx(100.0)  # Porter stems "running" and "runs" to "run"


def test_split_sentences():
    text = 'Mr. Smith went to Washington. He said "Hi!" Then he left.\nThe U.S. Army was there. J. Doe agreed'
    assert split_sentences(text) == [
        "Mr. Smith went to Washington.",
        'He said "Hi!"',
        "Then he left.",
        "The U.S. Army was there.",
        "J. Doe agreed",
    ]
    assert split_sentences("") == []


# --- BLEU / chrF ---------------------------------------------------------------------


def test_bleu_identical_is_100():
    refs = ["The quick brown fox jumps over the lazy dog.", "Gutach: Increased safety for pedestrians"]
    out = load_metric("bleu").compute(predictions=refs, references=refs)
    assert out["bleu"] == pytest.approx(100.0)
    assert out["chrf"] == pytest.approx(100.0)


def test_bleu_hand_checked_pair():
    # n-gram precisions 5/6, 3/5, 2/4, 1/3; equal lengths so BP = 1:
    # BLEU = (5/6 * 3/5 * 1/2 * 1/3) ** (1/4) = (1/12) ** 0.25
    out = load_metric("bleu").compute(
        predictions=["the cat sat on the mat"], references=["the cat sat on a mat"]
    )
    assert out["bleu"] == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-9)
    assert out["bp"] == 1.0


def test_bleu_equals_sacrebleu_corpus():
    hyps = [
        "The parliament approved the new budget on Tuesday.",
        "Police say the driver was not injured",
        "Prices rose by three percent last year .",
        "He did not want to comment on it.",
        "completely unrelated words here",
    ]
    refs_a = [
        "Parliament approved the new budget on Tuesday.",
        "According to police, the driver was unhurt.",
        "Prices went up by 3 percent last year.",
        "He did not wish to comment.",
        "The weather will be sunny tomorrow.",
    ]
    refs_b = [
        "On Tuesday the parliament passed the new budget.",
        "The police said the driver was not injured.",
        "Last year prices rose three percent.",
        "He declined to comment on it.",
        "Tomorrow it will be sunny.",
    ]
    metric = load_metric("bleu")
    single = metric.compute(predictions=hyps, references=refs_a, per_example=True)
    assert single["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs_a]).score, abs=1e-9)
    assert single["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs_a]).score, abs=1e-9)
    assert single["per_example"][0]["bleu"] == pytest.approx(
        sacrebleu.sentence_bleu(hyps[0], [refs_a[0]]).score
    )
    multi = metric.compute(predictions=hyps, references=[[a, b] for a, b in zip(refs_a, refs_b, strict=True)])
    assert multi["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs_a, refs_b]).score, abs=1e-9)
    assert 0 < single["bleu"] < multi["bleu"] < 100


# --- GSM8K ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("So she makes 9 * 2 = $18 every day.\n#### 18", "18"),
        ("The answer is 1,234.", "1234"),  # thousands separator, trailing period
        ("It costs $1,234.50 in total.", "1234.5"),  # dollar sign, decimals
        ("The answer is $18.00", "18"),  # 18.00 == 18
        ("The temperature fell to -7 degrees. The answer is -7.", "-7"),  # negative
        ("The answer is −12", "-12"),  # unicode minus
        ("The answer is 42 apples. Later, 43 were eaten on day 2.", "42"),  # trailing text with numbers
        ("First 3 + 4 = 7, then 7 * 2 = 14 cookies.", "14"),  # no cue: last number
        ("The final answer is \\boxed{72}.", "72"),
        ("The answer is: 0.5", "0.5"),
        ("I cannot tell.", None),
        ("The answer is 2" + "0" * 44, "2" + "0" * 44),  # past Decimal's 28 digits: no InvalidOperation
    ],
)
def test_gsm8k_extraction(text, expected):
    assert extract_answer_number(text) == expected


def test_gsm8k_gold_and_numeric_equality():
    assert extract_gsm8k_gold("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\n#### 1,000") == "1000"
    assert extract_gsm8k_gold("18") == "18"
    assert numbers_equal("3.50", "3.5") and numbers_equal("18", "18.0")
    assert not numbers_equal("18", None) and not numbers_equal("18", "-18")


def test_gsm8k_accuracy_metric():
    out = load_metric("gsm8k_accuracy").compute(
        predictions=["... The answer is $1,000.", "The answer is 17.", "no idea", "#### -3"],
        references=["blah\n#### 1000", "#### 18", "#### 5", "#### -3"],
        per_example=True,
    )
    assert out["accuracy"] == pytest.approx(50.0)
    assert [r["accuracy"] for r in out["per_example"]] == [100.0, 0.0, 0.0, 100.0]
    assert out["extracted"] == ["1000", "17", None, "-3"]


# --- QA exact match / F1 -------------------------------------------------------------


def test_squad_normalization():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("U.S.") == "us"
    assert normalize_answer("Theater") == "theater"  # "the" only as a whole word


@pytest.mark.parametrize(
    "pred, refs, em, f1",
    [
        ("The Eiffel Tower!", ["eiffel tower"], 1.0, 1.0),
        ("a cat", ["the cat"], 1.0, 1.0),
        ("Denver Broncos win", ["Denver Broncos"], 0.0, 0.8),  # P = 2/3, R = 1
        ("Broncos", ["Denver Broncos", "Broncos"], 1.0, 1.0),  # best reference counts
        ("Carolina Panthers", ["Denver Broncos"], 0.0, 0.0),
        ("", ["Denver"], 0.0, 0.0),
        ("February 7, 2016", ["February 7, 2016", "February 7"], 1.0, 1.0),
    ],
)
def test_exact_match_and_f1(pred, refs, em, f1):
    assert qa_exact_match(pred, refs) == em
    assert qa_f1(pred, refs) == pytest.approx(f1)


def test_squad_qa_metric():
    out = load_metric("squad_qa").compute(
        predictions=["Denver Broncos win", "Paris"],
        references=[["Denver Broncos"], ["paris", "Paris, France"]],
    )
    assert out["exact_match"] == pytest.approx(50.0)
    assert out["f1"] == pytest.approx(90.0)


# --- pass@1 --------------------------------------------------------------------------


@needs_sandbox
def test_code_pass_at_1_metric_small():
    out = load_metric("code_pass_at_1").compute(
        predictions=[
            "def add(a, b):\n    return a + b",
            "def add(a, b):\n    return a - b",
            "def add(a, b):\n",
        ],
        references=["assert add(2, 3) == 5"] * 3,
        per_example=True,
    )
    assert out["pass@1"] == pytest.approx(100 / 3)
    assert [r["status"] for r in out["results"]] == ["passed", "failed", "failed"]


@needs_sandbox
def test_humaneval_canonical_solutions_all_pass_and_wrong_fails(any_data):
    from viasd.tasks import build_task

    task = build_task({"name": "humaneval", "n_examples": None})
    examples = task.examples()
    assert len(examples) == (164 if any_data == REAL_DATA_DIR else 12)
    corpus, per = task.score([e.meta["canonical_solution"] for e in examples], examples)
    failing = [e.id for e, p in zip(examples, per, strict=True) if p["pass@1"] != 100.0]
    assert failing == [] and corpus["pass@1"] == 100.0
    wrong = ["    return None\n", "    raise NotImplementedError\n", "    while True:\n        pass\n"]
    quick = build_task({"name": "humaneval", "timeout_s": 2.0})
    corpus, per = quick.score(wrong, examples[:3])
    assert corpus["pass@1"] == 0.0
    assert math.isclose(sum(p["pass@1"] for p in per), 0.0)
