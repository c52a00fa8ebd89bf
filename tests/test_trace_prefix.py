"""A trace feeds the prompts' shared token prefix once (``TraceSettings.share_prefix``, ``PrefixKV`` in
viasd/engine/stream.py) and gives the rows of the trace that feeds every prompt whole, on every family:
the same argmax and top-k ids at every row, logits and log-normalizers equal within fp32 chunking noise,
and the same replay decisions — for the target, the draft, a routed slim mask and a self-drafter plan.

Tolerance: a forward over positions ``S..`` after a cached prefix computes each row by the same
arithmetic as one over ``0..``, but the matrix products run with other shapes, so sums may be added in
another order: relative 1e-5 of the largest logit (T5's logits reach ~200), as for the shared slim prefix
(tests/test_shared_prefix.py). Ties within that noise would make an argmax differ; none occurs here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_families import family_pair
from viasd.analysis.replay import Policy, TraceSet, replay
from viasd.analysis.trace import Example, TraceFile, TraceSettings, prompt_prefix_kv, subjects_for, trace_run
from viasd.engine.routing import RoutingPlan
from viasd.engine.stream import PrefixKV, Stream, prefix_kv
from viasd.methods.api import decode, method_config
from viasd.methods.via_sd import SlimConfig
from viasd.models.tiny import FAMILIES

FEW_SHOT = "Q: What is 2 plus 3?\nA: 5\n\nQ: What is 4 times 4?\nA: 16\n\nQ: What is 9 minus 7?\nA: 2\n\n"
QUESTIONS = ["Q: What is 6 plus 1?\nA:", "Q: What is 3 times 5?\nA:", "Q: What is 8 minus 8?\nA:"]
GEN = {"max_new_tokens": 20, "ignore_eos": True}
MASK = {"slim": {"mask": [0, 1, 3]}, "tau_accept": 0.3, "tau_slim": 0.3}
POLICIES = [("ar", {}), ("sd", {"gamma": 3}), ("sd", {"gamma": 4, "drafter": {"name": "ngram"}}), ("via_sd", MASK),
            ("via_sd", {**MASK, "tau_accept": 0.5, "tau_slim": 0.6, "drafter": {"name": "self", "layers": [0, 2]}})]


def _traces(pair, tmp_path, share: bool):
    prompts = [FEW_SHOT + q for q in QUESTIONS]
    outputs = [decode(pair, pair.encode(p), "ar", {}, GEN).tokens for p in prompts]
    examples = [Example(pair.encode(p), list(o)) for p, o in zip(prompts, outputs)]
    folder = tmp_path / ("shared" if share else "whole")
    subjects = subjects_for(pair, [SlimConfig(mask=[0, 1, 3])], True, False, [[0, 2]])
    meta = {"run_id": "test", "max_new_tokens": GEN["max_new_tokens"], "temperature": 0.0,
            "encoder_decoder": pair.is_encoder_decoder}
    trace_run(folder, pair, examples, subjects, TraceSettings(topk=8, temperatures=[1.0, 2.0], share_prefix=share),
              meta, log=lambda s: None)
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trace_from_the_shared_prefix_is_the_whole_prompt_trace(family, tmp_path):
    pair = family_pair(family)
    shared, whole = _traces(pair, tmp_path, True), _traces(pair, tmp_path, False)
    files = sorted(p.name for p in whole.glob("*.npz"))
    assert files == sorted(p.name for p in shared.glob("*.npz")) and len(files) == 4  # target, draft, mask, self
    for name in files:
        a, b = TraceFile(shared / name), TraceFile(whole / name)
        assert b.meta["prefix_tokens"] == 0
        assert (a.meta["prefix_tokens"] > 20) == (not pair.is_encoder_decoder), (family, name)  # T5: none shared
        assert np.array_equal(a.data["argmax"], b.data["argmax"]), (family, name)
        assert np.array_equal(a.data["topk_ids"], b.data["topk_ids"]), (family, name)
        scale = float(np.abs(b.data["topk_logits"]).max())
        for key in ("topk_logits", "lse", "cand_logits"):
            np.testing.assert_allclose(a.data[key], b.data[key], rtol=1e-5, atol=1e-5 * scale, equal_nan=True,
                                       err_msg=f"{family} {name} {key}")
    for method, cfg in POLICIES:  # replay decides the same on both
        got, want = (replay(TraceSet(f), Policy(method, method_config(method, cfg))) for f in (shared, whole))
        assert got == want, (family, method)


def test_a_stream_from_a_prefix_kv_rolls_back_into_it_without_touching_it():
    pair = family_pair("gemma2")  # sliding-window layers: the prefix is longer than the window
    ids = pair.encode(FEW_SHOT + QUESTIONS[0])
    plan = RoutingPlan.build([0, 1, 3], 4)
    for p in (None, plan):
        kv = prefix_kv(pair.target, ids[:, :40], p)
        before = [layer.keys.clone() for layer in kv.layers if getattr(layer, "keys", None) is not None]
        other = ids.clone()
        other[0, 30] = (other[0, 30] + 1) % 200  # leaves the prefix at position 30: rolled back into it
        for seq in (ids, other, ids):
            got = Stream(pair.target, seq, "s", p, start=kv).logits(seq, last=5)
            want = Stream(pair.target, seq, "s", p).logits(seq, last=5)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        after = [layer.keys for layer in kv.layers if getattr(layer, "keys", None) is not None]
        assert len(after) == len(before) > 0 and all(torch.equal(x, y) for x, y in zip(before, after))
        assert kv.tokens.shape[1] == 40
    with pytest.raises(ValueError, match="its own model and plan"):
        Stream(pair.target, ids, "s", None, start=prefix_kv(pair.target, ids[:, :40], plan))


def test_no_prefix_kv_for_an_encoder_decoder_or_a_single_prompt():
    t5, llama = family_pair("t5"), family_pair("llama")
    ids = t5.encode(FEW_SHOT + QUESTIONS[0])
    assert prompt_prefix_kv(t5.target, None, [ids, ids]) is None
    with pytest.raises(ValueError, match="decoder-only"):
        PrefixKV(Stream(t5.target, ids, "s"))
    one = llama.encode(FEW_SHOT)
    assert prompt_prefix_kv(llama.target, None, [one]) is None
    assert prompt_prefix_kv(llama.target, None, [one, llama.encode("Zebra")]) is None  # nothing shared
