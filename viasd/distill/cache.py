"""Cache keys of the distilled draft: which folder a built draft lives in.

This module owns the fingerprints that decide whether a cached draft may be reused:
:func:`target_fingerprint` (the target's identity) and :func:`draft_dir` (the folder
``<cache_root>/drafts/<name>-<hash>`` of a config, target and data source). Their inputs and
outputs must not change without bumping :data:`viasd.distill.config.BUILD_FORMAT`: every
cached draft is found through them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from transformers import PreTrainedModel

from viasd.distill.config import BUILD_FORMAT, REFERENCE_PROMPTS_SHA256, DraftBuildConfig
from viasd.distill.data import selection_of
from viasd.paths import cache_dir, data_dir


def target_fingerprint(target: PreTrainedModel) -> str:
    """Short hash identifying the target (config + embedding statistics).

    Reads the input embedding ``[V, H]`` (its shape and the sum and absolute sum, fp64,
    rounded to 3 decimals) and the config without its path, dtype and transformers version.
    """
    emb = target.get_input_embeddings().weight.detach().float()
    stats = [emb.shape[0], emb.shape[1], round(float(emb.double().sum()), 3), round(float(emb.double().abs().sum()), 3)]
    cfg = {k: v for k, v in target.config.to_dict().items() if k not in ("_name_or_path", "dtype", "torch_dtype", "transformers_version")}
    blob = json.dumps([stats, cfg], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prompts_key(cfg: DraftBuildConfig, droot: Path | None) -> str:
    """The prompt source part of a draft's cache key: ``data`` (the recipe's selection from the data folder:
    :data:`~viasd.distill.config.REFERENCE_PROMPTS_SHA256`), ``builtin`` (no data folder), else ``data:<sha>``
    (a data folder holding other files: another selection, so another draft)."""
    if not droot:
        return "builtin"
    sha = selection_of(cfg, Path(droot))[0]
    return "data" if sha == REFERENCE_PROMPTS_SHA256 else f"data:{sha[:16]}"


def draft_dir(target: PreTrainedModel, cfg: DraftBuildConfig, cache_root: Path | None = None,
              data_root: Path | None | str = "auto") -> Path:  # fmt: skip
    """Cache folder ``<cache_root>/drafts/<name>-<hash>`` for this config, target and data source.

    The hash covers ``cfg.key()``, :func:`target_fingerprint`, the prompt source (:func:`prompts_key`;
    ``data_root="auto"``: :func:`viasd.paths.data_dir` if present; ``None``: built-in prompts only) and
    :data:`~viasd.distill.config.BUILD_FORMAT`.
    """
    root = Path(cache_root) if cache_root is not None else cache_dir()
    droot = data_dir(required=False) if data_root == "auto" else data_root
    key = {"cfg": cfg.key(), "target": target_fingerprint(target), "data": prompts_key(cfg, droot),
           "format": BUILD_FORMAT}  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return root / "drafts" / f"{cfg.name}-{digest}"
