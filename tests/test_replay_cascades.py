"""``faster_cascades`` in replay (``viasd.analysis.deferral``): over its own greedy trajectory a replay
reproduces a live decode's counters (``deferred`` past a rejection is an estimate); over an ``ar``
trajectory it is exact up to its first divergence, a lenience of −2 (``π = q``) is ``sd`` and never
diverges, a lenience of 1 (``π = p``) accepts every draft token; the rules' reduced rows are the
rules' own decisions; the shipped frontier grid composes."""

from __future__ import annotations

import pytest
import torch

from experiments import replay as replay_cmd
from experiments import trace as trace_cmd
from tests.test_replay import PROMPTS, _run, check_own_trajectory, tiny, traced
from viasd.analysis.deferral import greedy_targets
from viasd.analysis.replay import Policy, replay
from viasd.core.cascade_rules import RULES, target_distribution
from viasd.engine.result import aggregate
from viasd.errors import ConfigError
from viasd.methods.api import decode, method_config
from viasd.paths import PROJECT_ROOT

GEN = {"max_new_tokens": 16, "ignore_eos": True}
OWN = [{"rule": "chow", "alpha": 0.3}, {"rule": "token_v3", "alpha": 0.5}, {"rule": "token_v2", "alpha": 0.2},
       {"rule": "opt", "alpha": 0.3}, {"rule": "diff", "alpha": 0.1}, {"rule": "token_v1", "alpha": 0.1},
       {"rule": "chow", "alpha": 0.5, "drafter": {"name": "ngram"}},
       {"rule": "token_v3", "alpha": 0.5, "drafter": {"name": "hybrid"}}]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_replay_over_its_own_trajectory_reproduces_a_faster_cascades_decode(family, tmp_path):
    estimated = 0
    more = [{"rule": "diff", "alpha": 0.2, "drafter": {"name": "self", "layers": [0, 2]}}] if family == "llama" else []
    for cfg in OWN + more:
        out = check_own_trajectory(tiny(family), tmp_path, "faster_cascades", {"gamma": 3, **cfg})
        assert set(out["estimated"]) <= {"deferred"} and out["replay/gate_undetermined"] == 0
        assert out["exact"] == (not out["estimated"])
        estimated += bool(out["estimated"])
    assert estimated  # some rounds rejected: their later positions' rule decisions are not in the trace


def _first_differences(real: list[list[int]], ar: list[list[int]]) -> int:
    return sum(next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(real, ar))


def test_over_an_ar_trajectory_faster_cascades_is_exact_to_its_divergence_and_its_lenience_limits(tmp_path):
    pair = tiny("qwen2")
    ar = [decode(pair, pair.encode(p), "ar", {}, GEN).tokens for p in PROMPTS]
    traces = traced(pair, tmp_path, PROMPTS, ar, max_new=16)
    sd = aggregate([decode(pair, pair.encode(p), "sd", {"gamma": 4}, GEN) for p in PROMPTS])
    lossy = 0
    for rule in RULES.names():
        off = replay(traces, Policy("faster_cascades", method_config("faster_cascades",
                                                                     {"gamma": 4, "rule": rule, "alpha": -2.0})))
        assert off["replay/divergences"] == 0 and set(off["estimated"]) <= {"deferred"}  # π = q: lossless
        assert {k: off[k] for k in ("target_calls", "target_tokens", "accepted", "rounds")} == {
            k: sd[k] for k in ("target_calls", "target_tokens", "accepted", "rounds")}
        on = replay(traces, Policy("faster_cascades", method_config("faster_cascades",
                                                                    {"gamma": 4, "rule": rule, "alpha": 1.0})))
        assert on["precision/tier3_n"] == 0 and on["precision/tier1_n"] == on["new_tokens"]  # π = p: all kept
        if rule in ("token_v2", "token_v3"):  # α = 0: the accepted set is the target's argmax (lossless)
            zero = replay(traces, Policy("faster_cascades", method_config("faster_cascades",
                                                                          {"gamma": 4, "rule": rule, "alpha": 0.0})))
            assert zero["replay/divergences"] == 0
    for cfg in ({"rule": "chow", "alpha": 0.3}, {"rule": "token_v2", "alpha": 0.1}, {"rule": "diff", "alpha": 0.2},
                {"rule": "token_v3", "alpha": 0.6}):
        cfg = {"gamma": 4, **cfg}
        out = replay(traces, Policy("faster_cascades", method_config("faster_cascades", cfg)))
        real = [decode(pair, pair.encode(p), "faster_cascades", cfg, GEN).tokens for p in PROMPTS]
        first = _first_differences(real, ar)
        assert out["replay/tokens_to_first_divergence"] == first
        assert out["exact"] == (first == sum(map(len, ar)) and not out["replay/deferral_unknown"])
        lossy += first < sum(map(len, ar))
    assert lossy  # at least one of them leaves the ar trajectory


