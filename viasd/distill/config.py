"""The draft build's configuration: :class:`DraftBuildConfig` (every knob of the recipe).

This module owns the config dataclass and the artifact format versions that enter the cache
keys (:mod:`viasd.distill.cache`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

BUILD_FORMAT = 3  # the draft artifact (3: vocabulary-subset head)
TEACHER_FORMAT = 2  # the cached teacher sequences (2: + final hidden states)
#: The prompt selection (:func:`viasd.distill.data.selection_sha256`) the committed SmolLM2 runs' draft was
#: distilled on: the default recipe over the offline data folder (384 training / 48 held-out prompts). A draft
#: distilled on any other selection (no data folder: the 41 + 7 built-in prompts; a partial folder) names it in
#: its runs' ids (``pair.options.draft_prompts``), so a run id always names one draft.
REFERENCE_PROMPTS_SHA256 = "b135a8984444e8e54535e2063316996c156e0a22b105ac102316243f9035fcee"


@dataclass(frozen=True)
class DraftBuildConfig:
    """How to build the draft. Every field except ``threads`` enters the cache key.

    Architecture: ``layers`` decoder layers of width ``hidden`` with ``heads`` query heads,
    ``kv_heads`` key/value heads and MLP width ``intermediate``; untied embeddings; the LM head
    scores the ``draft_vocab`` most frequent tokens of the teacher data (0: all tokens; see
    :mod:`viasd.distill.draft_model`).
    Data: ``n_texts`` training prompts and ``n_heldout`` held-out prompts, each truncated to
    ``prompt_tokens`` tokens of user content and greedily continued by the target for up to
    ``gen_tokens`` tokens (in batches of ``gen_batch``); ``topk`` teacher log-probs are kept
    per continuation position. Training: ``steps`` AdamW steps of ``batch`` sequences (at most
    ``seq_len`` tokens each) at peak learning rate ``lr`` (linear warmup over the first
    ``warmup`` fraction of the steps, then cosine down to ``lr / 10``); loss = ``hidden_weight``
    × hidden state regression + ``kd_weight`` × top-k distillation, where ``hard_weight``
    mixes the teacher-argmax CE into the soft top-k CE. ``seed`` fixes prompt selection, init
    and batch order. ``threads``: torch threads for the build (0 =
    :func:`viasd.distill.runtime.auto_threads`).
    """

    name: str = "smollm2-draft"
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 768
    draft_vocab: int = 8192
    steps: int = 300
    lr: float = 2e-3
    seq_len: int = 320
    batch: int = 16
    seed: int = 0
    n_texts: int = 384
    n_heldout: int = 48
    prompt_tokens: int = 128
    gen_tokens: int = 80
    gen_batch: int = 32
    topk: int = 16
    hard_weight: float = 0.5
    hidden_weight: float = 1.0
    kd_weight: float = 1.0
    warmup: float = 0.05
    weight_decay: float = 0.01
    init_from_target: bool = True
    threads: int = 0

    def key(self) -> dict:
        """The fields that define the built artifact (everything but ``threads``)."""
        d = dataclasses.asdict(self)
        d.pop("threads")
        return d
