"""Shared helpers for routing tests: a physically pruned reference model and chunked feeding."""

from __future__ import annotations

import copy

import torch

from viasd.models.backend import PackedLinear, apply_backend


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


def feed(stream, seq, chunks):
    """Logits of the last ``sum(chunks)`` positions of ``seq``, fed to ``stream`` in ``chunks``."""
    outs, cut = [], seq.shape[1] - sum(chunks)
    for c in chunks:
        cut += c
        outs.append(stream.logits(seq[:, :cut], last=c))
    return torch.cat(outs, 1)
