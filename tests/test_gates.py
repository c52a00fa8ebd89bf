"""VIA-SD's other gates and readings (issue 44): the learned gate (features shared by decode and
replay, its training command and file checks), the oracle bound in replay, ``agreement=slim_rel``
and DIMR's margin objective — on tiny random pairs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from experiments import replay as replay_cmd
from experiments import train_gate as train_cmd
from tests.test_cost import synthetic
from tests.test_families import family_pair
from tests.test_replay import PROMPTS, _run, check_own_trajectory, traced
from viasd.analysis.cost import CostModel
from viasd.analysis.replay import Policy, replay
from viasd.core.gate import FEATURES, dense_gate_features, gate_features, next_run
from viasd.core.tiers import agreement_scores
from viasd.dimr.margin import margin_rows
from viasd.dimr.search import SearchConfig
from viasd.engine.gate_file import load_gate, save_gate
from viasd.errors import ConfigError
from viasd.methods.api import decode, method_config

MASK = [0, 1, 3]


def runs_dir_stores():
    from viasd.paths import runs_dir
    from viasd.tracking.store import RunStores

    return RunStores.default(runs_dir())
GEN = {"max_new_tokens": 16, "ignore_eos": True}


def test_margin_violation_by_hand():
    q = torch.tensor([0.5, 0.3, 0.2])
    qs = torch.tensor([0.8, 0.1, 0.1])
    # first sum: q'(v) * ReLU(log 0.5 + log(q'/q)); only v=0: 0.8 * (log 0.5 + log 1.6) = 0.8 * log 0.8 < 0 -> 0
    # second sum: q(v) * ReLU(log 0.3 + log(q'/q)); v=0: 0.5 * log(0.48) < 0 -> 0; others smaller -> 0
    assert float(margin_rows(q.log(), qs.log())) == 0.0
    qs = torch.tensor([0.98, 0.01, 0.01])
    q = torch.tensor([0.2, 0.4, 0.4])
    expected = 0.98 * math.log(0.5 * 0.98 / 0.2) + 0.2 * math.log(0.3 * 0.98 / 0.2)
    assert float(margin_rows(q.log(), qs.log())) == pytest.approx(expected, rel=1e-5)
    assert float(margin_rows(q.log(), q.log())) == 0.0
    with pytest.raises(ConfigError, match="margin_alpha"):
        SearchConfig(objective="margin", margin_alpha=1.0).validate()
    SearchConfig(objective="margin").validate()


def test_slim_rel_agreement_reads_the_slim_top():
    q = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
    p = torch.tensor([[0.9, 0.05, 0.05], [0.2, 0.7, 0.1]])
    assert agreement_scores(p, q, torch.tensor([1, 2]), "slim_rel").tolist() == [0.5, 1.0]
    with pytest.raises(ConfigError, match="agreement must be one of"):
        method_config("via_sd", {"agreement": "nope"})


def test_gate_features_are_exact_on_full_rows_and_the_run_of_accepts():
    torch.manual_seed(0)
    p, q = torch.rand(3, 6).softmax(-1), torch.rand(4, 6).softmax(-1)
    y = torch.tensor([1, 4, 0])
    f = dense_gate_features(y, p, q, 6, 10, 2)
    assert f.shape == (3, len(FEATURES))
    col = dict(zip(FEATURES, f.T))
    tv = 0.5 * (p - q[:3]).abs().sum(-1)
    kl = (p * (p.log() - q[:3].log())).sum(-1)
    assert torch.allclose(col["tv"], tv.double(), atol=1e-6) and torch.allclose(col["kl"], kl.double(), atol=1e-6)
    assert col["block_pos"].tolist() == [0, 1, 2] and col["run"].tolist() == [2, 3, 4]
    assert torch.allclose(col["slim_rel"], (q[[0, 1, 2], y] / q[:3].max(-1).values).double())
    assert next_run(3, 4, 4) == 7 and next_run(3, 4, 2) == 0
    g = gate_features(y, p[[0, 1, 2], y], q[[0, 1, 2], y], *p.topk(2, -1)[::-1], *q[:3].topk(2, -1)[::-1],
                      torch.zeros(3), torch.zeros(3), torch.zeros(3))
    assert (g[:, FEATURES.index("tv")] >= tv.double() - 1e-6).all()  # top-k: an upper bound


def _gate_file(tmp_path, pair, name: str, intercept: float, layers=MASK) -> str:
    n = len(FEATURES)
    return str(save_gate(tmp_path / name, [0.0] * n, [1.0] * n, [0.0] * n, intercept,
                         {"pair": pair.name, "mask": "layers:0,1,3", "layers": layers, "topk": 8, "lam": 0.5}))


def test_gate_config_errors_and_the_oracle_is_replay_only(tmp_path):
    pair = family_pair("qwen2")
    with pytest.raises(ConfigError, match="needs method.gate_path"):
        method_config("via_sd", {"gate": "learned"})
    with pytest.raises(ConfigError, match="replay-only"):
        decode(pair, pair.encode(PROMPTS[0]), "via_sd", {"gate": "oracle", "slim": {"mask": MASK}}, GEN)
    with pytest.raises(ConfigError, match="gate file not found"):
        load_gate(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_text("not a gate")
    with pytest.raises(ConfigError, match="not a gate file"):
        load_gate(tmp_path / "junk.pt")
    foreign = _gate_file(tmp_path, pair, "foreign.pt", 0.0, layers=[0, 2, 3])
    with pytest.raises(ConfigError, match="was trained for pair"):
        decode(pair, pair.encode(PROMPTS[0]), "via_sd",
               {"gate": "learned", "gate_path": foreign, "slim": {"mask": MASK}}, GEN)


def test_limit_gates_in_decode_and_replay(tmp_path):
    """An always-escalating learned gate is ``sd``'s decisions (lossless, same target calls), live and in
    replay; the oracle never diverges, its rounds are ``sd``'s rounds, it needs no more target calls than any gate
    that does not diverge, and is predicted at least as fast as those that run the slim pass."""
    pair = family_pair("qwen2")
    ar = [decode(pair, pair.encode(p), "ar", {}, GEN) for p in PROMPTS]
    never = _gate_file(tmp_path, pair, "never.pt", -50.0)
    cfg = {"gate": "learned", "gate_path": never, "slim": {"mask": MASK}}
    live = [decode(pair, pair.encode(p), "via_sd", cfg, GEN) for p in PROMPTS]
    sd = [decode(pair, pair.encode(p), "sd", {"gamma": 4}, GEN) for p in PROMPTS]
    assert [r.tokens for r in live] == [r.tokens for r in ar]
    assert [r.models["target"].calls for r in live] == [r.models["target"].calls for r in sd]
    traces = traced(pair, tmp_path, PROMPTS, [r.tokens for r in ar], [method_config("via_sd", cfg).slim], max_new=16)
    cost = CostModel(synthetic(pair.name))
    ar_s = replay(traces, Policy("ar", method_config("ar", {})), cost)["wall_s"]
    out = {name: replay(traces, Policy("via_sd", method_config("via_sd", c)), cost, None, ar_s) for name, c in {
        "never": cfg, "off": {**cfg, "gate": "thresholds", "tau_accept": 1.1, "tau_slim": 1.1},
        "oracle": {**cfg, "gate": "oracle"}, "lossy": {**cfg, "gate": "thresholds", "tau_accept": 0.2, "tau_slim": 0.2},
        "paper": {**cfg, "gate": "thresholds"}, "always": {**cfg, "gate_path": _gate_file(tmp_path, pair, "a.pt", 50.0)},
        "slim_rel": {**cfg, "gate": "thresholds", "agreement": "slim_rel", "tau_accept": 0.5}}.items()}
    assert out["never"]["target_calls"] == out["off"]["target_calls"] == sum(r.models["target"].calls for r in sd)
    assert out["never"]["replay/divergences"] == 0 == out["oracle"]["replay/divergences"]
    assert out["oracle"]["exact"] and out["oracle"]["new_tokens"] == sum(len(r.tokens) for r in ar)
    for name, r in out.items():
        if r["replay/divergences"] == 0:
            assert out["oracle"]["target_calls"] <= r["target_calls"], name
            if name != "off":  # sd runs no slim pass: the slim verifier's prefill and catch-up can cost more
                assert out["oracle"]["predicted_speedup"] >= r["predicted_speedup"], name
    assert out["oracle"]["target_calls"] < out["off"]["target_calls"]  # the tiny slim verifier is right sometimes
    assert out["oracle"]["rounds"] == out["off"]["rounds"] and out["oracle"]["accepted"] == out["off"]["accepted"]
    assert out["always"]["escalations"] < out["never"]["escalations"]
    foreign = {**cfg, "gate_path": _gate_file(tmp_path, pair, "f.pt", 0.0, layers=[0, 2])}
    with pytest.raises(ConfigError, match="was trained for pair"):
        replay(traces, Policy("via_sd", method_config("via_sd", foreign)))


def test_train_gate_command_and_a_learned_gate_replays_its_own_decode(runs_dir, tmp_path, capsys):
    """Train on a tiny ``ar`` run's trace (split by problem, a λ sweep, a transfer row), then decode with the
    gate and replay it over its own trajectory: the decode's and the replay's features agree (same counters)."""
    from experiments import trace as trace_cmd

    ar = _run("method=ar", "task.n_examples=6", "generation.max_new_tokens=24")
    rid = ar["run_id"]
    assert trace_cmd.main([f"run={rid}", "masks=[[0,1,3]]", "topk=400"]) == 0
    capsys.readouterr()
    out = tmp_path / "gate.pt"
    assert train_cmd.main([f"run={rid}", "mask=[0,1,3]", f"out={out}", "lam=0.3,0.7", "min_rows=10",
                           f"transfer={rid}"]) == 0
    text = capsys.readouterr().out
    assert "held-out problems" in text and "transfer" in text and "auc" in text
    g3, g7 = load_gate(tmp_path / "gate-lam0.3.pt"), load_gate(tmp_path / "gate-lam0.7.pt")
    assert g3.meta["lam"] == 0.3 and g3.meta["trace"]["run_id"] == rid and g3.meta["layers"] == MASK
    assert not set(g3.meta["train_problems"]) & set(g3.meta["test_problems"])
    assert float(g7.intercept) < float(g3.intercept)  # a larger λ weighs wrong trusts more: fewer trusts
    live = tmp_path / "live.pt"  # live=2: the problems `task.n_examples=2` decodes are held out, whatever the draw
    assert train_cmd.main([f"run={rid}", "mask=[0,1,3]", f"out={live}", "min_rows=10", "live=2", "test=0.2"]) == 0
    from experiments.train_gate import live_problems

    two = live_problems(runs_dir_stores(), rid, 2)
    assert len(two) == 2 and set(two) <= set(load_gate(live).meta["test_problems"])
    assert not set(two) & set(load_gate(live).meta["train_problems"])
    for bad, msg in ((["lam=1.5"], "lam must be in"), (["mask=[0,2]"], "no trace of 'layers:0,2'"),
                     (["min_rows=100000"], "too few labelled rounds"), (["live=6"], "leaves none to train on")):
        with pytest.raises(SystemExit):
            train_cmd.main([f"run={rid}", "mask=[0,1,3]", f"out={out}", *bad])
        assert msg in capsys.readouterr().err
    res = tmp_path / "frontier.json"
    assert replay_cmd.main([f"run={rid}", "method=via_sd", "method.slim.mask=[0,1,3]", "method.tau_accept=0.3,0.9",
                            f"out={res}", "oracle=true", f"held_out={tmp_path / 'gate-lam0.3.pt'}"]) == 0
    rows = json.loads(res.read_text())
    assert all(r["n_examples"] == len(g3.meta["test_problems"]) for r in rows)
    assert [r["method"].split()[1] for r in rows] == ["slim.mask=[0,1,3]", "slim.mask=[0,1,3]", "oracle"]
    assert rows[-1]["replay/divergences"] == 0 and rows[-1]["exact"]
    with pytest.raises(SystemExit):
        replay_cmd.main([f"run={rid}", "method=sd", "oracle=true"])
    assert "oracle=true bounds the via_sd" in capsys.readouterr().err
    pair = family_pair("llama")  # tiny-llama: the run's pair
    gated = {"gate": "learned", "gate_path": str(tmp_path / "gate-lam0.3.pt"), "slim": {"mask": MASK},
             "gate_threshold": 0.5}
    own = check_own_trajectory(pair, tmp_path, "via_sd", gated, PROMPTS, GEN, topk=400)
    print(own["tier1_accepted"], own["escalations"], own.get("tier2_regenerated"), own.get("slim_bonus"))
    assert own["exact"] and own["tier1_accepted"] > 0 and own["escalations"] > 0  # the gate trusts and escalates


def test_a_margin_search_minimizes_the_margin_violation(tmp_path, monkeypatch):
    from viasd.dimr.search import search_mask
    from viasd.models.pairs import load_pair

    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path))
    pair = load_pair({"name": "tiny-llama-6", "loader": "tiny", "family": "llama",
                      "options": {"draft_layers": 1, "target_layers": 6, "hidden": 32, "damp": 0.5}})
    cfg = SearchConfig(keep_ratio=0.5, n_random=2, n_trials=3, n_calibration=4, seq_len=12, objective="margin",
                       calibration=["builtin"], n_baseline_random=2, screen=False)
    art = search_mask(pair, cfg, progress=False)
    assert art["objective"] == "margin" and all(t["objective"] == t["margin"] >= 0 for t in art["trials"])
    assert art["value"] == min(t["objective"] for t in art["trials"])


def test_the_gate_file_enters_the_run_identity_and_defaults_leave_ids_unchanged(tmp_path):
    from tests.test_config_schema import run_id

    pair = family_pair("llama")
    path = _gate_file(tmp_path, pair, "g.pt", 0.0)
    base = ("pair=tiny-llama", "method=via_sd", "task=prompts")
    learned = run_id(*base, "method.gate=learned", f"method.gate_path={path}")
    assert run_id(*base) == run_id(*base, "method.gate=thresholds", "method.gate_threshold=0.5")
    assert learned != run_id(*base)
    _gate_file(tmp_path, pair, "g.pt", 1.0)  # same path, other coefficients: another run
    assert run_id(*base, "method.gate=learned", f"method.gate_path={path}") != learned
