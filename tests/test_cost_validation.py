"""Cost files are checked before they price anything (issue 62.5): every malformed file — NaN, negative or
zero costs, grids of the wrong shape, a top-level list, ``"models": []`` — is one ``error:`` line naming
the fix, and ``experiments.replay … cost=FILE`` refuses a file measured for another pair unless
``cost.allow_other_pair=true`` (then the printed note names both pairs)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from experiments import cost as cost_cmd
from experiments import replay as replay_cmd
from experiments import trace as trace_cmd
from tests.test_cost import _run, shape_doc, synthetic
from viasd.analysis.cost import COST, CostModel, cost_name
from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT


def _set(doc: dict, path: tuple, value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def _zeros(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    for m in doc["models"].values():
        for c in m.values():
            if isinstance(c, dict):
                c["decode"] = [[0.0 for _ in row] for row in c["decode"]]
                c["prefill"] = [0.0 for _ in c["prefill"]]
        m["head_row"] = 0.0
    return doc


NAN, NEG = float("nan"), -1e-3
GRID_BREAKS = {  # name -> (document, a fragment of its error line)
    "nan decode": (_set(synthetic(), ("models", "target", "native", "decode", 1, 0), NAN), "not finite"),
    "inf prefill": (_set(synthetic(), ("models", "draft", "native", "prefill", 0), float("inf")), "not finite"),
    "negative decode": (_set(synthetic(), ("models", "draft", "native", "decode", 0, 1), NEG), "not positive"),
    "zero decode": (_set(synthetic(), ("models", "target", "native", "decode", 2, 1), 0.0), "not positive"),
    "all zero": (_zeros(synthetic()), "not positive"),
    "negative head row": (_set(synthetic(), ("models", "target", "head_row"), NEG), "head_row"),
    "nan head row": (_set(synthetic(), ("models", "target", "head_row"), NAN), "head_row"),
    "nan routed": (_set(synthetic(), ("models", "target", "routed_layer", "decode", 0, 0), NAN), "not finite"),
    "top-level list": ([synthetic()], "not a JSON object"),
    "models list": (_set(synthetic(), ("models",), []), "models"),
    "no models": (_set(synthetic(), ("models",), {}), "no target"),
    "no target": (_set(synthetic(), ("models",), {"draft": synthetic()["models"]["draft"]}), "no target"),
    "model not an object": (_set(synthetic(), ("models", "draft"), [1, 2]), "draft"),
    "no native": (_set(synthetic(), ("models", "draft", "native"), None), "native"),
    "short decode": (_set(synthetic(), ("models", "target", "native", "decode"), [[1e-3, 2e-3]]), "4 × 2"),
    "ragged decode": (_set(synthetic(), ("models", "target", "native", "decode", 1), [1e-3]), "4 × 2"),
    "string cost": (_set(synthetic(), ("models", "draft", "native", "decode", 0, 0), "fast"), "not a number"),
    "short prefill": (_set(synthetic(), ("models", "draft", "native", "prefill"), [1e-3]), "prefill"),
    "unsorted ns": (_set(synthetic(), ("grid", "ns"), [1, 4, 2, 8]), "ascending"),
    "zero n": (_set(synthetic(), ("grid", "ns"), [0, 2, 4, 8]), "ascending"),
    "grid missing": (_set(synthetic(), ("grid",), None), "grid"),
    "bad layers": (_set(synthetic(), ("models", "target", "n_layers"), "abc"), "n_layers"),
    "zero layers": (_set(synthetic(), ("models", "target", "n_layers"), 0), "n_layers"),
}
SHAPE_BREAKS = {
    "nan t_ms": (_set(shape_doc(), ("models", "org/target", "t_ms", "32", "2"), NAN), "not finite"),
    "negative t_ms": (_set(shape_doc(), ("models", "org/draft", "t_ms", "128", "1"), NEG), "not positive"),
    "zero slim": (_set(shape_doc(), ("models", "org/target", "slim_t_ms", "0.5", "32", "1"), 0.0), "not positive"),
    "missing k": (_set(shape_doc(), ("models", "org/target", "t_ms", "32"), {"1": 1.0}), "t_ms"),
    "models list": (_set(shape_doc(), ("models",), []), "models"),
    "pairs list": (_set(shape_doc(), ("pairs",), []), "pairs"),
    "layers text": (_set(shape_doc(), ("models", "org/target", "layers"), "four"), "layers"),
    "ks empty": (_set(shape_doc(), ("ks",), []), "ks"),
}


@pytest.mark.parametrize("name", sorted(GRID_BREAKS) + [f"v1 {n}" for n in sorted(SHAPE_BREAKS)])
def test_every_malformed_cost_file_is_one_line_naming_the_fix(tmp_path, name):
    doc, fragment = SHAPE_BREAKS[name[3:]] if name.startswith("v1 ") else GRID_BREAKS[name]
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(doc))  # NaN and Infinity as Python's json writes them
    with pytest.raises(ConfigError) as e:
        CostModel.load(path, "p")
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and fragment in msg, msg
    assert "re-measure" in msg or "experiments.bench" in msg or "gpu_smoke" in msg, msg


def test_not_json_and_a_missing_file_are_one_line(tmp_path):
    (tmp_path / "junk.json").write_text("{not json")
    for path in (tmp_path / "junk.json", tmp_path / "missing.json"):
        with pytest.raises(ConfigError, match="re-measure") as e:
            CostModel.load(path)
        assert "\n" not in str(e.value)


def test_the_valid_files_still_load_and_price_the_same():
    """The committed grid files (their fitted ``routed_base`` goes below 0: an intercept, not a cost) and the
    synthetic grid of the other tests load unchanged."""
    for path in sorted((PROJECT_ROOT / "results" / "runs" / "_cost").glob("*.json")):
        cost = CostModel.load(path)
        assert cost.price("target", 1, 512) > 0 and cost.price("target", 5, 512, layers=14) > 0
    for path in sorted((PROJECT_ROOT / "bench_results").glob("*.json")):  # committed viasd.cost/v1 files, if any
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and doc.get("schema") == "viasd.cost/v1":
            for pair in doc["pairs"]:
                assert CostModel.load(path, pair).price("target", 1, 512) > 0
    assert CostModel(synthetic()).price("draft", 1, 0) == pytest.approx(3e-4 + 2e-5)
    cost = CostModel(_set(synthetic(), ("models", "target", "head_row"), 0.0))  # no extra-row cost: allowed
    assert cost.entry("target").head_row == 0.0


def test_replay_refuses_bad_and_foreign_cost_files(runs_dir, tmp_path, capsys):
    """``experiments.replay … cost=FILE``: a NaN, zero or negative file is one error line (it priced the
    speedups silently before); another pair's file is refused unless ``cost.allow_other_pair=true``, and then
    the note and each row name the pair that priced it."""
    ar = _run("method=ar")
    rid = ar["run_id"]
    assert trace_cmd.main([f"run={rid}"]) == 0
    bad = {"nan": _set(synthetic(), ("models", "target", "native", "decode", 0, 0), NAN),
           "negative": _set(synthetic(), ("models", "draft", "native", "decode", 0, 0), NEG),
           "zero": _zeros(synthetic()), "list": [synthetic()], "no models": _set(synthetic(), ("models",), [])}
    for name, doc in bad.items():
        path = tmp_path / f"{name.replace(' ', '_')}.json"
        path.write_text(json.dumps(doc))
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            replay_cmd.main([f"run={rid}", "method=ar,sd", f"cost={path}"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, (name, err)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(synthetic("tiny-qwen2")))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        replay_cmd.main([f"run={rid}", "method=ar,sd", f"cost={other}"])
    err = capsys.readouterr().err
    assert "measured for pair 'tiny-qwen2'" in err and "cost.allow_other_pair=true" in err and err.count("\n") == 1
    out = tmp_path / "rows.json"
    assert replay_cmd.main([f"run={rid}", "method=ar,sd", f"cost={other}", "cost.allow_other_pair=true",
                            f"out={out}", f"report={tmp_path / 'fig' / 'frontier'}"]) == 0
    printed = capsys.readouterr().out
    assert "measured for pair tiny-qwen2, not this run's pair tiny-llama" in printed
    note = (tmp_path / "fig" / "frontier.md").read_text()
    assert "pair tiny-qwen2). It was measured for another pair than the trace's (tiny-llama" in note
    rows = json.loads(out.read_text())
    assert {r["cost_pair"] for r in rows} == {"tiny-qwen2"} and all(r["predicted_speedup"] > 0 for r in rows)
    gpu = tmp_path / "paper_shapes.json"  # a viasd.cost/v1 entry of another pair: the same rule
    gpu.write_text(json.dumps(shape_doc()))
    with pytest.raises(SystemExit):
        replay_cmd.main([f"run={rid}", "method=ar", f"cost={gpu}", "cost_pair=p"])
    assert "measured for pair 'p'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        replay_cmd.main([f"run={rid}", "method=ar", f"cost={other}", "cost.allow_other_pair=maybe"])
    assert "cost.allow_other_pair" in capsys.readouterr().err
    own = tmp_path / "own.json"
    own.write_text(json.dumps(synthetic()))
    assert replay_cmd.main([f"run={rid}", "method=ar,sd", f"cost={own}", f"out={out}"]) == 0
    assert "not this run's pair" not in capsys.readouterr().out
    rows = json.loads(Path(out).read_text())
    assert {r["cost_pair"] for r in rows} == {"tiny-llama"} and not math.isnan(rows[1]["predicted_speedup"])
    # a malformed file in the store (found by cost=auto, and by experiments.cost): one line too
    meta = json.loads((runs_dir / rid / "meta.json").read_text())
    (runs_dir / COST).mkdir(parents=True, exist_ok=True)
    (runs_dir / COST / cost_name("tiny-llama", meta["runtime"], meta["threads"])).write_text(json.dumps(bad["nan"]))
    for command in (lambda: replay_cmd.main([f"run={rid}", "method=ar"]),
                    lambda: cost_cmd.main(["--runs-dir", str(runs_dir)])):
        with pytest.raises(SystemExit) as e:
            command()
        err = capsys.readouterr().err
        assert e.value.code == 2 and "is not finite" in err and err.count("\n") == 1, err
