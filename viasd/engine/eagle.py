"""The EAGLE-style feature-level draft head: its module, chain drafting, and the target features it reads.

This module owns the head that drafts from the target's own hidden states (EAGLE, Li et al. 2024;
EAGLE-3, Li et al. 2025), its chain drafting, and what identifies the target it was trained on.

**The head.** A *slot* ``i`` pairs the target's features at position ``i`` with the token at
position ``i + 1``; its output predicts the token at ``i + 2``. The features are the target's
hidden states after the decoder layers :attr:`HeadSpec.feature_layers` (indices into transformers'
``hidden_states`` tuple: 0 is the embeddings, ``j`` the output of layer ``j``, −1 the last layer's
output before the final norm — what the decode seam hands a drafter), concatenated and
fused by ``fc`` (``[F·Ht] → [H]``, no bias): one layer (the last, as in EAGLE) or low/mid/high
(EAGLE-3's layers 2, L//2 and L−3). One decoder layer of the Llama architecture
(transformers' ``LlamaAttention`` / ``LlamaMLP`` / ``LlamaRMSNorm``, the layer published EAGLE-3
heads use for every target) reads ``concat(input_layernorm(embed(token)), hidden_norm(fused))``
(``2H`` wide: its q/k/v projections take ``2H`` inputs) with the fused state as the residual, then
``norm`` and a head: its own ``lm_head`` over a reduced vocabulary of ``draft_vocab`` tokens with a
draft→target map (``d2t``: offsets, target id = draft id + ``d2t[draft id]``; ``t2d``: which target
tokens the head can propose — FR-Spec / EAGLE-3), or, without ``lm_head`` in the file, the
target's own LM head (shared, never copied). Token embeddings are always the target's (shared).
A target token outside the reduced vocabulary gets probability 0: it is never proposed.

**Chain drafting** (:func:`propose`): the head keeps its own one-layer KV cache of *true* slots
(fed the target's features; :class:`HeadState`); a draft of ``k`` tokens runs ``k`` single-slot
steps, each fed the previous step's output hidden state in place of the target's features (the
head's own prediction of it), and is cropped away before the next round. Committed tokens whose
target features do not exist yet (``via_sd`` commits tokens its slim verifier decided; the target catches up
at the next escalation) are fed the same way, as *pending* slots, before the draft: the head runs on its own
predicted features until the target's arrive, then re-feeds those positions as true slots.

Saving and loading a head folder: :mod:`viasd.engine.eagle_io`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from viasd.engine.stream import crop_cache

META_KEY = "viasd_eagle"  # this project's block in a head's config.json


def eagle3_layers(n_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high feature layers of an ``n_layers`` target: the inputs of layers 2,
    ``n//2`` and ``n−3`` (``hidden_states`` indices), clamped into ``0..n`` for shallow targets."""
    return [max(0, min(i, n_layers)) for i in (2, n_layers // 2, n_layers - 3)]


@dataclass
class HeadSpec:
    """Shape of a head and what it reads (the ``config.json`` of its folder)."""

    hidden: int  # H: the head's width (= the target's hidden size: it reads the target's embeddings)
    target_hidden: int  # Ht: the target's hidden size (features are Ht wide)
    vocab: int  # V: the target's vocabulary (rows of its LM head)
    draft_vocab: int  # Vd ≤ V: the head's own LM head rows (== V and no lm_head: the target's is shared)
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_positions: int = 16384
    feature_layers: list[int] = field(default_factory=lambda: [-1])
    own_lm_head: bool = True
    meta: dict[str, Any] = field(default_factory=dict)  # target fingerprint, training provenance

    def llama_config(self) -> LlamaConfig:
        """The Llama config of the head's decoder layer (one layer, ``sdpa`` attention)."""
        cfg = LlamaConfig(hidden_size=self.hidden, intermediate_size=self.intermediate, num_hidden_layers=1,
                          num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                          rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_positions,
                          vocab_size=self.vocab, rope_theta=self.rope_theta, tie_word_embeddings=False)
        cfg._attn_implementation = "sdpa"
        return cfg

    def to_config(self) -> dict[str, Any]:
        """``config.json`` of the EAGLE-3 layout (plus this project's ``viasd_eagle`` block)."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": self.hidden,
                "target_hidden_size": self.target_hidden, "intermediate_size": self.intermediate,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "num_hidden_layers": 1,
                "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
                "max_position_embeddings": self.max_positions, "vocab_size": self.vocab,
                "draft_vocab_size": self.draft_vocab, "tie_word_embeddings": False,
                META_KEY: {"feature_layers": list(self.feature_layers), "own_lm_head": self.own_lm_head,
                           **self.meta}}

    @classmethod
    def from_config(cls, cfg: dict[str, Any], n_target_layers: int | None = None) -> HeadSpec:
        """Read a head ``config.json`` (ours or a published EAGLE-3 one: no ``viasd_eagle`` block means
        EAGLE-3's three feature layers of an ``n_target_layers`` target and an own LM head)."""
        mine = dict(cfg.get(META_KEY) or {})
        layers = mine.pop("feature_layers", None)
        if layers is None:
            layers = eagle3_layers(n_target_layers) if n_target_layers is not None else [-1]
        rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0
        hidden = int(cfg["hidden_size"])
        heads = int(cfg.get("num_attention_heads", 4))
        return cls(hidden=hidden, target_hidden=int(cfg.get("target_hidden_size") or hidden),
                   vocab=int(cfg["vocab_size"]), draft_vocab=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
                   heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
                   intermediate=int(cfg.get("intermediate_size", 4 * hidden)),
                   rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(rope),
                   max_positions=int(cfg.get("max_position_embeddings", 16384)), feature_layers=[int(i) for i in layers],
                   own_lm_head=bool(mine.pop("own_lm_head", True)), meta=mine)


class Midlayer(nn.Module):
    """EAGLE-3's decoder layer: Llama attention over ``[emb ; hidden]`` (2H), residual on ``hidden``."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        H = cfg.hidden_size
        self.self_attn = LlamaAttention(cfg, layer_idx=0)
        a = self.self_attn
        # The attention reads the concatenated 2H input (EAGLE-3's layout): widen q/k/v's inputs.
        a.q_proj = nn.Linear(2 * H, a.q_proj.out_features, bias=False)
        a.k_proj = nn.Linear(2 * H, a.k_proj.out_features, bias=False)
        a.v_proj = nn.Linear(2 * H, a.v_proj.out_features, bias=False)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None, cache) -> torch.Tensor:
        """``emb``, ``hidden`` ``[B, n, H]`` → ``[B, n, H]``; ``mask`` ``bool[B|1, 1, n, past + n]`` (True:
        attend; None: every cached key, for one query), ``cache`` a transformers cache (layer 0)."""
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        attn, _ = self.self_attn(x, position_embeddings=rope, attention_mask=mask, cache=cache)
        h = hidden + attn
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass
class Shared:
    """The target's modules a head reads (never registered as the head's parameters, never copied)."""

    embed: nn.Module  # the target's input embeddings
    lm_head: nn.Module | None  # the target's LM head (used when the head has none of its own)


class EagleHead(nn.Module):
    """An EAGLE-3-layout draft head (``fc``, ``midlayer``, ``norm``, ``lm_head``, ``d2t``/``t2d``)."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        self.spec = spec
        cfg = spec.llama_config()
        self.fc = nn.Linear(len(spec.feature_layers) * spec.target_hidden, spec.hidden, bias=False)
        self.midlayer = Midlayer(cfg)
        self.norm = LlamaRMSNorm(spec.hidden, eps=spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden, spec.draft_vocab, bias=False) if spec.own_lm_head else None
        self.rotary = LlamaRotaryEmbedding(cfg)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(spec.vocab, dtype=torch.bool) if spec.draft_vocab == spec.vocab
                             else torch.zeros(spec.vocab, dtype=torch.bool))
        self.shared: Shared | None = None

    def bind(self, target) -> EagleHead:
        """Read ``target``'s embeddings (and LM head, without an own one); returns ``self``."""
        self.shared = Shared(target.get_input_embeddings(), target.get_output_embeddings())
        return self

    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """Make the reduced vocabulary the sorted target ids ``draft_ids`` ``LongTensor[Vd]``."""
        ids = torch.sort(draft_ids.to(torch.long)).values
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def target_ids(self) -> torch.Tensor:
        """``LongTensor[Vd]``: the target id of each draft-vocabulary row."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[B, n, F·Ht]`` → the head's input hidden states ``[B, n, H]``."""
        return self.fc(features)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's embeddings ``[B, n, H]`` of ``tokens`` ``[B, n]``."""
        if self.shared is None:
            raise RuntimeError("EagleHead.bind(target) first: the head reads the target's embeddings")
        return self.shared.embed(tokens).to(self.fc.weight.dtype)

    def layer(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor | None, cache) -> torch.Tensor:
        """One pass of the decoder layer: ``hidden`` ``[B, n, H]`` (fused features or a previous output)
        paired with ``tokens`` ``[B, n]`` at ``positions`` ``LongTensor[B|1, n]`` → outputs ``[B, n, H]``."""
        rope = self.rotary(hidden, positions)
        return self.midlayer(self.embed(tokens), hidden, rope, mask, cache)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Outputs ``[..., H]`` → logits over the **target** vocabulary ``[..., V]`` (−inf outside the
        reduced vocabulary, so those tokens are never proposed)."""
        h = self.norm(out)
        if self.lm_head is None:
            return self.shared_head(h)
        small = self.lm_head(h).float()
        full = small.new_full((*small.shape[:-1], self.spec.vocab), float("-inf"))
        return full.index_copy(-1, self.target_ids, small)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Outputs ``[..., H]`` → logits over the draft vocabulary ``[..., Vd]`` (training reads these)."""
        h = self.norm(out)
        return self.shared_head(h) if self.lm_head is None else self.lm_head(h).float()

    def shared_head(self, h: torch.Tensor) -> torch.Tensor:
        """The target's LM head on ``h`` ``[..., H]`` → ``[..., V]`` fp32 (its module at inference — a
        packed CPU linear runs no autograd —, its weight through ``F.linear`` when gradients flow)."""
        if self.shared is None or self.shared.lm_head is None:
            raise RuntimeError("EagleHead.bind(target) first: this head reads the target's LM head")
        lm = self.shared.lm_head
        w = lm.weight
        if torch.is_grad_enabled() and h.requires_grad:
            return nn.functional.linear(h.to(w.dtype), w, getattr(lm, "bias", None)).float()
        return lm(h.to(w.dtype)).float()


def causal_mask(n: int, past: int, device: torch.device) -> torch.Tensor:
    """``bool[1, 1, n, past + n]``: query ``i`` attends to keys ``≤ past + i``."""
    q = torch.arange(n, device=device)[:, None] + past
    return (torch.arange(past + n, device=device)[None, :] <= q)[None, None]


@dataclass
class HeadState:
    """The head's KV cache over one sequence: ``true`` slots fed the target's features (any entries
    after them are the last draft's, cropped before the next round) and the last true output."""

    cache: Any = field(default_factory=DynamicCache)
    true: int = 0
    last_out: torch.Tensor | None = None  # [1, 1, H]: output of slot ``true − 1``

    def crop(self, slots: int) -> None:
        """Keep the first ``slots`` true slots (a rejected suffix of the sequence is forgotten)."""
        crop_cache(self.cache, slots)
        if slots < self.true:
            self.true, self.last_out = slots, None


def extend(head: EagleHead, state: HeadState, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Feed true slots ``state.true .. state.true + n − 1``.

    Args:
        features: ``[1, n, F·Ht]`` the target's features at those positions.
        tokens: ``LongTensor[1, n]`` the tokens one position later (slot ``i`` pairs features ``i``
            with token ``i + 1``).

    Returns:
        ``[1, n, H]`` the slots' outputs (the last one predicts the first draft token).
    """
    n = features.shape[1]
    crop_cache(state.cache, state.true)
    positions = torch.arange(state.true, state.true + n, device=features.device)[None]
    mask = causal_mask(n, state.true, features.device) if n > 1 else None
    out = head.layer(head.fuse(features.to(head.fc.weight.dtype)), tokens, positions, mask, state.cache)
    state.true += n
    state.last_out = out[:, -1:]
    return out


def propose(head: EagleHead, state: HeadState, features: torch.Tensor, tokens: torch.Tensor, k: int,
            pick=None, stop=None, pending: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain-draft ``k`` tokens.

    Feeds the new true slots (:func:`extend`; ``features`` ``[1, n, F·Ht]`` may be empty when the
    state is current), then the ``pending`` committed tokens the target has not run on yet, then ``k − 1``
    draft slots; a pending or draft slot is fed the previous slot's output in place of the target's features
    (the head's own prediction of them) and its token. Pending and draft slots' cache entries are cropped by
    the next call: once the target's features of those positions arrive they become true slots.

    Args:
        features: ``[1, n, F·Ht]`` target features of the positions not yet fed (``n ≥ 0``).
        tokens: ``LongTensor[1, n]`` the committed tokens one position after each of them (the last
            one is the last committed token, unless ``pending`` follows).
        k: tokens to draft (``≥ 1``).
        pick: ``logits [V] → LongTensor[]`` (default: argmax, i.e. greedy).
        stop: ``logits [V] → bool``: end the draft before a token after the first (e.g. low confidence).
        pending: ``LongTensor[1, r]`` committed tokens after ``tokens`` whose positions' features the target has
            not computed yet (``via_sd``'s tier-1/2 tokens; ``None``: none).

    Returns:
        ``(tokens, logits)``: ``LongTensor[k']`` and ``[k', V]`` logits over the target vocabulary
        (``k' = k`` unless ``stop`` ended the draft).
    """
    pick = pick or (lambda logits: logits.argmax(-1))
    state.crop(state.true)
    if features.shape[1]:
        extend(head, state, features, tokens)
    if state.last_out is None:
        raise RuntimeError("propose: the head has no true slot yet (feed the prompt's features first)")
    out, pos = state.last_out, state.true
    for j in range(0 if pending is None else pending.shape[1]):  # the head's own features stand in
        out = head.layer(out, pending[:, j:j + 1], torch.tensor([[pos]], device=out.device), None, state.cache)
        pos += 1
    drafted, rows = [], []
    for j in range(k):
        logits = head.logits(out[0, -1])
        if j and stop is not None and stop(logits):
            break
        x = pick(logits)
        drafted.append(x)
        rows.append(logits)
        if j + 1 < k:
            positions = torch.tensor([[pos]], device=out.device)
            out = head.layer(out, x.view(1, 1), positions, None, state.cache)
            pos += 1
    return torch.stack(drafted), torch.stack(rows)


# ---------------------------------------------------------------- target features and fingerprints


def feature_layers_of(spec: HeadSpec, n_layers: int) -> list[int]:
    """The ``hidden_states`` indices the head reads from an ``n_layers`` target (−1: the last layer's)."""
    return [n_layers if i == -1 else i for i in spec.feature_layers]


def features_from(hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor], layers: list[int]) -> torch.Tensor:
    """Concatenate transformers' ``hidden_states`` (``L + 1`` tensors ``[B, n, Ht]``) at ``layers`` →
    ``[B, n, F·Ht]``."""
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


@torch.no_grad()
def target_features(target, ids: torch.Tensor, layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One teacher-forced forward of ``target`` over ``ids`` ``LongTensor[1, n]``: its features
    ``[1, n, F·Ht]`` and logits ``[1, n, V]``."""
    out = target(input_ids=ids, output_hidden_states=True)
    return features_from(out.hidden_states, layers), out.logits


def target_fingerprint(target) -> dict[str, Any]:
    """What identifies the target a head is trained on: config shape and a few embedding values
    (compared with a tolerance, so a bf16 copy of the same target matches)."""
    c = target.config
    emb = target.get_input_embeddings().weight
    rows = torch.linspace(0, emb.shape[0] - 1, 4).long()
    probe = emb.detach()[rows, :4].float().flatten().tolist()
    blob = json.dumps([c.model_type, c.hidden_size, c.num_hidden_layers, emb.shape[0]])
    return {"config": hashlib.sha256(blob.encode()).hexdigest()[:12], "embedding_probe": [round(v, 5) for v in probe]}


def same_target(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two :func:`target_fingerprint` records name the same target (embedding probe within 2%)."""
    if a.get("config") != b.get("config"):
        return False
    pa, pb = torch.tensor(a.get("embedding_probe", [])), torch.tensor(b.get("embedding_probe", []))
    if pa.shape != pb.shape:
        return False
    return bool(((pa - pb).abs() <= 0.02 * pb.abs() + 1e-3).all())
