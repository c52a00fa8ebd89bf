"""Run a routing plan's sub-layers with the model's own modules (the routed forward).

A *path* prepares one call of a decoder over ``n`` new positions that continue ``past`` cached
ones — positions, one attention mask per layer type (sized against a layer the call runs, so
caches whose layers hold different lengths are sized right), rotary embeddings or T5's position
bias — exactly as the model's own forward does. Then :meth:`layer` applies a whole decoder
layer (the layer's own ``forward``), and :meth:`attn` / :meth:`mlp` one of its two sub-layers:
the same modules in the same order as the layer's forward, with the other sub-layer's residual
update left out. :func:`run_units` chains a plan's units (whole layers where both sub-layers
run); :func:`head` applies the final norm and LM head. No config is edited, no weight is copied.

Decoder-only models: the generic structure the transformers decoders share (Llama, Mistral,
Qwen2/3, Gemma2/3, Phi-3, …; Gemma's post-attention / pre- and post-feed-forward norms and
Phi-3's residual dropouts are applied where its layer applies them). T5's decoder: the
attention sub-layer is the self-attention and the cross-attention block, the MLP sub-layer
the feed-forward block. Each layer keeps its own ``layer_idx``, so a path writes its KV into the
given cache at the original indices; skipped sub-layers leave no cache entry.

Devices: a model split over devices by a ``device_map`` is called here outside accelerate's
dispatch hooks, so each unit's input (hidden states, mask, rotary embeddings) is moved to that
unit's device (:func:`unit_device`, the device of its parameters), each layer's KV stays on its
layer's device, and :func:`head` returns the logits on the LM head's device — where the model's own
forward returns them.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence

import torch
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

from viasd.engine.routing import ATTN, MASK_BUILDERS, MLP, RoutingPlan, Unit, check_routable, layer_types
from viasd.errors import ConfigError


def is_encoder_decoder(model) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def embed(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Input embeddings ``[B, n, H]`` of ``input_ids`` ``[B, n]`` (T5: the decoder's)."""
    if is_encoder_decoder(model):
        return model.get_decoder().embed_tokens(input_ids)
    return model.model.embed_tokens(input_ids)


def module_device(module: torch.nn.Module) -> torch.device | None:
    """The device of ``module``'s first parameter (None: it has none)."""
    p = next(module.parameters(), None)
    return None if p is None else p.device


#: model -> {unit: the unit's first module with parameters}: found once per model (a routed call asks per layer).
_UNIT_MODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unit_device(model, unit: Unit) -> torch.device | None:
    """The device sub-layer ``unit`` (layer index, ``attn``/``mlp``) runs on: its parameters' device.

    The unit's module is looked up once per model; its parameters' device is read on every call, so
    a model moved later (``.to``, a device map) is still answered right."""
    found = _UNIT_MODULES.setdefault(model, {})
    if unit not in found:
        found[unit] = next((m for m in unit_modules(model, unit) if module_device(m) is not None), None)
    return None if found[unit] is None else module_device(found[unit])


def head(model, hidden: torch.Tensor, last: int) -> torch.Tensor:
    """Final norm + LM head (+ logit soft-capping; T5: output scaling) on the last ``last``
    positions of ``hidden`` ``[B, n, H]`` → ``[B, last, V]``, in the library's order of operations;
    ``hidden`` is moved to the final norm's device and the logits are on the LM head's device."""
    norm = model.get_decoder().final_layer_norm if is_encoder_decoder(model) else model.model.norm
    dev = module_device(norm)
    if dev is not None:
        hidden = hidden.to(dev)
    if is_encoder_decoder(model):
        hidden = model.get_decoder().final_layer_norm(hidden)
        if model.config.scale_decoder_outputs:
            hidden = hidden * (model.model_dim**-0.5)
        return model.lm_head(hidden)[:, -last:]
    hidden = model.model.norm(hidden)[:, -last:]
    logits = model.lm_head(hidden.to(module_device(model.lm_head) or hidden.device))
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _sublayer_check(model, layer) -> None:
    need = ("input_layernorm", "self_attn", "mlp", "post_attention_layernorm")
    if not all(hasattr(layer, a) for a in need):
        raise ConfigError(f"sub-layer masks need decoder layers with {', '.join(need)}; {type(layer).__name__} of "
                          f"{type(model).__name__} has another structure: use a whole-layer mask (a list of layers)")


