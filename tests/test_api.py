"""The public Python API (viasd.api, re-exported from ``viasd``): in-memory pairs, decode, trace, replay.

The same models, prompt and config through the API and through ``python -m experiments.run`` give the
same tokens and counters; bad input is one ConfigError line naming the fix.
"""

from __future__ import annotations

import json

import pytest
import torch

import viasd
from tests.conftest import tiny_pair
from tests.helpers.app import run_app
from viasd.errors import ConfigError
from viasd.models.tiny import build_model

COUNTERS = ("new_tokens", "drafted", "accepted", "rejected", "bonus", "corrected", "rounds", "target_calls",
            "draft_calls", "stop_reason")


@pytest.fixture(scope="module")
def pair():
    p = tiny_pair("llama")  # the models experiments.run loads for pair=tiny-llama, held in memory
    return viasd.pair_from_models(p.target, p.tokenizer, p.draft)


def test_api_matches_experiments_run(pair, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("The river flows", "Count: one, two")))
    r = run_app("pair=tiny-llama", "method=cascade_sd", "method.drafter.max_gamma=6", "task=prompts",
                f"task.path={prompts}", "generation.max_new_tokens=20", "seed=3", runs=tmp_path / "runs",
                timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (run,) = [d for d in (tmp_path / "runs").iterdir() if (d / "summary.json").is_file()]
    records = [json.loads(line) for line in (run / "examples.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for i, rec in enumerate(records):
        out = viasd.generate(pair, rec["prompt"], "cascade_sd", drafter={"max_gamma": 6}, max_new_tokens=20,
                             seed=3 + i)
        assert out.tokens == rec["token_ids"]
        s = out.summary()
        assert {k: s.get(k) for k in COUNTERS} == {k: rec.get(k) for k in COUNTERS}
        assert {k: v for k, v in out.counters.tiers.items()} == {k: rec[k] for k in out.counters.tiers}
        assert out.text == rec["raw_output"]


def test_every_method_decodes_and_lossless_ones_agree(pair):
    ar = viasd.generate(pair, "Hello there", "ar", max_new_tokens=12)
    assert ar.counters.rounds == 12 and ar.text is not None
    for method, knobs in [("sd", {"gamma": 3}), ("sd_ngram", {}), ("cascade_sd", {}), ("hf_assisted", {})]:
        out = viasd.generate(pair, "Hello there", method, max_new_tokens=12, **knobs)
        assert out.tokens == ar.tokens, method
    for ids in (pair.encode("Hello there"), pair.encode("Hello there")[0].tolist()):
        assert viasd.generate(pair, ids, "ar", max_new_tokens=12).tokens == ar.tokens
    via = viasd.generate(pair, "Hello there", "via_sd", slim={"mask": "every_other"}, tau_accept=0.9,
                         max_new_tokens=12)
    assert via.new_tokens == 12 and via.counters.drafted > 0


def test_trace_and_replay_what_was_decoded(pair):
    prompts = ["Hello there, world", "Once upon a time"]
    res = [viasd.generate(pair, p, "sd", gamma=4, max_new_tokens=16) for p in prompts]
    traces = viasd.trace(pair, prompts, res, slim={"mask": "every_other"})
    same = viasd.replay_policy(traces, "sd", gamma=4)
    assert same["new_tokens"] == sum(r.new_tokens for r in res)
    assert same["rounds"] == sum(r.counters.rounds for r in res)
    assert same["accepted"] == sum(r.counters.accepted for r in res)
    via = viasd.replay_policy(traces, "via_sd", slim={"mask": "every_other"}, tau_accept=0.9)
    assert via["new_tokens"] > 0 and via["method_impl"] == "via_sd" and "exact" in via
    with pytest.raises(ConfigError, match="unknown knob 'max_new_tokens'"):
        viasd.replay_policy(traces, "sd", max_new_tokens=3)


def test_bad_input_is_one_line(pair):
    cases = [
        (lambda: viasd.generate(pair, "x", "sd", gama=3), "unknown knob 'gama' for method 'sd'; method knobs: gamma"),
        (lambda: viasd.generate(pair, ["a", "b"], "sd"), "batch size is 1"),
        (lambda: viasd.generate(pair, torch.ones(2, 3, dtype=torch.long), "sd"), "batch size is 1"),
        (lambda: viasd.generate(pair, "x", "sdd"), "Did you mean 'sd'"),
        (lambda: viasd.pair_from_models(pair.target, pair.tokenizer, build_model("llama", 1, 64, vocab=300)),
         "vocabulary mismatch"),
        (lambda: viasd.pair_from_models(pair.target, "not a tokenizer"), "tokenizer must be"),
    ]
    for call, needle in cases:
        with pytest.raises(ConfigError) as e:
            call()
        assert needle in str(e.value) and "\n" not in str(e.value)
