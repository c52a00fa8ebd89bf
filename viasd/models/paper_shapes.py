"""The paper pairs' architectures as random-weight models: paper-shape cost measurements, no download.

``conf/paper_shapes.yaml`` holds each paper model's architecture (the fields of its published
``config.json``); the pairs are ``conf/pair/<name>.yaml`` (draft / target / intermediate ids).
:func:`architecture_config` turns an entry into a transformers config — optionally cut to
``layers`` decoder layers and narrowed by ``width_div`` (hidden, MLP, head and vocabulary sizes
divided; head counts kept) for a CPU self-test of the same code path — and
:func:`build_random` instantiates it with random weights directly on the device.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT

__all__ = ["SHAPES_FILE", "paper_architectures", "paper_pairs", "optional_models", "architecture_config",
           "build_random", "param_count"]

SHAPES_FILE = PROJECT_ROOT / "conf" / "paper_shapes.yaml"


@functools.cache
def _shapes() -> dict[str, Any]:
    return yaml.safe_load(SHAPES_FILE.read_text(encoding="utf-8"))


def paper_architectures() -> dict[str, dict[str, Any]]:
    """``{hub id: config fields}`` of every paper model (``conf/paper_shapes.yaml``)."""
    return {k: dict(v) for k, v in _shapes()["models"].items()}


def optional_models() -> list[str]:
    """Models measured only when asked for and when they fit (Llama-2-70B: ~138 GB of bf16 weights)."""
    return list(_shapes().get("optional") or [])


def paper_pairs() -> dict[str, dict[str, str]]:
    """``{pair name: {"draft": id, "target": id[, "intermediate": id]}}`` from ``conf/pair/<name>.yaml``."""
    out: dict[str, dict[str, str]] = {}
    for name in _shapes()["pairs"]:
        cfg = yaml.safe_load((PROJECT_ROOT / "conf" / "pair" / f"{name}.yaml").read_text(encoding="utf-8"))
        out[name] = {role: cfg[role]["id"] for role in ("draft", "target", "intermediate") if (cfg.get(role) or {}).get("id")}
    return out


def architecture_config(model_id: str, layers: int | None = None, width_div: int = 1) -> PretrainedConfig:
    """The transformers config of paper model ``model_id``.

    ``layers``: keep only this many decoder layers (None: all). ``width_div``: divide hidden,
    MLP, head and vocabulary sizes by it (1: the real shapes); head counts stay, the hidden size
    stays a multiple of the head count.
    """
    archs = paper_architectures()
    if model_id not in archs:
        raise ConfigError(f"no architecture for {model_id!r} in {SHAPES_FILE}; known: {', '.join(archs)}")
    fields = dict(archs[model_id])
    model_type = fields.pop("model_type")
    if layers is not None:
        fields["num_hidden_layers"] = min(int(layers), fields["num_hidden_layers"])
    if width_div > 1:
        heads = fields["num_attention_heads"]
        fields["hidden_size"] = max(heads, fields["hidden_size"] // width_div // heads * heads)
        fields["intermediate_size"] = max(8, fields["intermediate_size"] // width_div)
        fields["vocab_size"] = max(256, fields["vocab_size"] // width_div)
        if "head_dim" in fields:
            fields["head_dim"] = max(4, fields["head_dim"] // width_div)
        if "query_pre_attn_scalar" in fields:
            fields["query_pre_attn_scalar"] = fields.get("head_dim", fields["query_pre_attn_scalar"])
    return AutoConfig.for_model(model_type, **fields)


def build_random(model_id: str, device: str | torch.device, dtype: torch.dtype, layers: int | None = None,
                 width_div: int = 1) -> PreTrainedModel:
    """Paper model ``model_id`` with random weights, built on ``device`` in ``dtype`` (eval mode)."""
    cfg = architecture_config(model_id, layers, width_div)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.config._name_or_path = f"{model_id} (random weights, paper shapes)"
    return model.eval()


def param_count(model_id: str, layers: int | None = None, width_div: int = 1) -> int:
    """Parameters of paper model ``model_id`` (instantiated on the meta device: no memory)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(architecture_config(model_id, layers, width_div))
    return sum(p.numel() for p in model.parameters())
