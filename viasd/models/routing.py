"""Intra-model routing: run a model with only some of its decoder layers (the slim verifier).

A :class:`RoutingPlan` is data — the sorted list of kept decoder layers. :func:`routed_forward`
runs the *same* module objects (shared weights, embeddings and head; no copies, no config edits)
over the kept layers only, for decoder-only Llama / Gemma2 / Qwen2-style models and for the
decoder of T5. Each kept layer keeps its own ``layer_idx``, so a routed path writes its KV into
its own cache object at the original indices; skipped layers leave no cache entry. Layer 0 must
be kept (transformers reads positions and mask sizes from the cache length of layer 0).

This module also registers the ``self`` drafter (the target routed with an aggressive plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)

from viasd.errors import ConfigError


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The decoder layer list of a supported model."""
    if getattr(model.config, "is_encoder_decoder", False):
        return model.get_decoder().block
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ConfigError(f"routing is not supported for {type(model).__name__}: expected model.model.layers")
    return inner.layers


def num_layers(model: PreTrainedModel) -> int:
    """Number of decoder layers of ``model``."""
    return len(decoder_layers(model))


@dataclass(frozen=True)
class RoutingPlan:
    """Kept decoder layers (sorted, unique, including layer 0)."""

    layers: tuple[int, ...]

    @classmethod
    def build(cls, layers, n_layers: int, what: str = "routing mask") -> RoutingPlan:
        """Validate ``layers`` against a model with ``n_layers`` layers; errors name the fix."""
        try:
            kept = sorted({int(i) for i in layers})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{what} must be a list of layer indices (got {layers!r})") from e
        if not kept:
            raise ConfigError(f"{what} keeps no layer; keep at least layer 0")
        bad = [i for i in kept if not 0 <= i < n_layers]
        if bad:
            raise ConfigError(f"{what} {kept} does not fit the model: layers {bad} are outside 0..{n_layers - 1} "
                              f"(the model has {n_layers} decoder layers); rebuild the mask for this model")
        if kept[0] != 0:
            raise ConfigError(f"{what} {kept} skips layer 0; transformers reads positions from layer 0's cache, "
                              "so keep layer 0")
        return cls(tuple(kept))

    def keep_ratio(self, n_layers: int) -> float:
        return len(self.layers) / n_layers

    def is_full(self, n_layers: int) -> bool:
        return len(self.layers) == n_layers


class CausalPath:
    """One routed pass of a decoder-only model, layer by layer.

    Prepares embeddings, positions, attention masks and rotary embeddings for ``input_ids``
    (``[B, n]``, continuing ``cache`` when given), then :meth:`layer` applies one decoder layer by
    its original index and :meth:`head` applies the final norm and LM head. :func:`routed_forward`
    chains them over a plan; the DIMR search reuses prefixes of a plan across candidates.
    """

    def __init__(self, model, input_ids: torch.Tensor, cache=None):
        self.model, self.inner, self.cache = model, model.model, cache
        cfg = self.inner.config
        self.embeds = self.inner.embed_tokens(input_ids)
        past = cache.get_seq_length() if cache is not None else 0
        self.position_ids = (torch.arange(self.embeds.shape[1], device=self.embeds.device) + past).unsqueeze(0)
        kw = dict(config=cfg, inputs_embeds=self.embeds, attention_mask=None, cache=cache,
                  position_ids=self.position_ids)
        self.layer_types = getattr(cfg, "layer_types", None)
        self.masks = {"full_attention": create_causal_mask(**kw)}
        if self.layer_types and "sliding_attention" in self.layer_types:
            self.masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
        self.pos_emb = self.inner.rotary_emb(self.embeds, self.position_ids)

    def layer(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """Apply decoder layer ``i`` (original index) to ``hidden`` ``[B, n, H]``."""
        mask = self.masks[self.layer_types[i]] if self.layer_types else self.masks["full_attention"]
        return self.inner.layers[i](hidden, attention_mask=mask, position_embeddings=self.pos_emb,
                                    position_ids=self.position_ids, cache=self.cache,
                                    use_cache=self.cache is not None)

    def head(self, hidden: torch.Tensor, last: int) -> torch.Tensor:
        """Final norm + LM head (+ Gemma2 soft-capping) on the last ``last`` positions → ``[B, last, V]``."""
        # Same order of operations as the library's forward (norm, slice, head) for identical logits.
        logits = self.model.lm_head(self.inner.norm(hidden)[:, -last:])
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


def _causal_routed(model, input_ids, cache, plan: RoutingPlan, last: int) -> torch.Tensor:
    path = CausalPath(model, input_ids, cache)
    hidden = path.embeds
    for i in plan.layers:
        hidden = path.layer(i, hidden)
    return path.head(hidden, last)


def _t5_routed(model, input_ids, cache, plan: RoutingPlan, last: int, encoder_outputs) -> torch.Tensor:
    dec = model.get_decoder()
    embeds = dec.embed_tokens(input_ids)
    self_cache = cache.self_attention_cache
    mask = create_causal_mask(config=dec.config, inputs_embeds=embeds, attention_mask=None, cache=self_cache)
    enc_hidden = encoder_outputs.last_hidden_state
    enc_mask = create_bidirectional_mask(config=dec.config, inputs_embeds=embeds, attention_mask=None,
                                         encoder_hidden_states=enc_hidden)
    hidden, bias, cross_bias = embeds, None, None
    for i in plan.layers:
        hidden, bias, cross_bias = dec.block[i](hidden, mask, bias, enc_hidden, enc_mask, cross_bias, cache=cache)
    hidden = dec.final_layer_norm(hidden)
    if model.config.scale_decoder_outputs:
        hidden = hidden * (model.model_dim**-0.5)
    return model.lm_head(hidden)[:, -last:]


def routed_forward(model, input_ids: torch.Tensor, cache, plan: RoutingPlan, last: int = 1,
                   encoder_outputs=None) -> torch.Tensor:
    """Logits of ``model`` run with only ``plan.layers``.

    Args:
        model: the full model (its modules are used as they are).
        input_ids: ``LongTensor[1, n]`` uncached tokens (decoder tokens for T5).
        cache: this path's own ``DynamicCache`` (``EncoderDecoderCache`` for T5).
        plan: kept layers.
        last: number of trailing positions to return.
        encoder_outputs: T5 only, the encoder output for the prompt.

    Returns:
        ``[1, last, V]`` logits.
    """
    if getattr(model.config, "is_encoder_decoder", False):
        return _t5_routed(model, input_ids, cache, plan, last, encoder_outputs)
    return _causal_routed(model, input_ids, cache, plan, last)


def default_self_layers(n_layers: int) -> list[int]:
    """Default ``self`` drafter plan: every other layer from 0, plus the last layer."""
    return sorted(set(range(0, n_layers, 2)) | {n_layers - 1})


def _self_drafter(pair, prompt_ids, cfg):
    from viasd.decoding.drafters import ModelDrafter

    n = num_layers(pair.target)
    layers = cfg.layers if cfg.layers is not None else pair.extras.get("self_layers") or default_self_layers(n)
    plan = RoutingPlan.build(layers, n, what="self-drafter plan (method.drafter.layers)")
    drafter = ModelDrafter(pair.target, prompt_ids, "self_draft")
    drafter.stream.plan = plan
    return drafter


def _register() -> None:
    from viasd.decoding.drafters import DRAFTERS

    if "self" not in DRAFTERS:
        DRAFTERS.register("self")(_self_drafter)


_register()
