"""The packed CPU backend: same logits as eager (full and routed), lossless decoding, dtype probe."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.conftest import FAMILIES, PROMPTS, tiny_pair
from viasd.engine.routing import RoutingPlan, num_layers
from viasd.engine.stream import Stream, start_sequence
from viasd.errors import ConfigError
from viasd.harness.bench import cost_curve, weight_bytes
from viasd.methods.api import decode
from viasd.models.backend import PackedLinear, pack_linears, packable_dtypes, probe_dtype, resolve_backend
from viasd.models.pairs import load_pair

_EAGER: dict = {}


def eager_pair(family: str):
    if family not in _EAGER:
        _EAGER[family] = load_pair(f"tiny-{family}", backend="eager")
    return _EAGER[family]


def _logits(model, ids, plan=None):
    """Logits at every position of ``ids`` (T5: of a decoder sequence built from them)."""
    stream = Stream(model, ids, "t", plan=plan)
    seq = start_sequence(model, ids)
    if model.config.is_encoder_decoder:
        seq = torch.cat([seq, ids[:, :12]], 1)
    return stream.logits(seq, last=seq.shape[1])


def test_tiny_pairs_load_packed_by_default_on_cpu():
    pair = tiny_pair("llama")
    assert pair.extras["runtime"]["backend"] == "packed"
    linears = [m for m in pair.target.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)
    # The tied LM head still shares its weight with the input embedding.
    assert pair.target.get_output_embeddings().weight is pair.target.get_input_embeddings().weight
    assert eager_pair("llama").extras["runtime"]["backend"] == "eager"


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_logits_match_eager_full_and_routed(family):
    packed, eager = tiny_pair(family), eager_pair(family)
    ids = packed.encode(PROMPTS[2])
    n = num_layers(packed.target)
    for plan in (None, RoutingPlan.build([0, n - 1], n)):
        lp, le = _logits(packed.target, ids, plan), _logits(eager.target, ids, plan)
        scale = le.abs().max().item()
        assert torch.allclose(lp, le, atol=1e-4 * max(1.0, scale), rtol=1e-4), (family, plan)
        assert (lp.argmax(-1) == le.argmax(-1)).float().mean() > 0.98


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_sd_equals_ar_on_packed_path(family):
    pair = tiny_pair(family)
    assert pair.extras["runtime"]["backend"] == "packed"
    gen = {"max_new_tokens": 19, "ignore_eos": True}
    for prompt in PROMPTS[:4]:
        ids = pair.encode(prompt)
        ref = decode(pair, ids, "ar", gen=gen).tokens
        assert decode(eager_pair(family), ids, "ar", gen=gen).tokens == ref, (family, prompt)
        for gamma in (1, 4):
            assert decode(pair, ids, "sd", {"gamma": gamma}, gen=gen).tokens == ref, (family, prompt, gamma)
        slim = {"mask": "every_other", "keep_ratio": 0.5}
        res = decode(pair, ids, "viasd", {"gamma": 3, "slim": slim}, gen=gen)
        assert len(res.tokens) == len(ref)


def test_state_dict_and_deepcopy_round_trip():
    packed, eager = tiny_pair("qwen2"), eager_pair("qwen2")
    sd = packed.target.state_dict()
    assert set(sd) == set(eager.target.state_dict())
    assert all(torch.equal(v, eager.target.state_dict()[k]) for k, v in sd.items())
    clone = copy.deepcopy(packed.target)
    assert clone.get_output_embeddings().weight is clone.get_input_embeddings().weight
    ids = packed.encode(PROMPTS[1])
    assert torch.equal(_logits(clone, ids), _logits(packed.target, ids))


def test_pack_linears_keeps_biases_and_bf16_where_supported():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False)).to(torch.bfloat16)
    x = torch.randn(3, 5, 16, dtype=torch.bfloat16)
    ref = model(x)
    assert pack_linears(model) == (2 if torch.bfloat16 in packable_dtypes() else 0)
    with torch.inference_mode():
        out = model(x)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref.float(), atol=0.05, rtol=0.05)


def test_resolve_backend_errors_name_the_fix():
    assert resolve_backend("auto", "cpu") == "packed"
    assert resolve_backend("eager", "cpu") == "eager"
    assert resolve_backend("auto", "cuda") == "eager"
    with pytest.raises(ConfigError, match="pair.backend"):
        resolve_backend("fast", "cpu")
    with pytest.raises(ConfigError, match="CPU backend"):
        resolve_backend("packed", "cuda")


def test_dtype_auto_probes_and_records_the_choice():
    name, probe = probe_dtype("cpu", hidden=64, inner=128, prefill=16, reps=1)
    assert name in ("float32", "bfloat16") and probe["float32_m1_s"] > 0 and probe["bfloat16_m16_s"] > 0
    pair = load_pair("tiny-llama", dtype="auto")
    runtime = pair.extras["runtime"]
    assert runtime["dtype"] in ("float32", "bfloat16") and runtime["dtype_probe"]
    assert next(pair.target.parameters()).dtype == getattr(torch, runtime["dtype"])


def test_cost_curve_and_weight_bytes_on_routed_subset():
    pair = tiny_pair("llama")
    n = num_layers(pair.target)
    plan = RoutingPlan.build([0], n)
    t = cost_curve(pair.target, ks=(1, 3), context=16, reps=1, plan=plan)
    assert set(t) == {1, 3} and all(v > 0 for v in t.values())
    assert 0 < weight_bytes(pair.target, plan) < weight_bytes(pair.target)
