"""`experiments.compare`: runs against one ar run on the examples they share (nested subsets)."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from experiments import compare
from viasd.analysis.paired import interim_scores, load_unfinished
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.report.common import ISOLATION, NOT_RECORDED
from viasd.report.shared import HEADER, shared_header, shared_table, write_shared
from viasd.tasks import sandbox
from viasd.tracking.proof import record_sha256
from viasd.tracking.store import RunStore

BASE = ["pair=tiny-llama", "task=prompts", "generation.max_new_tokens=6"]


def _run(*overrides):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return run(compose(config_name="config", overrides=[*BASE, *overrides]))


def test_sd_on_a_nested_subset_is_compared_with_ar_on_the_same_examples(runs_dir, tmp_path):
    ar = _run("method=ar", "task.n_examples=4")
    sd = _run("method=sd", "task.n_examples=2")
    ngram = _run("method=sd_ngram", "task.n_examples=3")
    rows, runs, note = shared_table(RunStore(runs_dir), ar["run_id"], [sd["run_id"], ngram["run_id"]])
    assert [r[0] for r in rows] == ["ar", "sd", "sd_ngram"] and [r[2] for r in rows] == [4, 2, 3]
    same = HEADER.index("examples == ar tokens")
    assert rows[1][same] == "2/2" and rows[2][same] == "3/3"  # lossless: every shared example has ar's tokens
    ar_examples = {e["id"]: e for e in RunStore(runs_dir).examples(ar["run_id"])}
    sd_examples = RunStore(runs_dir).examples(sd["run_id"])
    # process CPU seconds per example, and the speedup in them beside the wall-clock one
    assert all(e["cpu_s"] > 0 for e in [*sd_examples, *ar_examples.values()])
    cpu = rows[1][HEADER.index("CPU-time speedup [95% CI]")]
    ar_cpu = sum(ar_examples[e["id"]]["new_tokens"] for e in sd_examples) / sum(
        ar_examples[e["id"]]["cpu_s"] for e in sd_examples)
    assert cpu.startswith(f"{sum(e['new_tokens'] for e in sd_examples) / sum(e['cpu_s'] for e in sd_examples) / ar_cpu:.2f} [")
    ar_rate = sum(ar_examples[e["id"]]["new_tokens"] for e in sd_examples) / sum(
        ar_examples[e["id"]]["wall_s"] for e in sd_examples)
    sd_rate = sum(e["new_tokens"] for e in sd_examples) / sum(e["wall_s"] for e in sd_examples)
    assert abs(rows[1][5] - sd_rate / ar_rate) < 1e-9 and rows[0][5] == 1.0
    # rejection rate = Σ rejected / Σ drafted and target calls per token, each with its interval
    rejected, drafted = (sum(e[k] for e in sd_examples) for k in ("rejected", "drafted"))
    assert rows[1][HEADER.index("rejection rate [95% CI]")].startswith(f"{rejected / drafted:.3f} [")
    calls = sum(e["target_calls"] for e in sd_examples) / sum(e["new_tokens"] for e in sd_examples)
    assert rows[1][HEADER.index("target calls / token [95% CI]")].startswith(f"{calls:.3f} [")
    assert rows[0][HEADER.index("rejection rate [95% CI]")] == "–"  # ar drafts nothing
    assert ar["run_id"] in note
    assert compare.main(["--ar", ar["run_id"], sd["run_id"], "--runs-dir", str(runs_dir), "--out", str(tmp_path / "o"),
                         "--scale", "smoke"]) == 0
    src = json.loads((tmp_path / "o" / "shared.sources.json").read_text())
    assert set(src["baselines"].values()) == {ar["run_id"]}
    assert "(smoke scale)" in (tmp_path / "o" / "shared.md").read_text()


def test_another_workload_or_a_non_ar_baseline_is_one_clear_error(runs_dir, capsys):
    ar = _run("method=ar", "task.n_examples=2")
    longer = _run("method=sd", "task.n_examples=2", "generation.max_new_tokens=7")
    assert compare.main(["--ar", ar["run_id"], longer["run_id"], "--runs-dir", str(runs_dir)]) == 2
    assert "differs in generation.max_new_tokens" in capsys.readouterr().err
    assert compare.main(["--ar", longer["run_id"], "--runs-dir", str(runs_dir)]) == 2
    assert "pass an ar run as the baseline" in capsys.readouterr().err
    superset = _run("method=sd", "task.n_examples=3")
    assert compare.main(["--ar", ar["run_id"], superset["run_id"], "--runs-dir", str(runs_dir)]) == 2
    assert "run ar on a superset" in capsys.readouterr().err


def test_ignored_keys_are_allowed_to_differ_and_named(runs_dir):
    ar = _run("method=ar", "task.n_examples=2")
    other = _run("method=sd_ngram", "task.n_examples=2", "pair.seed=1")
    rows, _, note = shared_table(RunStore(runs_dir), ar["run_id"], [other["run_id"]], ignore=("pair.seed",))
    assert len(rows) == 2 and "Differences ignored: pair.seed." in note


def test_a_methods_own_input_file_is_not_part_of_the_workload():
    from viasd.tracking.baseline import workload_key

    ar = {"pair": {"name": "p"}, "method": {"name": "ar"}, "inputs": {"task.path": "a"}}
    via = {"pair": {"name": "p"}, "method": {"name": "via_sd"}, "inputs": {"task.path": "a", "method.slim.mask": "m"}}
    assert workload_key(ar) == workload_key(via)
    assert workload_key(ar) != workload_key({**via, "inputs": {"task.path": "b"}})
    # The independent intermediate verifier (table4's `independent` row) is the method's model, not the workload's.
    with_mid = {**via, "pair": {"name": "p", "intermediate": {"id": "qwen2.5-coder-0.5b-instruct"}}}
    assert workload_key(ar) == workload_key(with_mid)
    assert workload_key(ar) != workload_key({**with_mid, "pair": {"name": "q"}})


def test_cpu_time_speedup_pairs_only_the_examples_both_runs_timed(tmp_path):
    """Examples of runs made before ``cpu_s`` was recorded are left out of the CPU-time speedup (its own n),
    not of the wall-clock one; a wall clock that ran through a pause moves only the latter."""
    from viasd.analysis.paired import compare_to_ar

    def ex(i, wall, cpu=None, tokens=100):
        return {"id": f"p{i}", "new_tokens": tokens, "wall_s": wall, "token_ids": [1], **({"cpu_s": cpu} if cpu else {})}

    ar = {"run_id": "ar", "config": {}, "meta": {}, "summary": {"method": "ar", "task": "prompts"},
          "examples": [ex(0, 10.0), ex(1, 10.0, 10.0), ex(2, 10.0, 10.0)]}
    sd = {"run_id": "sd", "config": {}, "meta": {}, "summary": {"method": "sd", "task": "prompts"},
          "examples": [ex(0, 5.0), ex(1, 500.0, 5.0), ex(2, 5.0, 5.0)]}  # p1: the machine paused mid-decode
    cmp = compare_to_ar(RunStore(tmp_path), sd, ar)
    assert cmp["n"] == 3 and cmp["cpu"].n == 2 and abs(cmp["cpu"].estimate - 2.0) < 1e-9
    assert cmp["speedup"].estimate < 0.1


def test_unfinished_runs_give_an_interim_table_that_is_printed_never_written(runs_dir, tmp_path, capsys):
    ar = _run("method=ar", "task.n_examples=3")
    sd = _run("method=sd", "task.n_examples=3")
    for rid in (ar["run_id"], sd["run_id"]):  # two cells still being decoded: no summary yet
        (runs_dir / rid / "summary.json").unlink()
    lines = (runs_dir / ar["run_id"] / "examples.jsonl").read_text().splitlines(keepends=True)
    (runs_dir / ar["run_id"] / "examples.jsonl").write_text("".join(lines[:2]))  # ar one problem behind sd
    assert compare.main(["--ar", ar["run_id"], sd["run_id"], "--runs-dir", str(runs_dir)]) == 2
    assert "is unfinished" in capsys.readouterr().err
    rows, _, _ = shared_table(RunStore(runs_dir), ar["run_id"], [sd["run_id"]], unfinished=True)
    assert [r[2] for r in rows] == [2, 2] and rows[1][HEADER.index("examples == ar tokens")] == "2/2"
    assert compare.main(["--ar", ar["run_id"], sd["run_id"], "--runs-dir", str(runs_dir), "--unfinished"]) == 0
    assert sd["run_id"] in capsys.readouterr().out
    assert compare.main(["--ar", ar["run_id"], sd["run_id"], "--runs-dir", str(runs_dir), "--unfinished",
                         "--out", str(tmp_path / "o")]) == 2
    assert "drop --out" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_an_unfinished_text_task_run_is_scored_as_its_finish_will_score_it(runs_dir, synthetic_data):
    """An interim reading has quality on text tasks (XSum's ROUGE here): each complete example gets the
    score the run writes when it finishes; a code task's examples stay unscored (scoring runs programs)."""
    ar = _run("method=ar", "task=xsum", "task.n_examples=3")
    ngram = _run("method=sd_ngram", "task=xsum", "task.n_examples=3")
    finished = {e["id"]: e["score"] for e in RunStore(runs_dir).examples(ngram["run_id"])}
    assert all(finished.values())
    for rid in (ar["run_id"], ngram["run_id"]):  # still being decoded: no summary, records without scores
        (runs_dir / rid / "summary.json").unlink()
        path = runs_dir / rid / "examples.jsonl"
        path.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "score"}) + "\n"
                                for line in path.read_text().splitlines()[:2]))
    run = load_unfinished(RunStore(runs_dir), ngram["run_id"])
    assert [e["score"] for e in run["examples"]] == [finished[e["id"]] for e in run["examples"]]
    assert all("score" not in json.loads(line) for line in (runs_dir / ngram["run_id"] / "examples.jsonl").open())
    rows, _, note = shared_table(RunStore(runs_dir), ar["run_id"], [ngram["run_id"]], unfinished=True)
    quality = HEADER.index("quality (same examples)")
    assert rows[1][2] == 2 and rows[1][quality] == rows[0][quality] == 0.0 and "rougeL" in note  # random model: no overlap
    same = [{"id": "a", "prediction": "The cat sat on the mat.", "reference": "The cat sat on the mat."}]
    assert interim_scores({"name": "xsum"}, same)[0]["score"]["rougeL"] == pytest.approx(100.0)
    code = [{"id": "1", "prediction": "def f(): pass", "reference": "assert f() is None"}]
    assert interim_scores({"name": "mbpp"}, code) == code


