"""A replayed frontier records the cost file that priced it by hash, and ``report --check`` calls it stale
when that file is not what priced it (``viasd/report/frontier_cost.py``): none named, outside the
repository, missing, other bytes, rows priced by another file. On a tiny traced ``ar`` run. A compared
table's predicted speedups (``experiments.compare``, the verdict tables) record theirs the same way."""

from __future__ import annotations

import hashlib
import json

import pytest

from experiments import compare as compare_cmd
from experiments import replay as replay_cmd
from experiments import trace as trace_cmd
from tests.test_cost import _run, shape_doc, synthetic
from viasd.analysis.cost import COST, CostModel, cost_name
from viasd.paths import PROJECT_ROOT
from viasd.report.check import FRESH, STALE, check_tree


def test_a_loaded_cost_file_records_its_bytes_hash_path_and_pair(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(synthetic("tiny-llama")))
    cost = CostModel.load(grid)
    assert cost.sha256 == hashlib.sha256(grid.read_bytes()).hexdigest() and cost.pair == "tiny-llama"
    assert cost.record(repo=tmp_path) == {"path": "grid.json", "sha256": cost.sha256, "pair": "tiny-llama"}
    assert cost.record()["path"] == str(grid.resolve())  # outside the repository: absolute
    shapes = tmp_path / "paper_shapes.json"
    shapes.write_text(json.dumps(shape_doc()))
    assert CostModel.load(shapes, "p").record(repo=tmp_path)["pair"] == "p"  # the viasd.cost/v1 entry read
    committed = next((PROJECT_ROOT / "results" / "runs" / "_cost").glob("*.json"))
    assert CostModel.load(committed).record()["path"] == f"results/runs/_cost/{committed.name}"


@pytest.fixture
def frontier(runs_dir, tmp_path, capsys):
    """A frontier of a tiny traced ``ar`` run written by ``experiments.replay … out= report=`` in a
    repository at ``tmp_path/repo``, priced by its committed cost file: ``(repo, output path, cost file)``."""
    ar = _run("method=ar")
    assert trace_cmd.main([f"run={ar['run_id']}"]) == 0
    repo = tmp_path / "repo"
    cost = repo / "results" / "runs" / "_cost" / "tiny-llama__h-x__eager-float32-t1.json"
    cost.parent.mkdir(parents=True)
    cost.write_text(json.dumps(synthetic()))
    out = repo / "pf" / "smoke" / "frontier_t"
    assert replay_cmd.main([f"run={ar['run_id'][:30]}", "method=ar,sd", f"cost={cost}", f"out={out}.rows.json",
                            f"report={out}", "scale=smoke"]) == 0
    capsys.readouterr()
    return repo, out, cost


def _verdict(repo, runs_dir):
    (v,) = check_tree([repo / "pf"], [runs_dir], repo=repo)[0]
    return v


def test_the_frontier_records_its_cost_file_by_hash_and_is_fresh_while_that_file_is_unchanged(frontier, runs_dir):
    repo, out, cost = frontier
    src = json.loads(out.with_suffix(".sources.json").read_text())
    sha = hashlib.sha256(cost.read_bytes()).hexdigest()
    assert src["replay"]["cost"] == {"path": str(cost.resolve()), "sha256": sha, "pair": "tiny-llama"}
    assert src["replay"]["run"] == src["runs"][0]
    assert src["replay"]["command"].startswith(f"python -m experiments.replay run={src['runs'][0]} method=ar,sd cost=")
    rows = json.loads(out.with_suffix(".rows.json").read_text())
    assert {(r["cost_file"], r["cost_sha256"], r["cost_pair"]) for r in rows} == {(str(cost.resolve()), sha, "tiny-llama")}
    assert f"Priced by the cost file `{cost.resolve()}` (sha256 {sha[:12]}…, pair tiny-llama)" in \
        out.with_suffix(".md").read_text()
    v = _verdict(repo, runs_dir)
    assert v.state == FRESH, v.line()


def test_a_changed_missing_or_outside_cost_file_makes_it_stale_with_the_replay_command_as_the_fix(frontier, runs_dir):
    repo, out, cost = frontier
    command = json.loads(out.with_suffix(".sources.json").read_text())["replay"]["command"]
    cost.write_text(json.dumps(synthetic()) + "\n")  # re-measured: other bytes
    v = _verdict(repo, runs_dir)
    assert v.state == STALE and "changed since it priced it (sha256" in v.reason and v.fix == f"re-price it: {command}"
    cost.unlink()
    v = _verdict(repo, runs_dir)
    assert v.state == STALE and "is missing" in v.reason and "python -m experiments.bench --cost-curve" in v.fix
    v = check_tree([repo / "pf"], [runs_dir])[0][0]  # the repository is this one: the file lies outside it
    assert v.state == STALE and "outside the repository" in v.reason and "copy it under results/runs/_cost/" in v.fix


