"""The GPU smoke script checks itself on the CPU (``--device cpu``; ``--paper-shapes --device cpu --layers 2``)."""

from __future__ import annotations

import json
import re

from experiments.gpu_smoke import NEAR_TIE, _compare, _near_tie, main, match_rate, smoke
from viasd.analysis.cost import CostModel
from viasd.harness.dryrun import KNOWN_PARAMS
from viasd.harness.shape_costs import KEEPS, KS, SCHEMA
from viasd.models.pairs import load_pair
from viasd.models.paper_shapes import paper_architectures, paper_pairs, param_count


def test_gpu_smoke_passes_on_cpu(capsys):
    assert main(["--device", "cpu", "--prompts", "1", "--max-new-tokens", "8", "--compile", "aot_eager"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "viasd_routed" in out and "tok/s" in out and "syncs/tok" in out
    # the split-device lossless check (a device map over cpu only here) and the compiled rows
    assert re.search(r"split:cpu\+cpu +cascade_sd .* ok == ar", out)
    assert re.search(r"tiny-llama +sd compiled:aot_eager .* ok == ar", out) and "tiny-t5 " in out
    assert re.search(r"tiny-t5 +compiled .* ok not compiled: \+pair\.compile=true compiles decoder-only", out)


def test_gpu_smoke_reports_a_real_difference():
    rows = smoke("cpu", "float32", 1, 6)
    assert all(r.ok for r in rows) and {r.method for r in rows} >= {"ar", "sd", "viasd_tiers_off", "viasd_routed"}
    pair = load_pair("tiny-llama")
    ids = pair.encode("The cat sat on the mat.")
    ok, detail = _compare(pair, [ids], [[1, 2, 3]], [[1, 2, 4]], exact=True)
    assert not ok and "prompts [0]" in detail
    # the failure says how much agrees and where it first diverges, with the logit margin there
    assert "token match 2/3 (66.7%)" in detail
    assert re.search(r"first divergence: prompt 0 at token 2 \(ar 4 vs 3, relative logit margin \d\.\d{4}\)", detail)
    assert match_rate([[1, 2, 3], [5]], [[1, 9, 3], [5, 6]]) == (3, 5)
    # below fp32 a divergence within the near-tie margin passes, and says so with the match rate
    gap = _near_tie(pair, ids, [1, 2], 4, 3)
    ok, detail = _compare(pair, [ids], [[1, 2, 3]], [[1, 2, 4]], exact=False)
    assert ok == (gap <= NEAR_TIE) and ("near-tie" in detail if ok else "relative logit margin" in detail)


def test_paper_shapes_reproduce_the_published_parameter_counts():
    """conf/paper_shapes.yaml holds the published architectures: each one has its model's parameter count."""
    for model_id in paper_architectures():
        assert param_count(model_id) == KNOWN_PARAMS[model_id], model_id


def test_paper_shapes_self_test_on_cpu(tmp_path, capsys):
    """The same measuring path as on the GPU, narrowed: a complete viasd.cost/v1 file and its table."""
    out = tmp_path / "cost.json"
    assert main(["--paper-shapes", "--device", "cpu", "--layers", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == SCHEMA and doc["shapes"] == {"paper": False, "layers": 2, "width_div": 32}
    assert set(doc["models"]) == set(paper_architectures()) - {"meta-llama/Llama-2-70b-chat-hf"}
    for row in doc["models"].values():
        assert row["layers"] == 2 and set(row["t_ms"]) == {"32", "128"}
        assert all(set(t) == {str(k) for k in KS} and all(v > 0 for v in t.values()) for t in row["t_ms"].values())
        assert all(r["1"] == 1.0 for r in row["ratio"].values())
        assert set(row["slim_ratio"]) == {str(k) for k in KEEPS}
        assert all("eager_ms" in g and "note" in g for c in row["graph"].values() for g in c.values())
        assert row["search"]["peak_gib"] is None and row["search"]["estimate_gib"] > 0 < row["search"]["held_gib_per_batch"]
    assert set(doc["pairs"]) == {"qwen2.5-0.5b-7b", "gemma2-2b-9b"}  # the 70B target is optional
    assert doc["pairs"]["qwen2.5-0.5b-7b"]["target"] == paper_pairs()["qwen2.5-0.5b-7b"]["target"]
    assert all(c > 0 for p in doc["pairs"].values() for c in p["c"].values())
    assert "skipped" in doc and (tmp_path / "cost.md").read_text().startswith("Paper-shape forward costs")
    assert "cost file written to" in capsys.readouterr().out
    cost = CostModel.load(out, "qwen2.5-0.5b-7b")  # the replay's loader reads it (experiments.replay cost=FILE)
    assert cost.meta["source"] == SCHEMA and set(cost.models) >= {"draft", "target"}
    assert cost.price("target", 5, 64) > 0 and cost.price("target", 5, 64, layers=1) > 0
