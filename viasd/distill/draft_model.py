"""The project-built draft architecture: a Llama whose LM head scores a vocabulary subset.

This module owns :class:`SubsetHeadLlamaForCausalLM`. On CPU a small draft's cost is its
LM head: SmolLM2's vocabulary has 49152 tokens, so a 256-wide head is 12.6M weights while
four 256-wide decoder layers are 3.4M, and one-token forwards are memory-bound (every weight
is read once per call). Scoring only the ``k`` most frequent tokens (FR-Spec, Zhao et al.
2025) cuts the weights a forward reads from 16M to 5.5M at ``k = 8192``; measured on
SmolLM2, the draft/target cost ratio ``c`` fell from 0.14 to 0.08 (fp32, 1 thread); every other token gets logit
``-inf``, so the draft never proposes it. Speculative decoding stays lossless: the verifier
uses the draft's own (zero-outside-the-subset) distribution in the acceptance rule.

``model(input_ids).logits`` is ``[B, T, V]`` over the full vocabulary ``V =
config.vocab_size`` like any causal LM, so every method, :class:`~viasd.engine.stream.Stream`
and transformers' assisted generation use it unchanged; training code calls
:meth:`SubsetHead.scores` for the ``[.., k]`` subset logits.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


class SubsetHead(nn.Module):
    """LM head over a fixed subset of token ids.

    ``weight [k, H]`` scores the tokens ``ids [k]``; :meth:`forward` returns full-vocabulary
    logits ``[.., V]`` with ``-inf`` outside the subset.
    """

    def __init__(self, hidden: int, ids: list[int], vocab: int, std: float = 0.02):
        super().__init__()
        if not ids or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"vocab subset must be {len(ids)} distinct ids in [0, {vocab})")
        self.vocab = vocab
        self.weight = nn.Parameter(torch.randn(len(ids), hidden) * std)
        # A plain attribute, not a buffer: from_pretrained materializes non-persistent
        # buffers uninitialized, and the ids live in config.json anyway.
        self.id_list = tuple(int(i) for i in ids)
        self._ids: torch.Tensor | None = None

    @property
    def ids(self) -> torch.Tensor:
        """``LongTensor[k]``: the scored token ids, on the head's device."""
        if self._ids is None or self._ids.device != self.weight.device:
            self._ids = torch.tensor(self.id_list, dtype=torch.long, device=self.weight.device)
        return self._ids

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [.., H]`` → subset logits ``[.., k]`` (column ``j`` scores token ``ids[j]``)."""
        return nn.functional.linear(hidden, self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [.., H]`` → full-vocabulary logits ``[.., V]`` (``-inf`` off the subset)."""
        sub = self.scores(hidden)
        out = sub.new_full((*sub.shape[:-1], self.vocab), float("-inf"))
        return out.index_copy_(-1, self.ids, sub)


class SubsetHeadLlamaForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` with a :class:`SubsetHead`; the subset is ``config.vocab_subset``
    (a list of token ids, saved in ``config.json``). Without it, a plain Llama."""

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        subset = getattr(config, "vocab_subset", None)
        if subset:
            self.lm_head = SubsetHead(config.hidden_size, list(subset), config.vocab_size, config.initializer_range)


def make_config(config: LlamaConfig, subset: list[int] | None) -> LlamaConfig:
    """``config`` with ``vocab_subset`` set (``None``/empty: full head); untied embeddings."""
    config.vocab_subset = list(subset) if subset else None
    if subset:
        config.tie_word_embeddings = False
    return config
