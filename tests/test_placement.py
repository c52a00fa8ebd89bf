"""Placement of a pair's models (viasd.models.placement): one GPU when it fits, a balanced split, no silent offload."""

from __future__ import annotations

import pytest
import torch
from accelerate import init_empty_weights
from transformers import AutoModelForCausalLM, LlamaConfig

from viasd.errors import ConfigError
from viasd.models.pairs import auto_device_map
from viasd.models.placement import model_bytes, place

CFG = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000)


def _meta(dtype=torch.float32):
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(CFG, dtype=dtype)


def test_a_model_that_fits_one_gpu_goes_whole_on_the_roomiest():
    m = _meta()
    b = model_bytes(m)
    assert b == sum(p.numel() * 4 for p in m.parameters()) + sum(x.numel() * x.element_size() for x in m.buffers())
    assert place(m, {0: 2 * b, 1: 3 * b, "cpu": 100 * b}) == {"": 1}


@pytest.mark.filterwarnings("ignore")
def test_a_model_larger_than_one_gpu_is_split_over_the_gpus_without_offload():
    m = _meta()
    b = model_bytes(m)
    dm = place(m, {0: int(0.7 * b), 1: int(0.7 * b), "cpu": 100 * b})
    assert set(dm.values()) == {0, 1}
    assert not any(k.startswith("model.layers.") and "." in k.removeprefix("model.layers.") for k in dm)  # layers whole


@pytest.mark.filterwarnings("ignore")
def test_offload_is_refused_with_the_memory_needed_and_the_knob():
    m = _meta()
    b = model_bytes(m)
    with pytest.raises(ConfigError, match=r"^the target org/x needs ~0\.0 GiB .* 1 GPU\(s\) hold .* modules on cpu; "
                                          r".*\+pair\.allow_offload=true"):
        place(m, {0: int(0.3 * b), "cpu": 100 * b}, "the target org/x")
    assert "cpu" in {str(d) for d in place(m, {0: int(0.3 * b), "cpu": 100 * b}, allow_offload=True).values()}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a host without GPUs")
def test_device_map_auto_without_gpus_is_an_offload_and_refused():
    """pair.device_map=auto on a host without GPUs would put the whole model on cpu: one line, not a slow run."""
    with pytest.raises(ConfigError, match=r"0 GPU\(s\) hold 0\.0 GiB.*\+pair\.allow_offload=true"):
        auto_device_map(AutoModelForCausalLM, CFG, torch.bfloat16, "org/x", False)
    assert auto_device_map(AutoModelForCausalLM, CFG, torch.bfloat16, "org/x", True) == {"": "cpu"}
