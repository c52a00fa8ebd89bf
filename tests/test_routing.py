"""Routed slim verifier: full plan = the full model; subset plan = a physically smaller model."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import FAMILIES, PROMPTS, tiny_pair
from viasd.decoding.cache import Stream, start_sequence
from viasd.errors import ConfigError
from viasd.models.backend import PackedLinear, apply_backend
from viasd.models.routing import RoutingPlan, decoder_layers, num_layers


def physically_pruned(model, kept):
    """A reference model built with only ``kept`` decoder layers (weights copied)."""
    cfg = copy.deepcopy(model.config)
    if cfg.is_encoder_decoder:
        cfg.num_decoder_layers = len(kept)
    else:
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = [cfg.layer_types[i] for i in kept]
        cfg.num_hidden_layers = len(kept)
    ref = type(model)(cfg).eval()
    sd = model.state_dict()
    new = {}
    for k in ref.state_dict():
        src = k
        for stem in ("model.layers.", "decoder.block."):
            if k.startswith(stem):
                j = int(k[len(stem):].split(".")[0])
                src = f"{stem}{kept[j]}." + k[len(stem):].split(".", 1)[1]
        new[k] = sd[src]
    ref.load_state_dict(new)
    apply_backend(ref, "packed" if any(isinstance(x, PackedLinear) for x in model.modules()) else "eager")
    return ref


def _feed(stream, seq, chunks):
    outs, cut = [], seq.shape[1] - sum(chunks)
    for c in chunks:
        cut += c
        outs.append(stream.logits(seq[:, :cut], last=c))
    return torch.cat(outs, 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_full_plan_equals_full_model(family):
    pair = tiny_pair(family)
    m, n = pair.target, num_layers(pair.target)
    ids = pair.encode(PROMPTS[16])  # longer than gemma2's sliding window
    seq = torch.cat([start_sequence(m, ids), torch.randint(5, 200, (1, 9))], 1)
    a = _feed(Stream(m, ids, "t"), seq, [3, 1, 5])
    b = _feed(Stream(m, ids, "s", RoutingPlan.build(range(n), n)), seq, [3, 1, 5])
    assert torch.equal(a, b)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kept", [[0, 2], [0, 1, 3], [0]])
def test_subset_plan_equals_pruned_model(family, kept):
    pair = tiny_pair(family)
    m, n = pair.target, num_layers(pair.target)
    ref = physically_pruned(m, kept)
    ids = pair.encode(PROMPTS[16])
    seq = torch.cat([start_sequence(m, ids), torch.randint(5, 200, (1, 9))], 1)
    routed = Stream(m, ids, "slim", RoutingPlan.build(kept, n))
    a = _feed(routed, seq, [4, 1, 4])
    b = _feed(Stream(ref, ids, "ref"), seq, [4, 1, 4])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # The slim cache holds entries for the kept layers only.
    cache = routed.cache.self_attention_cache if pair.is_encoder_decoder else routed.cache
    filled = [i for i, layer in enumerate(cache.layers) if getattr(layer, "keys", None) is not None
              and layer.keys.numel()]
    assert filled == kept
    # Rollback crops every kept layer to the same absolute length.
    routed.rollback(seq.shape[1] - 5)
    assert {cache.layers[i].keys.shape[-2] for i in kept} == {seq.shape[1] - 5}
    assert len(decoder_layers(m)) == n  # the model itself is untouched


def test_bad_plans_are_clear_errors():
    with pytest.raises(ConfigError, match="does not fit the model: layers \\[7\\] are outside 0..3"):
        RoutingPlan.build([0, 7], 4)
    with pytest.raises(ConfigError, match="skips layer 0"):
        RoutingPlan.build([1, 2], 4)
    with pytest.raises(ConfigError, match="keeps no layer"):
        RoutingPlan.build([], 4)