def test_rows_priced_by_another_cost_file_or_no_cost_file_at_all_are_stale(frontier, runs_dir):
    repo, out, _ = frontier
    rows = json.loads(out.with_suffix(".rows.json").read_text())
    out.with_suffix(".rows.json").write_text(json.dumps([{**rows[0], "cost_sha256": "0" * 64}, *rows[1:]]))
    v = _verdict(repo, runs_dir)
    assert v.state == STALE and "1 rows of frontier_t.rows.json were priced by another cost file" in v.reason
    out.with_suffix(".rows.json").unlink()
    sources = out.with_suffix(".sources.json")
    legacy = {k: v for k, v in json.loads(sources.read_text()).items() if k != "replay"}
    sources.write_text(json.dumps(legacy))  # written before frontiers recorded their cost file: its title says what it is
    v = _verdict(repo, runs_dir)
    assert v.state == STALE and "names no cost file that priced its predicted speedups (written before" in v.reason
    cost = "results/runs/_cost/tiny-llama__h-x__eager-float32-t1.json"
    assert v.fix.startswith(f"re-price it: python -m experiments.replay run={legacy['runs'][0]} cost={cost} grid=")
    assert v.fix.endswith("report=pf/smoke/frontier_t scale=smoke")


def test_a_frontier_replayed_without_a_cost_file_is_stale(runs_dir, tmp_path, capsys):
    ar = _run("method=ar")
    assert trace_cmd.main([f"run={ar['run_id']}"]) == 0
    out = tmp_path / "repo" / "pf" / "smoke" / "frontier_t"
    assert replay_cmd.main([f"run={ar['run_id']}", "method=sd", "cost=none", f"report={out}"]) == 0
    assert "No cost file priced it" in out.with_suffix(".md").read_text()
    v = _verdict(tmp_path / "repo", runs_dir)
    assert v.state == STALE and v.reason == "names no cost file that priced its predicted speedups"
    assert "python -m experiments.bench --cost-curve pair=tiny-llama" in v.fix


def test_a_compared_table_records_the_cost_files_of_its_predictions_and_is_stale_when_one_changes(runs_dir, capsys):
    ar, sd = _run("method=ar"), _run("method=sd")
    meta = json.loads((runs_dir / ar["run_id"] / "meta.json").read_text())
    cost = runs_dir / COST / cost_name("tiny-llama", meta["runtime"], meta["threads"])
    CostModel(synthetic()).save(cost)
    repo = runs_dir.parent
    out = repo / "pf" / "smoke"
    assert compare_cmd.main(["--ar", ar["run_id"], sd["run_id"], "--out", str(out), "--name", "cmp"]) == 0
    capsys.readouterr()
    sha = hashlib.sha256(cost.read_bytes()).hexdigest()
    src = json.loads((out / "cmp.sources.json").read_text())
    record = {"path": str(cost.resolve()), "sha256": sha, "pair": "tiny-llama"}
    assert src["costs"] == {ar["run_id"]: record, sd["run_id"]: record}
    assert f"Priced by the cost file `{cost.resolve()}` (sha256 {sha[:12]}…)" in (out / "cmp.md").read_text()
    assert _verdict(repo, runs_dir).state == FRESH
    cost.write_text(cost.read_text() + "\n")  # re-measured: other bytes
    v = _verdict(repo, runs_dir)
    assert v.state == STALE and f"{ar['run_id']}: its cost file" in v.reason and "changed since it priced it" in v.reason
    assert "experiments.compare --ar … --out" in v.fix
    (out / "cmp.sources.json").write_text(json.dumps({k: v for k, v in src.items() if k != "costs"}))
    v = _verdict(repo, runs_dir)  # written before compared tables recorded their cost files
    assert v.state == STALE and v.reason.startswith("names no cost file that priced its predicted speedups")


def test_a_frontier_of_lossless_methods_only_draws_a_figure_of_its_own_size(frontier):
    """``method=ar,sd``: nothing diverges, so the names once sat far above the axes (0 to 0.05) and the saved
    figure grew to 1620×2320 px; they sit inside now, and the empty precision panel says why it is empty."""
    from PIL import Image

    _, out, _ = frontier
    width, height = Image.open(out.with_suffix(".png")).size
    assert width < 1700 and height < 700, (width, height)  # figsize 10×3.8 in at 150 dpi, plus the legend
