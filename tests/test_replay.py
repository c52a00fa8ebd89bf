"""Trace replay is exact: replaying a finished greedy decode over its own trajectory reproduces its
counters — target calls and tokens, drafted, accepted, every tier counter, the audit, draft calls
where the proposal length does not depend on draft outputs after a rejected token — for every
method on tiny pairs of every family and on the embedded SmolLM2 pair; over an ``ar``
trajectory, ``via_sd`` with τ > 1 is ``sd`` of the same drafter, and a lossy policy is exact up
to its first divergence."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from experiments import replay as replay_cmd
from experiments import trace as trace_cmd
from tests.test_families import family_pair
from viasd.analysis.replay import Policy, TraceSet, replay
from viasd.analysis.trace import Example, TraceSettings, subjects_for, trace_run
from viasd.engine.result import aggregate
from viasd.harness.runner import run
from viasd.methods.api import decode, method_config
from viasd.models.pairs import ModelPair, load_pair
from viasd.models.tiny import FAMILIES, build_tiny_pair
from viasd.paths import PROJECT_ROOT

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown", "Q: What is 12 times 7?\nA:"]
GEN = {"max_new_tokens": 12, "ignore_eos": True}
MASK = {"slim": {"mask": [0, 1, 3]}, "tau_accept": 0.3, "tau_slim": 0.3}
CORE = [("ar", {}), ("sd", {"gamma": 3}), ("sd", {"gamma": 4, "drafter": {"name": "ngram"}}), ("cascade_sd", {}),
        ("via_sd", MASK)]
MORE = [("sd", {"gamma": 3, "drafter": {"name": "hybrid"}}),
        ("sd", {"gamma": 2, "drafter": {"name": "self", "layers": [0, 2]}}),
        ("sd", {"gamma": 3, "drafter": {"length_policy": "heuristic"}}),
        ("via_sd", {**MASK, "tau_accept": 0.5, "tau_slim": 0.5, "drafter": {"name": "ngram"}}),
        ("via_sd", {**MASK, "agreement": "tv", "tau_accept": 0.4, "tau_slim": 0.2, "max_unverified": 5}),
        ("via_sd", {**MASK, "reverify_on_escalation": True, "tau_escalate": 0.1, "gate_temperature": 2.0}),
        ("via_sd", {**MASK, "drafter": {"name": "hybrid"}, "tier1_needs_slim_argmax": True}),
        ("via_sd", {**MASK, "tier1_min_draft_confidence": 0.2, "drafter": {"name": "self", "layers": [0, 2]}}),
        ("via_sd", {**MASK, "drafter": {"name": "cascade"}})]
tiny = family_pair  # the session-cached tiny pair of each family


def traced(pair, tmp_path, prompts, outputs, slims=(), selves=(), temps=(1.0,), max_new=GEN["max_new_tokens"],
           topk=100_000):
    """Trace ``pair`` along ``outputs`` (default: full rows, every gate exact) and load it."""
    folder = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
    examples = [Example(pair.encode(p), list(o)) for p, o in zip(prompts, outputs)]
    meta = {"run_id": "test", "max_new_tokens": max_new, "temperature": 0.0,
            "encoder_decoder": pair.is_encoder_decoder}
    trace_run(folder, pair, examples, subjects_for(pair, list(slims), True, False, list(selves)),
              TraceSettings(topk=topk, temperatures=list(temps)), meta, log=lambda s: None)
    return TraceSet(folder)


def check_own_trajectory(pair, tmp_path, method: str, cfg: dict, prompts=PROMPTS, gen=GEN, topk=100_000) -> dict:
    """Decode, trace the outputs, replay the same policy: every counter of the decode is reproduced."""
    results = [decode(pair, pair.encode(p), method, cfg, gen) for p in prompts]
    typed = method_config(method, cfg)
    drafter = getattr(typed, "drafter", None)
    selves = [drafter.layers] if drafter is not None and drafter.name == "self" else []
    temps = sorted({1.0, float(getattr(typed, "gate_temperature", 1.0))})
    traces = traced(pair, tmp_path, prompts, [r.tokens for r in results], getattr(typed, "slim", None) and [typed.slim]
                    or [], selves, temps, gen["max_new_tokens"], topk)
    out = replay(traces, Policy(method, typed))
    real = aggregate(results)
    counters = [k for k, v in real.items() if isinstance(v, int) and not k.endswith("_s")]
    diff = {k: (real[k], out.get(k, 0)) for k in counters if k not in out["estimated"] and real[k] != out.get(k, 0)}
    assert not diff, (pair.name, method, cfg, diff)
    assert out["replay/divergences"] == 0 and out["new_tokens"] == real["new_tokens"]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_over_a_runs_own_trajectory_reproduces_its_counters(family, tmp_path):
    for method, cfg in CORE + (MORE if family == "llama" else []):
        out = check_own_trajectory(tiny(family), tmp_path, method, cfg)
        assert out["exact"] == (method != "cascade_sd" and cfg.get("drafter", {}).get("name") != "cascade")
        assert set(out["estimated"]) <= {"draft_calls", "draft_tokens", "bigram_fallback_tokens",
                                         "level0_ngram_drafted_for_model", "level0_ngram_accepted_by_model"}


def test_via_sd_with_the_tiers_off_over_an_ar_trajectory_is_sd_and_lossy_is_exact_to_its_divergence(tmp_path):
    pair = tiny("qwen2")
    gen = {"max_new_tokens": 16, "ignore_eos": True}
    ar = [decode(pair, pair.encode(p), "ar", {}, gen) for p in PROMPTS]
    traces = traced(pair, tmp_path, PROMPTS, [r.tokens for r in ar], [method_config("via_sd", MASK).slim], max_new=16)
    for drafter in ("model", "ngram"):
        sd = aggregate([decode(pair, pair.encode(p), "sd", {"gamma": 4, "drafter": {"name": drafter}}, gen)
                        for p in PROMPTS])
        off = replay(traces, Policy("via_sd", method_config("via_sd", {**MASK, "tau_accept": 1.1, "tau_slim": 1.1,
                                                                        "drafter": {"name": drafter}})))
        assert off["target_calls"] == sd["target_calls"] and off["accepted"] == sd["accepted"] and off["exact"]
    lossy = {**MASK, "tau_accept": 0.2, "tau_slim": 0.2}
    out = replay(traces, Policy("via_sd", method_config("via_sd", lossy)))
    real = [decode(pair, pair.encode(p), "via_sd", lossy, gen).tokens for p in PROMPTS]
    first = [next((j for j, (a, b) in enumerate(zip(x, r.tokens)) if a != b), len(x)) for x, r in zip(real, ar)]
    assert out["replay/tokens_to_first_divergence"] == sum(first) > 0 and not out["exact"]
    assert out["divergences_per_100"] > 0 and 0 <= out["precision/tier1_lo"] <= out["precision/tier1"] <= 1


@pytest.mark.real_model
def test_replay_is_exact_on_the_embedded_smollm2_pair(tmp_path):
    pair = load_pair("smollm2")
    prompts = ["Write a Python function that returns the sum of a list. def total(xs):"]
    gen = {"max_new_tokens": 8, "ignore_eos": True}
    for method, cfg in [("sd", {"gamma": 3, "drafter": {"name": "self"}}),
                        ("via_sd", {"drafter": {"name": "ngram"}, "slim": {"keep_ratio": 0.8}, "tau_accept": 0.5}),
                        ("via_sd", {"drafter": {"name": "self"}, "slim": {"keep_ratio": 0.9}, "tau_accept": 0.3,
                                    "tau_slim": 0.3})]:
        check_own_trajectory(pair, tmp_path, method, cfg, prompts, gen, topk=64)  # a real vocabulary: top-k


def _run(*overrides):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return run(compose(config_name="config", overrides=["pair=tiny-llama", "task=prompts", "task.n_examples=2",
                                                             "generation.max_new_tokens=10", *overrides]))


def test_trace_and_replay_commands_on_a_finished_run(runs_dir, tmp_path, capsys):
    via = _run("method=via_sd", "method.slim.mask=[0,1,3]", "method.tau_accept=0.3", "method.tau_slim=0.3")
    rid = via["run_id"]
    assert trace_cmd.main([f"run={rid}", "masks=[every_other@0.5]", "topk=400"]) == 0
    assert "trace s / run's decode s" in capsys.readouterr().out
    assert trace_cmd.main([f"run={rid}", "topk=400"]) == 0 and "reused" in capsys.readouterr().out  # files reused
    out = tmp_path / "own.json"
    assert replay_cmd.main([f"run={rid}", f"out={out}"]) == 0
    assert "reproduces its counters" in capsys.readouterr().out
    (own,) = json.loads(out.read_text())
    summary = json.loads((runs_dir / rid / "summary.json").read_text())
    assert {k: own[k] for k in replay_cmd.CHECKED if k in summary} == {k: summary[k] for k in replay_cmd.CHECKED
                                                                        if k in summary}
    grid = tmp_path / "grid.yaml"
    grid.write_text("policies:\n  - {method: [sd, sd_ngram]}\n"
                    "  - {method: via_sd, method.slim.mask: '[0,1,3]', method.tau_accept: [0.5, 1.1]}\n")
    assert replay_cmd.main([f"run={rid}", f"grid={grid}", "method=via_sd", "method.slim.keep_ratio=0.5",
                            "method.slim.mask=every_other", "method.tau_slim=0.3,1.1", f"out={out}",
                            f"report={tmp_path / 'f'}"]) == 0
    assert (tmp_path / "f.md").read_text().count("| via_sd") == 4 and (tmp_path / "f.png").is_file()
    assert [r["method"] for r in json.loads(out.read_text())] == [
        "via_sd slim.keep_ratio=0.5 slim.mask=every_other tau_slim=0.3",
        "via_sd slim.keep_ratio=0.5 slim.mask=every_other tau_slim=1.1", "sd", "sd_ngram",
        "via_sd slim.mask=[0,1,3] tau_accept=0.5", "via_sd slim.mask=[0,1,3] tau_accept=1.1"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        replay_cmd.main([f"run={rid}", "method=via_sd", "method.slim.mask=first_k"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no trace of 'first_k@0.80'" in err and "experiments.trace run=" in err


def test_a_sampled_run_gives_expected_sd_counters(tmp_path):
    """A draft equal to the target (the extra layers' residual damped to 0): every acceptance probability
    is 1, so the expected counters are exactly a real sampled sd run's."""
    draft, target, tok = build_tiny_pair("llama", damp=0.0)
    pair = ModelPair(name="tiny-same", target=target, draft=draft, tokenizer=tok)
    gen = {"max_new_tokens": 14, "ignore_eos": True, "temperature": 1.0}
    ar = decode(pair, pair.encode(PROMPTS[0]), "ar", {}, gen, seed=3)
    folder = tmp_path / "s"
    meta = {"run_id": "s", "max_new_tokens": 14, "temperature": 1.0, "encoder_decoder": False}
    trace_run(folder, pair, [Example(pair.encode(PROMPTS[0]), ar.tokens)], subjects_for(pair),
              TraceSettings(topk=100_000), meta, log=lambda s: None)
    out = replay(TraceSet(folder), Policy("sd", method_config("sd", {"gamma": 3})))
    sd = decode(pair, pair.encode(PROMPTS[0]), "sd", {"gamma": 3}, gen, seed=3)
    assert out["expected"] and not out["exact"]
    assert out["target_calls"] == pytest.approx(sd.models["target"].calls, abs=1e-3)
    assert out["accepted"] == pytest.approx(sd.counters.accepted, abs=1e-3)
    with pytest.raises(Exception, match="sampling replay covers sd only"):
        replay(TraceSet(folder), Policy("via_sd", method_config("via_sd", MASK)))


def test_the_shipped_frontier_grid_has_200_policies_that_compose():
    groups = replay_cmd.grid_overrides(str(PROJECT_ROOT / "conf" / "replay" / "via_sd_frontier.yaml"))
    assert len(groups) >= 200 and sum(g[0] == "method=via_sd" for g in groups) >= 200
    policies = replay_cmd.policies_for(groups[:4] + groups[-2:])
    assert [p.method for p in policies] == ["sd", "sd", "sd", "cascade_sd", "via_sd", "via_sd"]
    assert policies[-1].cfg.tier1_min_draft_confidence == 0.8 and policies[0].cfg.drafter.name == "model"


def test_trace_pair_overrides_add_an_intermediate_the_run_did_not_load():
    """``pair.intermediate.id=…`` traces table4's independent intermediate along an ``ar`` run whose pair
    had none; an intermediate that is the draft is one model (traced once, as the draft)."""
    from omegaconf import OmegaConf

    from viasd.models.pairs import intermediate_is_draft
    from viasd.models.pairs import pair_config as typed_pair_config

    stored = {"name": "qwen2.5-coder-0.5b-1.5b", "loader": "gguf_index", "draft": {"id": "qwen2.5-coder-0.5b-instruct"},
              "target": {"id": "qwen2.5-coder-1.5b-instruct"}, "options": {}}
    args = trace_cmd.parse_args(["run=x", "pair.intermediate.id=qwen2.5-coder-0.5b-instruct"], trace_cmd.TraceArgs)
    cfg = typed_pair_config(OmegaConf.to_container(trace_cmd.pair_config(stored, args.pair)))
    assert cfg.intermediate.id == "qwen2.5-coder-0.5b-instruct" and intermediate_is_draft(cfg)
    assert cfg.options["slim_layers"]["0.80"]  # the shipped masks still come from conf/pair
    assert typed_pair_config(OmegaConf.to_container(trace_cmd.pair_config(stored))).intermediate is None


def test_trace_refuses_a_pair_override_that_changes_the_target(capsys):
    """The trajectory is the run's target's: ``pair.target.…`` on ``trace`` is one clear error, not a trace of
    another model along it."""
    with pytest.raises(SystemExit):
        trace_cmd.main(["run=x", "pair.target.id=qwen2.5-coder-1.5b-instruct"])
    err = capsys.readouterr().err
    assert "not the target" in err and "Traceback" not in err
