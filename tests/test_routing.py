"""Routed slim verifier: full plan = the full model; subset plan = a physically smaller model."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FAMILIES, PROMPTS, tiny_pair
from tests.helpers.routing import feed, physically_pruned
from viasd.engine.routing import RoutingPlan, decoder_layers, num_layers
from viasd.engine.stream import Stream, start_sequence
from viasd.errors import ConfigError


@pytest.mark.parametrize("family", FAMILIES)
def test_full_plan_equals_full_model(family):
    pair = tiny_pair(family)
    m, n = pair.target, num_layers(pair.target)
    ids = pair.encode(PROMPTS[16])  # longer than gemma2's sliding window
    seq = torch.cat([start_sequence(m, ids), torch.randint(5, 200, (1, 9))], 1)
    a = feed(Stream(m, ids, "t"), seq, [3, 1, 5])
    b = feed(Stream(m, ids, "s", RoutingPlan.build(range(n), n)), seq, [3, 1, 5])
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
    a = feed(routed, seq, [4, 1, 4])
    b = feed(Stream(ref, ids, "ref"), seq, [4, 1, 4])
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


def test_unit_device_is_each_layers_parameter_device():
    """The resolver the routed path moves inputs with: each sub-layer's own parameters' device."""
    from viasd.engine.paths import module_device, unit_device

    m = tiny_pair("llama").target
    for i, layer in enumerate(decoder_layers(m)):
        assert unit_device(m, (i, "attn")) == layer.self_attn.q_proj.weight.device
        assert unit_device(m, (i, "mlp")) == layer.mlp.up_proj.weight.device
    assert module_device(torch.nn.ReLU()) is None


def test_unit_device_finds_the_parameters_once_and_follows_a_moved_model():
    """Resolved once per model (a routed forward asks per layer), read live: a module moved later is seen."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from viasd.engine.paths import _UNIT_MODULES, unit_device

    m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2))
    assert unit_device(m, (0, "attn")) == torch.device("cpu") and (0, "attn") in _UNIT_MODULES[m]
    decoder_layers(m)[0].to("meta")  # as a device map places it: the whole layer
    assert unit_device(m, (0, "attn")) == unit_device(m, (0, "mlp")) == torch.device("meta")
    assert unit_device(m, (1, "attn")) == torch.device("cpu")


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_routed_paths_of_a_model_split_by_an_explicit_device_map(family):
    """A model dispatched by accelerate with an explicit per-layer device_map (here over 'cpu' only):
    full and sub-layer routed streams equal the unsplit model, the cache written per layer."""
    from accelerate import dispatch_model

    pair = tiny_pair(family)
    m, n = pair.target, num_layers(pair.target)
    ids = pair.encode(PROMPTS[16])
    seq = torch.cat([start_sequence(m, ids), torch.randint(5, 200, (1, 9))], 1)
    ref = feed(Stream(m, ids, "t"), seq, [3, 1, 5])
    slim_ref = feed(Stream(m, ids, "s", RoutingPlan.build([0, 2], n)), seq, [3, 1, 5])
    dmap = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu",
            **{f"model.layers.{i}": "cpu" for i in range(n)}}
    split = dispatch_model(m, device_map=dmap)
    assert torch.equal(feed(Stream(split, ids, "s", RoutingPlan.build(range(n), n)), seq, [3, 1, 5]), ref)
    assert torch.equal(feed(Stream(split, ids, "s", RoutingPlan.build([0, 2], n)), seq, [3, 1, 5]), slim_ref)


def test_a_stream_synchronizes_every_cuda_device_of_its_model():
    """cuda_devices lists the GPUs a (split) model's parameters sit on; a CPU model has none to sync."""
    from viasd.engine.stream import cuda_devices

    m = tiny_pair("llama").target
    assert cuda_devices(m) == [] and Stream(m, torch.tensor([[1, 2]]), "t").clock.devices == []
    if torch.cuda.device_count() >= 1:  # a GPU host: the layers moved there are listed once
        m.model.layers[0].to("cuda:0")
        assert cuda_devices(m) == [torch.device("cuda:0")]