def _first_of_kind(units: Sequence[Unit] | None, types: list[str]) -> dict[str, int | None]:
    """Per attention kind, the first layer whose attention the call runs (its cache sizes the mask)."""
    kinds = sorted(set(types))
    if units is None:
        return {t: types.index(t) for t in kinds}
    out: dict[str, int | None] = {}
    for i, kind in units:
        if kind == ATTN:
            out.setdefault(types[i], i)
    return out


class CausalPath:
    """One call of a decoder-only model's layers over ``like``'s ``n`` positions after ``past`` cached.

    Args:
        model: a routable causal LM.
        like: ``[B, n, H]`` the call's input hidden states (read for shape, dtype, device).
        cache: the cache the call's attention sub-layers read and extend (None: no cache).
        past: positions already cached for the layers this call runs.
        units: the units the call will run (None: every layer) — masks and rotary embeddings
            are built for their attention kinds only.
    """

    def __init__(self, model, like: torch.Tensor, cache=None, past: int = 0, units: Sequence[Unit] | None = None):
        check_routable(model)
        self.model, self.inner, self.cache = model, model.model, cache
        cfg = self.inner.config
        self.position_ids = (torch.arange(like.shape[1], device=like.device) + past).unsqueeze(0)
        self.types = layer_types(cfg)
        ref = _first_of_kind(units, self.types)
        self.masks = {t: MASK_BUILDERS[t](config=cfg, inputs_embeds=like, attention_mask=None, cache=cache,
                                          position_ids=self.position_ids, layer_idx=i if cache is not None else None)
                      for t, i in ref.items()}
        rotary = self.inner.rotary_emb
        if "layer_type" in inspect.signature(rotary.forward).parameters:  # one rotary per layer type
            self.pos_emb = {t: rotary(like, self.position_ids, layer_type=t) for t in ref}
        else:
            pos = rotary(like, self.position_ids) if ref else None
            self.pos_emb = dict.fromkeys(ref, pos)
        self._on: dict = {}  # (layer kind, device) -> mask, rotary embeddings, positions on that device

    def _kw(self, i: int, dev: torch.device | None = None) -> dict:
        """Layer ``i``'s call arguments, on ``dev`` (the layer's device; None: where they were built)."""
        kind = self.types[i]
        key = (kind, dev)
        if key not in self._on:
            mask, pos = self.masks[kind], self.pos_emb[kind]
            if dev is not None:
                mask = mask.to(dev) if isinstance(mask, torch.Tensor) else mask
                pos = tuple(t.to(dev) for t in pos) if pos is not None else None
            self._on[key] = (mask, pos, self.position_ids.to(dev) if dev is not None else self.position_ids)
        mask, pos, position_ids = self._on[key]
        return dict(attention_mask=mask, position_embeddings=pos, position_ids=position_ids, cache=self.cache,
                    use_cache=self.cache is not None)

    def _on_device(self, i: int, kind: str, hidden: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """``hidden`` and layer ``i``'s arguments on the device of its ``kind`` sub-layer."""
        dev = unit_device(self.model, (i, kind))
        if dev is None or dev == hidden.device == self.position_ids.device:
            return hidden, self._kw(i)
        return hidden.to(dev), self._kw(i, dev)

    def layer(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """Decoder layer ``i`` (original index, its own forward) on ``hidden`` ``[B, n, H]`` (moved to its device)."""
        hidden, kw = self._on_device(i, ATTN, hidden)
        return self.inner.layers[i](hidden, **kw)

    def attn(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """The attention sub-layer of layer ``i``: ``h + [post-norm](attn(input_norm(h)))``."""
        layer = self.inner.layers[i]
        _sublayer_check(self.model, layer)
        hidden, kw = self._on_device(i, ATTN, hidden)
        out, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden), **kw)
        if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma 2/3 normalize the attention output
            out = layer.post_attention_layernorm(out)
        if hasattr(layer, "resid_attn_dropout"):  # Phi-3
            out = layer.resid_attn_dropout(out)
        return hidden + out

    def mlp(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """The MLP sub-layer of layer ``i``: ``h + [post-norm](mlp(norm(h)))``."""
        layer = self.inner.layers[i]
        _sublayer_check(self.model, layer)
        hidden, _ = self._on_device(i, MLP, hidden)
        gemma = hasattr(layer, "pre_feedforward_layernorm")
        out = layer.mlp((layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm)(hidden))
        if gemma:
            out = layer.post_feedforward_layernorm(out)
        if hasattr(layer, "resid_mlp_dropout"):  # Phi-3
            out = layer.resid_mlp_dropout(out)
        return hidden + out


def _clamp_fp16(hidden: torch.Tensor) -> torch.Tensor:
    """T5's fp16 overflow clamp, as its block applies it after each sub-block."""
    if hidden.dtype != torch.float16:
        return hidden
    big = torch.finfo(hidden.dtype).max
    clamp = torch.where(torch.isinf(hidden).any(), big - 1000, big)
    return torch.clamp(hidden, min=-clamp, max=clamp)


class T5Path:
    """One call of T5's decoder blocks (same arguments as :class:`CausalPath`, plus the encoder output).

    The self-attention position bias is computed once for the call by block 0's relative
    attention bias (the value block 0 would compute and pass on), so a call that starts after
    block 0 gets the same bias.
    """

    def __init__(self, model, like: torch.Tensor, cache, past: int, units: Sequence[Unit] | None, encoder_outputs):
        self.dec = model.get_decoder()
        self.cache = cache
        self_cache = cache.self_attention_cache if cache is not None else None
        ref = _first_of_kind(units, ["full_attention"] * len(self.dec.block)).get("full_attention")
        self.mask = create_causal_mask(config=self.dec.config, inputs_embeds=like, attention_mask=None,
                                       cache=self_cache, layer_idx=ref if self_cache is not None else None)
        self.enc_hidden = encoder_outputs.last_hidden_state
        self.enc_mask = create_bidirectional_mask(config=self.dec.config, inputs_embeds=like, attention_mask=None,
                                                  encoder_hidden_states=self.enc_hidden)
        n = like.shape[1]
        self.bias = self.dec.block[0].layer[0].SelfAttention.compute_bias(n, past + n, device=like.device,
                                                                          past_seen_tokens=past)
        self.cross_bias = None

    def layer(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        hidden, _, self.cross_bias = self.dec.block[i](hidden, self.mask, self.bias, self.enc_hidden, self.enc_mask,
                                                       self.cross_bias, cache=self.cache)
        return hidden

    def attn(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """Self-attention then cross-attention block of decoder block ``i``."""
        block = self.dec.block[i]
        hidden = _clamp_fp16(block.layer[0](hidden, attention_mask=self.mask, position_bias=self.bias,
                                            cache=self.cache)[0])
        hidden, self.cross_bias, _ = block.layer[1](hidden, key_value_states=self.enc_hidden,
                                                    attention_mask=self.enc_mask, position_bias=self.cross_bias,
                                                    cache=self.cache)
        return _clamp_fp16(hidden)

    def mlp(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """The feed-forward block of decoder block ``i``."""
        return _clamp_fp16(self.dec.block[i].layer[-1](hidden))


def make_path(model, like: torch.Tensor, cache=None, past: int = 0, units: Sequence[Unit] | None = None,
              encoder_outputs=None):
    """The :class:`CausalPath` or :class:`T5Path` of one call (see :class:`CausalPath` for the arguments)."""
    if is_encoder_decoder(model):
        check_routable(model)
        return T5Path(model, like, cache, past, units, encoder_outputs)
    return CausalPath(model, like, cache, past, units)


def run_units(path, units: Sequence[Unit], hidden: torch.Tensor, whole_layers: bool = True) -> torch.Tensor:
    """Apply ``units`` (execution order) to ``hidden`` ``[B, n, H]`` through ``path``.

    A layer whose two sub-layers both run is applied by its own ``forward`` (``whole_layers``;
    bit-identical to the model) — ``whole_layers=False`` runs every unit as a sub-layer (tests).
    """
    j = 0
    while j < len(units):
        i, kind = units[j]
        if whole_layers and kind == ATTN and j + 1 < len(units) and units[j + 1] == (i, MLP):
            hidden, j = path.layer(i, hidden), j + 2
            continue
        hidden, j = (path.attn(i, hidden) if kind == ATTN else path.mlp(i, hidden)), j + 1
    return hidden


def cached_length(cache, units: Sequence[Unit]) -> int:
    """Positions a cache holds for the first attention unit of ``units`` (0 when none is cached)."""
    if cache is None:
        return 0
    self_cache = getattr(cache, "self_attention_cache", cache)
    first = next((i for i, kind in units if kind == ATTN), None)
    return 0 if first is None else int(self_cache.get_seq_length(first))


def routed_forward(model, input_ids: torch.Tensor, cache, plan: RoutingPlan, last: int = 1,
                   encoder_outputs=None, past: int | None = None) -> torch.Tensor:
    """Logits of ``model`` run with only the units of ``plan``.

    Args:
        model: the full model (its modules are used as they are).
        input_ids: ``LongTensor[B, n]`` uncached tokens (decoder tokens for T5).
        cache: this path's own ``DynamicCache`` (``EncoderDecoderCache`` for T5), or None.
        plan: kept sub-layers.
        last: number of trailing positions to return.
        encoder_outputs: T5 only, the encoder output for the prompt.
        past: cached positions (default: what ``cache`` holds for the plan's first attention).

    Returns:
        ``[B, last, V]`` logits.
    """
    units = plan.units()
    hidden = embed(model, input_ids)
    past = cached_length(cache, units) if past is None else past
    path = make_path(model, hidden, cache, past, units, encoder_outputs)
    return head(model, run_units(path, units, hidden), last)


def _weights(module: torch.nn.Module) -> int:
    """Parameters a forward of ``module`` reads (a packed linear's packed weight counted as dense)."""
    n = 0
    for m in module.modules():
        n += sum(p.numel() for p in m.parameters(recurse=False))
        if hasattr(m, "packed_weight") and getattr(m, "dense", None) is None:
            n += int(m.in_features) * int(m.out_features)
    return n


def unit_modules(model, unit: Unit) -> list[torch.nn.Module]:
    """The modules sub-layer ``unit`` runs (its norms included)."""
    i, kind = unit
    if is_encoder_decoder(model):
        block = model.get_decoder().block[i]
        return list(block.layer[:-1]) if kind == ATTN else [block.layer[-1]]
    check_routable(model)
    layer = model.model.layers[i]
    gemma = hasattr(layer, "pre_feedforward_layernorm")
    if kind == ATTN:
        names = ("input_layernorm", "self_attn") + (("post_attention_layernorm",) if gemma else ())
    else:
        names = ("mlp",) + (("pre_feedforward_layernorm", "post_feedforward_layernorm") if gemma
                            else ("post_attention_layernorm",))
    return [getattr(layer, a) for a in names if hasattr(layer, a)]


def unit_params(model) -> dict[Unit, int]:
    """Parameters each sub-layer reads per token: ``{(layer, "attn"|"mlp"): count}`` (norms included)."""
    n = len(model.get_decoder().block) if is_encoder_decoder(model) else len(model.model.layers)
    return {(i, kind): sum(_weights(m) for m in unit_modules(model, (i, kind))) for i in range(n) for kind in (ATTN, MLP)}
