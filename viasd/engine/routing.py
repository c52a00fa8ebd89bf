"""Intra-model routing plans: which decoder sub-layers a routed pass runs (the slim verifier).

A :class:`RoutingPlan` is data — the kept attention sub-layers and the kept MLP sub-layers of a
decoder (a whole-layer plan keeps both of the same layers). A plan's *units* are its kept
sub-layers in execution order, ``(layer, "attn")`` before ``(layer, "mlp")``; the unit index
``2·layer + (0 | 1)`` orders every plan the same way, so :meth:`RoutingPlan.first_skipped` is
where a slim pass stops seeing the full model's hidden states (:mod:`viasd.engine.stream`
shares everything before it). :mod:`viasd.engine.paths` runs a plan with the model's own
modules. :func:`check_routable` refuses, with one line naming the model, what that runner cannot
express. Layer 0's attention must be kept (transformers reads positions and mask sizes from the
first layer's cache when nothing else tells it, and T5 computes its position bias there).

This module also registers the ``self`` drafter's default plan (the target routed with an
aggressive plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from viasd.errors import ConfigError

ATTN, MLP = "attn", "mlp"
# Attention kinds a routed pass can build masks for (the mask builders the models' forwards use).
MASK_BUILDERS = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
# Config fields that change a decoder's forward outside its layers (logit / embedding multipliers
# of Granite, Cohere, MiniCPM; bidirectional Gemma-3): such models are refused, not mis-routed.
UNROUTABLE_FIELDS = ("logit_scale", "logits_scaling", "embedding_multiplier", "scale_emb", "use_bidirectional_attention")
_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")

Unit = tuple[int, str]


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


def unit_index(unit: Unit) -> int:
    """Position of a unit in execution order: ``2·layer`` for attention, ``2·layer + 1`` for the MLP."""
    return 2 * unit[0] + (unit[1] == MLP)


def all_units(n_layers: int) -> list[Unit]:
    """Every sub-layer of an ``n_layers`` decoder in execution order."""
    return [(i, kind) for i in range(n_layers) for kind in (ATTN, MLP)]


def _indices(value, what: str) -> list[int]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigError(f"{what} must be a list of layer indices or {{attn: [...], mlp: [...]}} (got {value!r})")
    try:
        return sorted({int(i) for i in value})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what} must be a list of layer indices (got {value!r})") from e


@dataclass(frozen=True)
class RoutingPlan:
    """Kept attention and MLP sub-layers (sorted, unique; layer 0's attention is always kept)."""

    attn: tuple[int, ...]
    mlp: tuple[int, ...]

    @classmethod
    def of_layers(cls, layers) -> RoutingPlan:
        """A whole-layer plan (both sub-layers of each listed layer), unchecked."""
        kept = tuple(sorted({int(i) for i in layers}))
        return cls(kept, kept)

    @classmethod
    def full(cls, n_layers: int) -> RoutingPlan:
        return cls.of_layers(range(n_layers))

    @classmethod
    def build(cls, spec, n_layers: int, what: str = "routing mask") -> RoutingPlan:
        """Validate a mask ``spec`` — a list of kept layers, or ``{attn: [...], mlp: [...]}`` — against a
        model with ``n_layers`` layers; errors name the fix."""
        if isinstance(spec, RoutingPlan):
            attn, mlp = list(spec.attn), list(spec.mlp)
        elif isinstance(spec, Mapping):
            extra = sorted(set(map(str, spec)) - {ATTN, MLP})
            if extra or ATTN not in spec or MLP not in spec:
                raise ConfigError(f"{what} {dict(spec)!r}: a sub-layer mask has exactly the keys attn and mlp, "
                                  "e.g. {attn: [0, 1, 2], mlp: [0, 2]}")
            attn, mlp = _indices(spec[ATTN], f"{what}.attn"), _indices(spec[MLP], f"{what}.mlp")
        else:
            attn = mlp = _indices(spec, what)
        shown = attn if attn == mlp else {ATTN: attn, MLP: mlp}
        if not attn and not mlp:
            raise ConfigError(f"{what} keeps no layer; keep at least layer 0")
        bad = sorted({i for i in attn + mlp if not 0 <= i < n_layers})
        if bad:
            raise ConfigError(f"{what} {shown} does not fit the model: layers {bad} are outside 0..{n_layers - 1} "
                              f"(the model has {n_layers} decoder layers); rebuild the mask for this model")
        if not attn or attn[0] != 0:
            part = "layer 0" if attn == mlp else "layer 0's attention"
            raise ConfigError(f"{what} {shown} skips {part}; transformers reads positions from layer 0's cache, "
                              "so keep layer 0")
        return cls(tuple(attn), tuple(mlp))

    @property
    def layers(self) -> tuple[int, ...]:
        """Layers of which at least one sub-layer runs (for a whole-layer plan: its kept layers)."""
        return tuple(sorted(set(self.attn) | set(self.mlp)))

    @property
    def whole(self) -> bool:
        """Whether the plan keeps or drops whole layers only."""
        return self.attn == self.mlp

    def spec(self) -> list[int] | dict[str, list[int]]:
        """The plan as written in configs and artifacts: a layer list when whole, else ``{attn, mlp}``."""
        return list(self.attn) if self.whole else {ATTN: list(self.attn), MLP: list(self.mlp)}

    def units(self) -> list[Unit]:
        """Kept sub-layers in execution order."""
        return sorted([(i, ATTN) for i in self.attn] + [(i, MLP) for i in self.mlp], key=unit_index)

    def first_skipped(self, n_layers: int) -> int:
        """Unit index of the first sub-layer the plan skips (``2·n_layers`` for the full plan): every
        unit before it sees the same inputs in this plan's pass and in the full model's."""
        kept = {unit_index(u) for u in self.units()}
        return next((j for j in range(2 * n_layers) if j not in kept), 2 * n_layers)

    def sublayers(self) -> int:
        """Number of kept sub-layers."""
        return len(self.attn) + len(self.mlp)

    def keep_ratio(self, n_layers: int) -> float:
        """Kept sub-layers / all sub-layers (kept layers / all layers for a whole-layer plan)."""
        return self.sublayers() / (2 * n_layers)

    def is_full(self, n_layers: int) -> bool:
        return self.sublayers() == 2 * n_layers


def default_self_layers(n_layers: int) -> list[int]:
    """Default ``self`` drafter plan: every other layer from 0, plus the last layer."""
    return sorted(set(range(0, n_layers, 2)) | {n_layers - 1})


def vocab_size_of(model: PreTrainedModel) -> int:
    """Output vocabulary size of a model: the width of its logits (the rows of its LM head, or
    the full vocabulary of a :class:`~viasd.distill.draft_model.SubsetHead`)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "vocab", None) or head.weight.shape[0])
