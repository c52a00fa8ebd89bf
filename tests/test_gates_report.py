"""The gate-readings report (``experiments.replay … figure=gates``): quality as bounds from the ``ar``
run's per-example scores (a problem never left scores as ``ar`` did, a diverged one is unknown), the
reading each replayed policy belongs to, and the table and figure it writes."""

from __future__ import annotations

import json
import math

import pytest

from viasd.analysis.stats import quality_bounds
from viasd.report.gates import best_points, reading, with_bounds, write_gates


def test_quality_bounds_keep_ar_where_nothing_diverged():
    scores = [100.0, 0.0, 100.0, 100.0]
    assert quality_bounds(scores, set()) == (75.0, 75.0)
    assert quality_bounds(scores, {0}) == (50.0, 75.0)  # a solved problem left: it may be lost
    assert quality_bounds(scores, {1}) == (75.0, 100.0)  # an unsolved one left: it may be won
    assert quality_bounds(scores, {0, 1, 2, 3}) == (0.0, 100.0)
    assert all(math.isnan(v) for v in quality_bounds([], set()))


def _row(method, overrides, speed, diverged, impl="via_sd"):
    return {"method": method, "method_impl": impl, "overrides": overrides, "predicted_speedup": speed,
            "n_examples": 4, "replayed_examples": [0, 1, 2, 3], "diverged_examples": diverged,
            "divergences_per_100": 0.5 * len(diverged),
            **({"tier_share/tier1": 0.5, "tier_share/tier2": 0.2, "tier_share/tier3": 0.3} if impl == "via_sd" else {})}


ROWS = [_row("sd", ["method=sd"], 1.5, [], impl="sd"),
        _row("cascade_sd", ["method=cascade_sd"], 1.7, [], impl="cascade_sd"),
        _row("via_sd a", ["method=via_sd", "method.tau_accept=0.5"], 2.0, [0]),
        _row("via_sd b", ["method=via_sd", "method.tau_accept=0.9"], 1.6, [1]),
        _row("via_sd c", ["method=via_sd", "method.agreement=slim_rel"], 1.8, []),
        _row("via_sd d", ["method=via_sd", "method.slim.objective=margin"], 1.9, [2]),
        _row("via_sd e", ["method=via_sd", "method.gate=learned", "method.gate_path=/x/gate-lam0.7.pt"], 1.75, []),
        _row("via_sd oracle slim=auto@0.8 drafter=model gamma=4", ["method=via_sd", "method.gate=oracle"], 1.65, [])]


def test_each_policy_has_one_reading():
    assert [reading(r) for r in ROWS] == ["lossless", "lossless", "thresholds (ratio)", "thresholds (ratio)",
                                         "thresholds (slim_rel)", "margin-searched mask", "learned λ=0.7", "oracle"]


def test_best_points_never_lose_a_problem_ar_solved():
    rows = with_bounds(ROWS, [100.0, 0.0, 100.0, 100.0])
    best = best_points(rows, 75.0)
    assert best["lossless"]["method"] == "cascade_sd"
    assert best["thresholds (ratio)"]["method"] == "via_sd b"  # a (2.0×) may lose problem 0, which ar solved
    assert best["thresholds (slim_rel)"]["method"] == "via_sd c" and best["learned"]["method"] == "via_sd e"
    assert "margin-searched mask" not in best  # its only point left a solved problem
    off = {**rows[3], "predicted_speedup": 1.65, "tier_share/tier1": 0.0, "tier_share/tier2": 0.0}
    assert best_points(rows[:3] + [off], 75.0).get("thresholds (ratio)") is None  # a gate trusting nothing: sd


def test_write_gates_writes_table_figure_and_sources(tmp_path):
    paths = write_gates(ROWS, [100.0, 0.0, 100.0, 100.0], "pass@1", tmp_path, "gates_x", "run-x", "tiny")
    assert {p.rsplit(".", 1)[1] for p in paths} == {"md", "tex", "png", "pdf"}
    md = (tmp_path / "gates_x.md").read_text()
    assert "[50.0, 75.0]" in md and "learned λ=0.7" in md and "ar's pass@1 on these problems: 75.0" in md
    assert "- thresholds (ratio): 1.60× (via_sd b)" in md and "- margin-searched mask: none" in md
    assert json.loads((tmp_path / "gates_x.sources.json").read_text())["runs"] == ["run-x"]


def test_figure_gates_needs_scores(runs_dir, tmp_path, capsys):
    """A traced run without per-example task scores (task=prompts) cannot bound quality: one error line."""
    from experiments import replay as replay_cmd
    from experiments import trace as trace_cmd
    from tests.test_replay import _run

    rid = _run("method=ar")["run_id"]
    assert trace_cmd.main([f"run={rid}", "topk=400"]) == 0
    with pytest.raises(SystemExit):
        replay_cmd.main([f"run={rid}", "method=sd", f"report={tmp_path / 'g'}", "figure=gates"])
    assert "figure=gates bounds quality" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        replay_cmd.main([f"run={rid}", "method=sd", f"report={tmp_path / 'g'}", "figure=gate"])
    assert "use figure=frontier (default) or figure=gates" in capsys.readouterr().err


def test_the_shipped_gates_grid_composes():
    """``conf/replay/gates_frontier.yaml``: the lossless methods, the paper's gate over four masks and two
    drafters, slim_rel and the margin-searched mask — every policy composes as ``experiments.run`` would."""
    from experiments import replay as replay_cmd
    from viasd.paths import PROJECT_ROOT

    policies = replay_cmd.policies_for(replay_cmd.grid_overrides(str(PROJECT_ROOT / "conf/replay/gates_frontier.yaml")))
    assert len(policies) == 4 + 96 + 24 + 12
    assert {p.cfg.agreement for p in policies if p.method == "via_sd"} == {"ratio", "slim_rel"}
    assert sum(p.cfg.slim.objective == "margin" for p in policies if p.method == "via_sd") == 12
