"""The draft's architecture config, vocabulary subset and initialization from the target.

This module owns how a fresh draft is made: :func:`draft_config` (a ``layers`` × ``hidden``
Llama with the target's vocabulary, special ids and RoPE), :func:`vocab_subset` (the
``draft_vocab`` most frequent teacher tokens its LM head scores; see
:mod:`viasd.distill.draft_model`) and :func:`init_draft`: untied embeddings, the input
embedding = the target's embedding projected on its top ``hidden`` principal directions, the
LM head = the target's embedding projected on the top ``hidden`` principal directions of the
target's *final hidden states* (:func:`output_basis`; that subspace keeps the target's greedy
token 69% of the time at k=256, the embedding's own subspace 13%).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import transformers
from transformers import LlamaConfig, PreTrainedModel

from viasd.distill.config import DraftBuildConfig
from viasd.distill.draft_model import SubsetHeadLlamaForCausalLM, make_config
from viasd.distill.teacher import TeacherSeq


def vocab_subset(seqs: Sequence[TeacherSeq], k: int, vocab: int, always: Sequence[int] = ()) -> list[int] | None:
    """The ``k`` token ids the draft's head scores: ``always`` (special tokens) first, then by
    frequency in the teacher sequences (prompt + continuation tokens, continuation counted
    twice), then ascending id (BPE ids roughly follow merge frequency). ``None`` when
    ``k <= 0`` or ``k >= vocab`` (full head). Counts come from ``s.prompt [P]`` and
    ``s.cont [C]`` of every sequence; the result is sorted ascending."""
    if k <= 0 or k >= vocab:
        return None
    counts = torch.zeros(vocab, dtype=torch.float64)
    for s in seqs:
        counts.index_add_(0, s.prompt, torch.ones(len(s.prompt), dtype=torch.float64))
        counts.index_add_(0, s.cont, torch.full((len(s.cont),), 2.0, dtype=torch.float64))
    counts[torch.tensor(sorted(set(always)), dtype=torch.long)] = float("inf")
    # stable descending sort: ties (incl. zero counts) keep ascending id order
    order = torch.sort(-counts, stable=True).indices[:k]
    return sorted(int(i) for i in order)


def draft_config(
    target_config: transformers.PretrainedConfig, cfg: DraftBuildConfig, subset: list[int] | None = None
) -> LlamaConfig:
    """Llama config of the draft: the target's vocabulary, special ids and RoPE; ``cfg``'s sizes;
    ``subset`` the token ids its LM head scores (``None``: all)."""
    if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
        raise ValueError(f"hidden {cfg.hidden} / heads {cfg.heads} / kv_heads {cfg.kv_heads} do not divide")
    rope = getattr(target_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    config = LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rms_norm_eps=target_config.rms_norm_eps,
        rope_parameters=dict(rope),
        tie_word_embeddings=False,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=target_config.pad_token_id,
        dtype="float32",
    )
    return make_config(config, subset)


def _top_eigvecs(gram: torch.Tensor, k: int) -> torch.Tensor:
    """Top-``k`` eigenvectors ``[n, k]`` of a symmetric ``[n, n]`` matrix, signs fixed (largest entry > 0)."""
    evals, evecs = torch.linalg.eigh(gram.double())
    basis = evecs[:, torch.argsort(evals, descending=True)[:k]]
    signs = torch.sign(basis.gather(0, basis.abs().argmax(0, keepdim=True)))
    return (basis * signs).float()


def output_basis(seqs: Sequence[TeacherSeq], k: int) -> tuple[torch.Tensor, float]:
    """Orthonormal ``[H, k]`` basis of the top-``k`` principal directions (uncentered) of the
    target's final hidden states over ``seqs`` — the subspace the draft's output lives in.

    Measured on SmolLM2 (held-out continuations): restricting the target's final state to
    this k=256 subspace keeps its greedy token 69% of the time; the embedding matrix's own
    top-256 subspace keeps 13%. Also returns the RMS of the projected states (the draft's
    final-norm gain at init).
    """
    dim = seqs[0].hidden.shape[-1]
    gram = torch.zeros(dim, dim, dtype=torch.float64)
    count = 0
    for s in seqs:
        h = s.hidden.double()
        gram += h.T @ h
        count += h.shape[0]
    basis = _top_eigvecs(gram, k)
    energy = torch.trace(basis.double().T @ gram @ basis.double()) / max(count, 1) / k
    return basis, float(energy.sqrt())


@torch.no_grad()
def init_draft(
    target: PreTrainedModel,
    cfg: DraftBuildConfig,
    out_basis: torch.Tensor | None = None,
    out_rms: float | None = None,
    subset: list[int] | None = None,
) -> SubsetHeadLlamaForCausalLM:
    """Seeded draft. With ``init_from_target`` (the target's embedding ``E [V, H_t]``):

    * input embedding = ``E @ B_in`` with ``B_in [H_t, hidden]`` the top right singular
      directions of ``E`` (best rank-``hidden`` view of the token identities);
    * LM head = ``E @ B_out`` with ``B_out`` = ``out_basis`` (see :func:`output_basis`), so
      a draft whose final state equals ``B_outᵀ z`` (``z`` the target's final state) gives
      the target's logits restricted to that subspace; without ``out_basis``, ``B_in``;
    * final-norm gain = ``out_rms`` (the RMS of ``B_outᵀ z``) when given;
    * with ``subset`` the head keeps the rows of those token ids only.
    """
    torch.manual_seed(cfg.seed)
    draft = SubsetHeadLlamaForCausalLM(draft_config(target.config, cfg, subset))
    if cfg.init_from_target:
        emb = target.get_input_embeddings().weight.detach().float()
        if cfg.hidden > emb.shape[1]:
            raise ValueError(f"draft hidden {cfg.hidden} exceeds the target's {emb.shape[1]}")
        b_in = _top_eigvecs(emb.T.double() @ emb.double(), cfg.hidden)
        b_out = out_basis if out_basis is not None else b_in
        draft.get_input_embeddings().weight.copy_(emb @ b_in)
        head = emb @ b_out
        draft.get_output_embeddings().weight.copy_(head[torch.tensor(subset)] if subset else head)
        if out_rms is not None:
            draft.get_decoder().norm.weight.fill_(out_rms)
    return draft
