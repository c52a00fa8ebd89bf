"""Intra-model routing: run a model with only some of its decoder layers (the slim verifier).

A :class:`RoutingPlan` is data — the sorted list of kept decoder layers. :func:`routed_forward`
runs the *same* module objects (shared weights, embeddings and head; no copies, no config edits)
over the kept layers only. For decoder-only models the routed pass is the generic structure the
transformers decoders share (Llama, Mistral, Qwen2/3, Gemma2/3, Phi-3, …): the model's embedding,
its rotary module (once per layer type when it takes a ``layer_type``, as Gemma-3 does), one
attention mask per layer type from ``config.layer_types`` (or ``config.sliding_window`` for
models that slide on every layer), each kept layer called as the model's forward calls it, the
final norm and the head (with ``final_logit_softcapping`` when set). :func:`check_routable`
refuses, with one line naming the model, what this structure cannot express. T5's decoder has its
own path. Each kept layer keeps its own ``layer_idx``, so a routed path writes its KV into its
own cache object at the original indices; skipped layers leave no cache entry. Layer 0 must be
kept (positions and mask sizes are read from the cache length of layer 0).

This module also registers the ``self`` drafter (the target routed with an aggressive plan).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)

from viasd.errors import ConfigError

# Attention kinds a routed pass can build masks for (the mask builders the models' forwards use).
MASK_BUILDERS = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
# Config fields that change a decoder's forward outside its layers (logit / embedding multipliers
# of Granite, Cohere, MiniCPM; bidirectional Gemma-3): such models are refused, not mis-routed.
UNROUTABLE_FIELDS = ("logit_scale", "logits_scaling", "embedding_multiplier", "scale_emb", "use_bidirectional_attention")
_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


def _refuse(model, why: str) -> ConfigError:
    name = f"{type(model).__name__} (model_type={getattr(model.config, 'model_type', '?')!r})"
    return ConfigError(f"routing (slim verifier, self drafter, DIMR) does not support {name}: {why}; "
                       "use a drafter and method without a routing plan (e.g. method=sd method.drafter.name=ngram)")


def layer_types(config) -> list[str]:
    """Attention kind of each decoder layer: ``config.layer_types``, else every layer sliding when
    ``config.sliding_window`` is set (Mistral, Phi-3), else every layer full."""
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)[:n]
    return ["sliding_attention" if getattr(config, "sliding_window", None) is not None else "full_attention"] * n


def check_routable(model: PreTrainedModel) -> None:
    """Raise one ConfigError naming the model when its forward is not the shared decoder structure."""
    if getattr(model.config, "is_encoder_decoder", False):
        if not hasattr(model.get_decoder(), "block"):
            raise _refuse(model, "only T5-style encoder-decoders (decoder.block) are routed")
        return
    inner = getattr(model, "model", None)
    missing = [p for p in _PARTS if not hasattr(inner, p)] if inner is not None else ["model"]
    if missing or not hasattr(model, "lm_head"):
        raise _refuse(model, f"expected model.model.{{{', '.join(_PARTS)}}} and lm_head, missing {missing or 'lm_head'}")
    cfg = inner.config
    odd = [f for f in UNROUTABLE_FIELDS if getattr(cfg, f, None) not in (None, False, 1, 1.0)]
    if odd:
        raise _refuse(model, f"its config sets {odd}, which its forward applies outside the decoder layers")
    if not getattr(cfg, "is_causal", True):
        raise _refuse(model, "it is not causal")
    kinds = sorted(set(layer_types(cfg)) - set(MASK_BUILDERS))
    if kinds:
        raise _refuse(model, f"layer types {kinds} (routable: {', '.join(MASK_BUILDERS)})")


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The decoder layer list of a routable model (ConfigError naming the model otherwise)."""
    check_routable(model)
    if getattr(model.config, "is_encoder_decoder", False):
        return model.get_decoder().block
    return model.model.layers


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

    Prepares embeddings, positions, one attention mask per layer type and the rotary embeddings
    for ``input_ids`` (``[B, n]``, continuing ``cache`` when given), exactly as the model's own
    forward does; then :meth:`layer` applies one decoder layer by its original index and
    :meth:`head` applies the final norm and LM head. :func:`routed_forward` chains them over a
    plan; the DIMR search reuses prefixes of a plan across candidates.
    """

    def __init__(self, model, input_ids: torch.Tensor, cache=None):
        check_routable(model)
        self.model, self.inner, self.cache = model, model.model, cache
        cfg = self.inner.config
        self.embeds = self.inner.embed_tokens(input_ids)
        past = cache.get_seq_length() if cache is not None else 0
        self.position_ids = (torch.arange(self.embeds.shape[1], device=self.embeds.device) + past).unsqueeze(0)
        kw = dict(config=cfg, inputs_embeds=self.embeds, attention_mask=None, cache=cache,
                  position_ids=self.position_ids)
        self.types = layer_types(cfg)
        kinds = sorted(set(self.types))
        self.masks = {t: MASK_BUILDERS[t](**kw) for t in kinds}
        rotary = self.inner.rotary_emb
        if "layer_type" in inspect.signature(rotary.forward).parameters:  # one rotary per layer type
            self.pos_emb = {t: rotary(self.embeds, self.position_ids, layer_type=t) for t in kinds}
        else:
            pos = rotary(self.embeds, self.position_ids)
            self.pos_emb = dict.fromkeys(kinds, pos)

    def layer(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """Apply decoder layer ``i`` (original index) to ``hidden`` ``[B, n, H]``."""
        kind = self.types[i]
        return self.inner.layers[i](hidden, attention_mask=self.masks[kind], position_embeddings=self.pos_emb[kind],
                                    position_ids=self.position_ids, cache=self.cache,
                                    use_cache=self.cache is not None)

    def head(self, hidden: torch.Tensor, last: int) -> torch.Tensor:
        """Final norm + LM head (+ logit soft-capping) on the last ``last`` positions → ``[B, last, V]``."""
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


def vocab_size_of(model: PreTrainedModel) -> int:
    """Output vocabulary size of a model: the width of its logits (the rows of its LM head, or
    the full vocabulary of a :class:`~viasd.distill.draft_model.SubsetHead`)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "vocab", None) or head.weight.shape[0])
