"""Quality by metric (viasd.report.quality): every metric of a text task, paired against ar."""

from __future__ import annotations

import json

import pytest
import sacrebleu
from hydra import compose, initialize_config_dir

from viasd.analysis.corpus import corpus_delta
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.report.quality import TASK_METRICS, metric_header, metric_table
from viasd.report.shared import write_shared
from viasd.tracking.store import RunStore

PREDS = ["the cat sat on the mat today"] * 6 + ["a dog ran in the park quickly"] * 6
REFS = ["the cat sat on the mat"] * 6 + ["the dog ran in the park"] * 6
AR = ["the cat sat on a mat today"] * 6 + ["a dog ran in the park"] * 6


@pytest.mark.parametrize("name", ["bleu", "chrf"])
def test_a_corpus_metric_is_sacrebleus_corpus_score_and_its_interval_is_of_the_paired_difference(name):
    corpus = sacrebleu.corpus_bleu if name == "bleu" else sacrebleu.corpus_chrf
    run, ar, d = corpus_delta(name, PREDS, AR, REFS)
    assert run == pytest.approx(corpus(PREDS, [REFS]).score) and ar == pytest.approx(corpus(AR, [REFS]).score)
    assert d.estimate == pytest.approx(run - ar) and d.lo <= d.estimate <= d.hi and d.n == len(PREDS)
    assert 0 < d.p <= 1 and d.test == "paired bootstrap"
    same = corpus_delta(name, AR, AR, REFS)[2]  # identical outputs: no difference, p = 1
    assert (same.estimate, same.lo, same.hi, same.p) == (0.0, 0.0, 0.0, 1.0)


def _runs(scores_run, scores_ar):
    ex = lambda scores: [{"id": str(i), "score": s, "prediction": "x", "reference": "y"} for i, s in enumerate(scores)]
    run = {"run_id": "r", "summary": {"method": "via_sd"}, "examples": ex(scores_run)}
    ar = {"run_id": "a", "summary": {"method": "ar"}, "examples": ex(scores_ar)}
    return run, ar


def test_mean_metrics_are_paired_per_example_with_mcnemar_for_exact_match():
    run, ar = _runs([{"exact_match": 100.0, "f1": 100.0}, {"exact_match": 0.0, "f1": 50.0}, {"exact_match": 0.0, "f1": 0.0}],
                    [{"exact_match": 100.0, "f1": 100.0}, {"exact_match": 100.0, "f1": 100.0}, {"exact_match": 0.0, "f1": 0.0}])
    rows = metric_table("nq_open", [ar, run], ar, {"r": "via_sd_fast"})
    assert [r[0] for r in rows] == ["ar", "via_sd_fast"] and rows[1][2] == 3
    assert len(metric_header("nq_open")) == len(rows[0]) == 3 + len(TASK_METRICS["nq_open"])
    assert rows[0][3].startswith("66.67 (66.67) +0.00") and rows[0][3].endswith("p=1")
    assert rows[1][3].startswith("33.33 (66.67) -33.33") and rows[1][4].startswith("50.00 (66.67) -16.67 [")
    assert metric_table("humaneval", [ar, run], ar, {}) == []  # one metric: the main table has it


def test_a_text_tasks_compared_table_has_its_quality_by_metric_beside_it(runs_dir, synthetic_data, tmp_path):
    base = ["pair=tiny-llama", "task=xsum", "task.n_examples=3", "generation.max_new_tokens=6"]
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        ar, via = (run(compose(config_name="config", overrides=[*base, f"method={m}"])) for m in ("ar", "via_sd"))
    paths = write_shared(tmp_path / "o", "shared", "compared", RunStore(runs_dir), ar["run_id"], [via["run_id"]])
    md = (tmp_path / "o" / "shared_metrics.md").read_text()
    assert str(tmp_path / "o" / "shared_metrics.md") in paths
    assert all(f"{m}: run (ar)" in md for m in TASK_METRICS["xsum"]) and via["run_id"] in md
    assert json.loads((tmp_path / "o" / "shared_metrics.sources.json").read_text())["runs"] == [ar["run_id"], via["run_id"]]


def test_a_compared_tables_bleu_is_the_corpus_score_not_the_mean_of_sentence_scores(tmp_path):
    from viasd.analysis.paired import compare_to_ar

    def run(method, preds):
        examples = [{"id": str(i), "prediction": p, "reference": r, "token_ids": [i], "new_tokens": 5, "wall_s": 1.0,
                     "score": {"bleu": sacrebleu.sentence_bleu(p, [r]).score}} for i, (p, r) in enumerate(zip(preds, REFS))]
        return {"run_id": method, "summary": {"method": method, "task": "wmt14_deen", "pair": "none"}, "meta": {},
                "examples": examples}

    short = REFS[:6] + ["dog"] * 6  # half the outputs one word: corpus BLEU (one brevity penalty) != mean sentence BLEU
    via, ar = run("via_sd", short), run("ar", AR)
    cmp = compare_to_ar(RunStore(tmp_path), via, ar)
    assert cmp["metric"] == "bleu" and cmp["quality"].test == "paired bootstrap"
    assert cmp["quality_mean"] == pytest.approx(sacrebleu.corpus_bleu(short, [REFS]).score)
    assert cmp["ar_quality_mean"] == pytest.approx(sacrebleu.corpus_bleu(AR, [REFS]).score)
    sentence_mean = sum(e["score"]["bleu"] for e in via["examples"]) / len(short)
    assert abs(cmp["quality_mean"] - sentence_mean) > 1  # the two differ here: the table shows the corpus one
