"""Sub-layer routing plans on every family: attention and MLP sub-layers kept apart.

A plan keeping every sub-layer, run sub-layer by sub-layer, is bit-identical to the model's own
forward (fp32, chunked through a KV cache); a plan without layer ``i``'s MLP (attention) equals the
model whose MLP (attention) ``i`` outputs zero; masks parse from lists, ``{attn, mlp}`` mappings and
the command line.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.test_families import LONG, family_pair
from viasd.dimr.masks import Budget, ablation_plan, resolve_plan
from viasd.engine.paths import embed, head, make_path, routed_forward, run_units
from viasd.engine.routing import RoutingPlan, num_layers
from viasd.engine.stream import fresh_cache, start_sequence
from viasd.errors import ConfigError
from viasd.methods.api import method_config
from viasd.models.tiny import FAMILIES
from viasd.paths import PROJECT_ROOT


class Zero(torch.nn.Module):
    """A sub-module whose output is zero (attention: ``(0, weights)``; T5: ``(0, position bias, weights)``)."""

    def __init__(self, attention: bool = False, t5: bool = False):
        super().__init__()
        self.attention, self.t5 = attention, t5

    def forward(self, hidden_states, *args, position_bias=None, **kwargs):
        out = torch.zeros_like(hidden_states)
        if self.t5:
            return out, position_bias, None
        return (out, None) if self.attention else out


def _decoder_ids(pair, n_new: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    ids = pair.encode(LONG)
    seq = torch.cat([start_sequence(pair.target, ids), torch.randint(5, 200, (1, n_new))], 1)
    return ids, seq


def _own_forward(model, ids, seq, cuts, enc):
    """The model's own forward over ``seq`` fed in chunks ending at ``cuts``, through one cache."""
    cache, outs, lo = fresh_cache(model), [], 0
    for hi in cuts:
        if enc is not None:
            out = model(encoder_outputs=enc, decoder_input_ids=seq[:, lo:hi], cache=cache, use_cache=True)
        else:
            out = model(input_ids=seq[:, lo:hi], cache=cache, use_cache=True)
        outs.append(out.logits)
        lo = hi
    return torch.cat(outs, 1)


def _sublayer_forward(model, seq, cuts, enc, plan):
    """The same chunks through :mod:`viasd.engine.paths`, every unit run as a sub-layer."""
    cache, outs, lo = fresh_cache(model), [], 0
    units = plan.units()
    for hi in cuts:
        hidden = embed(model, seq[:, lo:hi])
        path = make_path(model, hidden, cache, lo, units, enc)
        outs.append(head(model, run_units(path, units, hidden, whole_layers=False), hi - lo))
        lo = hi
    return torch.cat(outs, 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_sublayer_run_apart_is_the_models_forward(family):
    pair = family_pair(family)
    m, n = pair.target, num_layers(pair.target)
    ids, seq = _decoder_ids(pair)
    enc = m.get_encoder()(input_ids=ids) if pair.is_encoder_decoder else None
    L = seq.shape[1]
    cuts = [L - 9, L - 5, L - 4, L]
    with torch.inference_mode():
        own = _own_forward(m, ids, seq, cuts, enc)
        apart = _sublayer_forward(m, seq, cuts, enc, RoutingPlan.full(n))
    assert torch.equal(own[:, -(L - cuts[0]):], apart[:, -(L - cuts[0]):])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["mlp", "attn"])
def test_a_dropped_sublayer_is_a_zero_output(family, kind):
    pair = family_pair(family)
    m, n = pair.target, num_layers(pair.target)
    ids, seq = _decoder_ids(pair)
    i = 1
    ref = copy.deepcopy(m)
    if pair.is_encoder_decoder:
        block = ref.get_decoder().block[i]
        if kind == "mlp":
            block.layer[-1].DenseReluDense = Zero()
        else:
            block.layer[0].SelfAttention = Zero(t5=True)
            block.layer[1].EncDecAttention = Zero(t5=True)
    else:
        layer = ref.model.layers[i]
        if kind == "mlp":
            layer.mlp = Zero()
        else:
            layer.self_attn = Zero(attention=True)
    full = RoutingPlan.full(n)
    plan = RoutingPlan(full.attn, tuple(j for j in full.mlp if j != i)) if kind == "mlp" else \
        RoutingPlan(tuple(j for j in full.attn if j != i), full.mlp)
    with torch.inference_mode():
        if pair.is_encoder_decoder:
            enc = m.get_encoder()(input_ids=ids)
            want = ref(encoder_outputs=enc, decoder_input_ids=seq).logits
            got = routed_forward(m, seq, None, plan, last=seq.shape[1], encoder_outputs=enc)
        else:
            want = ref(input_ids=seq).logits
            got = routed_forward(m, seq, None, plan, last=seq.shape[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_masks_parse_from_lists_mappings_and_the_command_line():
    assert RoutingPlan.build([3, 0, 1], 4) == RoutingPlan((0, 1, 3), (0, 1, 3))
    plan = RoutingPlan.build({"attn": [0, 1, 2], "mlp": [0, 2]}, 4)
    assert plan.spec() == {"attn": [0, 1, 2], "mlp": [0, 2]} and not plan.whole
    assert plan.units() == [(0, "attn"), (0, "mlp"), (1, "attn"), (2, "attn"), (2, "mlp")]
    assert plan.first_skipped(4) == 3 and plan.layers == (0, 1, 2) and plan.sublayers() == 5
    assert RoutingPlan.build([0, 1, 2], 4).spec() == [0, 1, 2]  # whole-layer masks stay lists (same run ids)
    with pytest.raises(ConfigError, match="skips layer 0's attention"):
        RoutingPlan.build({"attn": [1], "mlp": [0]}, 4)
    with pytest.raises(ConfigError, match="exactly the keys attn and mlp"):
        RoutingPlan.build({"attn": [0], "ffn": [0]}, 4)
    with pytest.raises(ConfigError, match="outside 0..3"):
        RoutingPlan.build({"attn": [0], "mlp": [9]}, 4)
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["method=via_sd", "method.slim.mask={attn:[0,1,2],mlp:[0,2]}"])
    slim = method_config("via_sd", cfg.method).slim
    _, resolved, _ = resolve_plan(family_pair("llama"), slim)
    assert resolved == plan


@pytest.mark.parametrize("family", ["llama", "gemma2", "t5"])
def test_sublayer_ablations_fill_the_parameter_budget(family):
    target = family_pair(family).target
    n = num_layers(target)
    for ratio in (0.5, 0.75):
        b = Budget.of(target, ratio)
        whole = ablation_plan(target, "every_other", ratio)
        assert b.cost(whole) <= b.limit * (1 + 1e-9)  # equal layers: k whole layers hit the budget exactly
        for name in ("random", "first_k", "every_other"):
            plan = ablation_plan(target, name, ratio, seed=3, space="sublayers")
            assert b.cost(plan) <= b.limit * (1 + 1e-9), (name, plan)
            assert plan.attn[0] == 0
            if name != "first_k":  # first and last layer kept whole
                assert {(0, "attn"), (0, "mlp"), (n - 1, "attn"), (n - 1, "mlp")} <= set(plan.units())
        assert ablation_plan(target, "random", ratio, 1, "sublayers") == ablation_plan(target, "random", ratio, 1,
                                                                                        "sublayers")