def test_reduced_rows_give_the_rules_decisions_on_full_rows():
    """A greedy position's π from the reduced rows equals the rule on the full ``[V]`` rows."""
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        p1, q1 = (torch.randn(2, 12, generator=g, dtype=torch.float64) * 2).softmax(-1)
        y, z = int(p1.argmax()), int(q1.argmax())
        if torch.rand(1, generator=g) < 0.3:
            y = int(torch.randint(12, (1,), generator=g))  # a lookup-like token (not the drafter's argmax)
            p1 = torch.nn.functional.one_hot(torch.tensor(y), 12).double()
        p, q = (torch.nn.functional.one_hot(torch.tensor(v), 12).double() for v in (y, z))
        for rule in RULES.names():
            for alpha in (-2.0, 0.0, 0.1, 0.3, 0.6, 1.0):
                full = target_distribution(rule, p, q, alpha, p1, q1, greedy=True)
                _, pi, deferred, vocab = greedy_targets(rule, alpha, [y], [z], [float(p1[y])], [float(q1[z])],
                                                        [float(q1[y])])
                assert vocab[int(pi[0].argmax())] == int(full.argmax()), (rule, alpha)
                assert bool(deferred[0]) == bool((target_distribution(rule, p, q, alpha, p1, q1) != p).any())


def test_replay_refuses_a_cascade_drafter(tmp_path):
    pair = tiny("llama")
    traces = traced(pair, tmp_path, PROMPTS[:1], [[5, 6, 7]], max_new=3)
    with pytest.raises(ConfigError, match="faster_cascades replay supports drafters model, ngram, hybrid, self"):
        replay(traces, Policy("faster_cascades", method_config("faster_cascades", {"drafter": {"name": "cascade"}})))


def test_the_shipped_faster_cascades_frontier_grid_composes():
    groups = replay_cmd.grid_overrides(str(PROJECT_ROOT / "conf" / "replay" / "faster_cascades_frontier.yaml"))
    assert sum(g[0] == "method=faster_cascades" for g in groups) >= 40
    policies = replay_cmd.policies_for(groups[:2] + groups[-1:])
    assert all(p.method in ("faster_cascades", "sd") for p in policies)
    rules = {o.split("=", 1)[1] for g in groups for o in g if o.startswith("method.rule=")}
    assert {"chow", "opt", "token_v1"} <= rules


def test_the_replay_command_writes_a_frontier_with_faster_cascades_labelled(runs_dir, tmp_path, capsys):
    rid = _run("method=ar")["run_id"]
    assert trace_cmd.main([f"run={rid}", "topk=400"]) == 0
    grid = tmp_path / "grid.yaml"
    grid.write_text("policies:\n  - {method: sd}\n  - {method: faster_cascades, method.rule: [chow, token_v2], "
                    "method.alpha: [0.1, 0.5]}\n")
    both = tmp_path / "both.yaml"
    both.write_text("policies:\n  - {method: [sd, cascade_sd]}\n")
    assert replay_cmd.main([f"run={rid}", f"grid={grid},{both}", f"report={tmp_path / 'f'}"]) == 0
    table = (tmp_path / "f.md").read_text()
    assert table.count("| faster_cascades rule=") == 4 and "kept from the drafter" in table
    assert table.count("| sd ") == 1 and table.count("| cascade_sd ") == 1  # two grids, a shared policy once
    assert (tmp_path / "f.png").is_file()
