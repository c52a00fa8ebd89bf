"""Sizes and access of the models a dry run plans: parameter counts without a download
(:data:`KNOWN_PARAMS`, a local ``config.json`` on the meta device, or the built tiny pair), which hub
ids are gated, the rows of each task's pinned hub split, the visible GPUs and whether the hub answers.
"""

from __future__ import annotations

import json
import math
import os
import socket
from functools import cache
from pathlib import Path

from viasd.errors import ConfigError

__all__ = ["KNOWN_PARAMS", "GATED", "HUB_ROWS", "BYTES", "GIB", "visible_gpus_gib", "hub_reachable", "hf_token",
           "model_params", "built_params"]

# Parameter counts of the paper models (from their configs), so the estimate needs no download.
KNOWN_PARAMS: dict[str, int] = {
    "google/gemma-2-2b-it": 2_614_341_888,
    "google/gemma-2-9b-it": 9_241_705_984,
    "meta-llama/Llama-2-7b-chat-hf": 6_738_415_616,
    "meta-llama/Llama-2-70b-chat-hf": 68_976_648_192,
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "google/flan-t5-small": 76_961_152,
    "google/flan-t5-base": 247_577_856,
    "google/flan-t5-large": 783_150_080,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 134_515_008,
    # The package-index GGUFs carry an untied output matrix (viasd.models.index_specs): more than the hub configs.
    "Qwen/Qwen2.5-Coder-0.5B-Instruct (GGUF)": 630_167_424,
    "Qwen/Qwen2.5-Coder-1.5B-Instruct (GGUF)": 1_777_088_000,
}
# Hub ids whose licence must be accepted on the model page before a token can download them.
GATED: tuple[str, ...] = ("meta-llama/", "google/gemma")
# Rows of each task's pinned hub split (for the data line when the hub is the source).
HUB_ROWS: dict[str, int] = {"xsum": 11334, "cnndm": 11490, "wmt14_deen": 3003, "gsm8k": 1319, "nq_open": 3610,
                            "squad": 10570, "humaneval": 164, "mbpp": 500}
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp32": 4, "fp16": 2, "bf16": 2}
GIB = 1024**3


def visible_gpus_gib() -> list[float]:
    """Memory of each visible GPU in GiB; ``VIASD_DRYRUN_GPUS=80,80`` overrides (planning, tests):
    GiB per GPU, comma-separated finite positive numbers (empty: no GPU), else one ConfigError line
    naming it."""
    env = os.environ.get("VIASD_DRYRUN_GPUS")
    if env is not None and env.strip():
        try:
            gpus = [float(x) for x in env.split(",") if x.strip()]
        except ValueError:
            gpus = []
        if not gpus or not all(math.isfinite(g) and g > 0 for g in gpus):
            raise ConfigError(f"VIASD_DRYRUN_GPUS={env[:80]!r} is not a list of GPU sizes: give GiB per GPU, "
                              "comma-separated positive numbers (e.g. VIASD_DRYRUN_GPUS=80,80), or unset it")
        return gpus
    if env is not None:  # set but empty: no GPU
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory / GIB for i in range(torch.cuda.device_count())]


@cache
def hub_reachable() -> bool:
    """Whether huggingface.co answers on port 443 within 2 s (False with ``HF_HUB_OFFLINE=1``)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=2):
            return True
    except OSError:
        return False


def hf_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # an old huggingface_hub: fall back to the environment
        return os.environ.get("HF_TOKEN")


@cache
def _local_params(path: str, trust_remote_code: bool) -> int:
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    mcfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    auto = AutoModelForSeq2SeqLM if getattr(mcfg, "is_encoder_decoder", False) else AutoModelForCausalLM
    with init_empty_weights():
        model = auto.from_config(mcfg, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())


@cache
def built_params(pair_json: str) -> dict[str, int]:
    from viasd.models.pairs import load_pair

    pair = load_pair(json.loads(pair_json))
    return {role: sum(p.numel() for p in m.parameters())
            for role, m in (("draft", pair.draft), ("target", pair.target), ("intermediate", pair.intermediate))
            if m is not None}


def model_params(model_id: str, pair_name: str, trust_remote_code: bool) -> int:
    if model_id in KNOWN_PARAMS:
        return KNOWN_PARAMS[model_id]
    if (Path(model_id).expanduser() / "config.json").is_file():
        return _local_params(str(Path(model_id).expanduser()), trust_remote_code)
    raise ConfigError(
        f"pair {pair_name!r}: no parameter count for model {model_id!r} (unknown to viasd.harness.model_sizes.KNOWN_PARAMS "
        "and not a local folder with config.json); fix the id, add it to KNOWN_PARAMS, or download it first"
    )