def test_code_task_rows_name_the_isolation_level_their_programs_ran_at(runs_dir, synthetic_data, tmp_path):
    """A code task's table says where each run's programs ran (meta.json's ``isolation``); a run scored
    before the field says it was not recorded; a table of runs that executed no code has no such column."""
    if sandbox._isolation()[0] is None:
        pytest.skip(f"code sandbox unavailable here ({sandbox._isolation()[1]})")
    code = ["task=humaneval", "task.n_examples=2", "generation.max_new_tokens=4"]
    ar, sd = _run("method=ar", *code), _run("method=sd", *code)
    old = runs_dir / sd["run_id"]  # as the committed runs: scored before the field (sealed again without it)
    meta = {k: v for k, v in json.loads((old / "meta.json").read_text()).items() if k != "isolation"}
    (old / "meta.json").write_text(json.dumps(meta))
    summary = json.loads((old / "summary.json").read_text())
    (old / "summary.json").write_text(json.dumps({**summary, "record_sha256": record_sha256(summary, meta)}))
    rows, _, _ = shared_table(RunStore(runs_dir), ar["run_id"], [sd["run_id"]])
    assert shared_header(rows)[-1] == ISOLATION == "code isolation"
    assert [r[-1] for r in rows] == [sandbox.isolation_level(), NOT_RECORDED], rows
    write_shared(tmp_path, "verdict_humaneval", "t", RunStore(runs_dir), ar["run_id"], [sd["run_id"]])
    assert "| code isolation" in (tmp_path / "verdict_humaneval.md").read_text()
    plain = _run("method=ar", "task.n_examples=2")
    rows, _, _ = shared_table(RunStore(runs_dir), plain["run_id"], [])
    assert shared_header(rows) == HEADER and len(rows[0]) == len(HEADER)
