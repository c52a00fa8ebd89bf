"""Peak memory of a DIMR search or KL-geometry cell, from the quantities the code allocates.

:func:`calibration_peak_bytes` adds what :class:`~viasd.dimr.calibration.Calibration` holds:

* **persistent** — the weights; the token ids (int64; T5 also its teacher-forced decoder ids
  and the encoder output); the target's final hidden states ``N × H`` and, when the draft is
  loaded, the draft's ``N × H_d`` (model dtype, ``N`` calibration tokens); the target's cached
  log-probs (``cache_mib``, whole chunks, 0 by default);
* **memo** — hidden states after layer prefixes, ``B × L × H`` each, at most ``memo_mib``;
* **transient** — the larger of one sub-layer's activations on a batch (attention:
  normed input, q/k/v, rotated q/k, keys and values repeated to every head, output, the
  scores ``B × heads × L × L`` in float32; MLP: normed input, gate, up and their product) and
  the statistics of one chunk of ``C`` positions (:func:`~viasd.dimr.calibration.chunk_positions`,
  at most a batch): ``k`` float32 ``[C, V]`` log-probs (``k = 2``: ``q``, ``q'``; 3 with the draft's
  ``p``) plus ``kl_sum``'s ``exp`` (4 bytes), difference (4) and zero mask (1), or — while
  the last of them is built — the head's logits in the model dtype, their float32 copy and
  the log-softmax output; plus the slim pass's final hidden states of the batch.

The dry run prints it per search/KL cell (:func:`cell_peak`) and refuses a cell that does not
fit; ``tests/test_dimr_memory.py`` checks it against torch's allocation records on CPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from viasd.dimr.calibration import MIB, chunk_positions
from viasd.engine.routing import vocab_size_of
from viasd.errors import ConfigError
from viasd.models.gguf_index import converted_dir, index_model
from viasd.models.pairs import load_pair

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate reads of a model: sizes of its decoder and of its LM head."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    encoder_decoder: bool = False


def _causal(layers, hidden, intermediate, heads, kv_heads, head_dim, vocab) -> ModelShape:
    return ModelShape(layers, hidden, intermediate, heads, kv_heads, head_dim, vocab)


# From the models' public config.json files, so a plan needs no download.
KNOWN_SHAPES: dict[str, ModelShape] = {
    "google/gemma-2-2b-it": _causal(26, 2304, 9216, 8, 4, 256, 256000),
    "google/gemma-2-9b-it": _causal(42, 3584, 14336, 16, 8, 256, 256000),
    "meta-llama/Llama-2-7b-chat-hf": _causal(32, 4096, 11008, 32, 32, 128, 32000),
    "meta-llama/Llama-2-70b-chat-hf": _causal(80, 8192, 28672, 64, 8, 128, 32000),
    "Qwen/Qwen2.5-0.5B-Instruct": _causal(24, 896, 4864, 14, 2, 64, 151936),
    "Qwen/Qwen2.5-1.5B-Instruct": _causal(28, 1536, 8960, 12, 2, 128, 151936),
    "Qwen/Qwen2.5-7B-Instruct": _causal(28, 3584, 18944, 28, 4, 128, 152064),
    "Qwen/Qwen2.5-Coder-0.5B-Instruct": _causal(24, 896, 4864, 14, 2, 64, 151936),
    "Qwen/Qwen2.5-Coder-1.5B-Instruct": _causal(28, 1536, 8960, 12, 2, 128, 151936),
    "HuggingFaceTB/SmolLM2-135M-Instruct": _causal(30, 576, 1536, 9, 3, 64, 49152),
    "google/flan-t5-small": ModelShape(8, 512, 1024, 6, 6, 64, 32128, True),
    "google/flan-t5-base": ModelShape(12, 768, 2048, 12, 12, 64, 32128, True),
    "google/flan-t5-large": ModelShape(24, 1024, 2816, 16, 16, 64, 32128, True),
}


def shape_of_config(cfg) -> ModelShape:
    """The :class:`ModelShape` of a transformers config (T5: its decoder)."""
    if getattr(cfg, "is_encoder_decoder", False):
        return ModelShape(int(getattr(cfg, "num_decoder_layers", None) or cfg.num_layers), cfg.d_model, cfg.d_ff,
                          cfg.num_heads, cfg.num_heads, cfg.d_kv, cfg.vocab_size, True)
    heads = int(cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return ModelShape(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, heads,
                      int(getattr(cfg, "num_key_value_heads", None) or heads), int(head_dim), cfg.vocab_size)


def shape_of_model(model) -> ModelShape:
    """The :class:`ModelShape` of a loaded model (vocabulary: its logits' width, a widened head included)."""
    return ModelShape(**{**asdict(shape_of_config(model.config)), "vocab": vocab_size_of(model)})


def calibration_peak_bytes(target: ModelShape, draft: ModelShape | None, n_tokens: int, batch_size: int,
                           seq_len: int, dtype_bytes: int, weights_bytes: int = 0, memo_mib: float = 1024.0,
                           stat_mib: float = 64.0, tv_terms: bool = False, cache_mib: float = 0.0) -> dict[str, int]:
    """Peak bytes of a calibration (search or KL geometry) with ``n_tokens`` tokens in batches of
    ``batch_size`` rows of ``seq_len`` tokens; ``draft``: the draft's shape when it is loaded.

    Returns ``{"weights", "persistent", "memo", "transient", "total"}`` (see the module docstring).
    """
    b, H, L = dtype_bytes, target.hidden, seq_len
    rows = min(batch_size, max(1, n_tokens // max(1, L)))
    positions = rows * L
    persistent = n_tokens * 8 + n_tokens * H * b
    if target.encoder_decoder:
        persistent += n_tokens * 8 + n_tokens * H * b
    if draft is not None:
        persistent += n_tokens * draft.hidden * b
    entry = positions * H * b
    memo = int(memo_mib * MIB) // entry * entry  # the memo keeps whole entries while they fit
    qkv = target.heads * target.head_dim
    attn = positions * b * (2 * H + 3 * qkv + 4 * target.kv_heads * target.head_dim + 2 * qkv) \
        + rows * target.heads * L * L * 4
    mlp = positions * b * (2 * H + 3 * target.intermediate)
    V = target.vocab
    C = min(chunk_positions(V, stat_mib), positions)
    n_chunks = -(-n_tokens // positions) * -(-positions // C)
    persistent += min(int(cache_mib * MIB) // (4 * C * V), n_chunks) * 4 * C * V  # cached target log-probs
    k = 3 if draft is not None else 2
    stats = max(4 * k + 9, 4 * (k - 1) + b + 4 + (4 if b != 4 else 0)) * C * V
    if tv_terms:
        stats = max(stats, (4 * k + 8) * C * V)
    transient = max(attn, mlp, stats) + positions * H * b
    total = weights_bytes + persistent + memo + transient
    return {"weights": int(weights_bytes), "persistent": int(persistent), "memo": int(memo),
            "transient": int(transient), "total": int(total)}


@cache
def _built_shapes(pair_json: str) -> dict[str, ModelShape]:
    pair = load_pair(json.loads(pair_json))
    return {role: shape_of_model(m) for role, m in (("draft", pair.draft), ("target", pair.target)) if m is not None}


def _spec_shape(pair: dict[str, Any], role: str) -> ModelShape | None:
    spec = pair.get(role) or {}
    if not spec.get("id"):
        return None
    model_id = str(spec["id"])
    if pair.get("loader") == "gguf_index":
        model = index_model(model_id)
        if model.hub_id in KNOWN_SHAPES:
            return KNOWN_SHAPES[model.hub_id]
        model_id = str(converted_dir(model))
    if model_id in KNOWN_SHAPES:
        return KNOWN_SHAPES[model_id]
    if (Path(model_id).expanduser() / "config.json").is_file():
        return shape_of_config(AutoConfig.from_pretrained(str(Path(model_id).expanduser()),
                                                          trust_remote_code=bool(pair.get("trust_remote_code"))))
    raise ConfigError(f"pair {pair.get('name')!r}: no shape for model {model_id!r} to estimate the DIMR memory "
                      "(add it to viasd.dimr.memory.KNOWN_SHAPES, or download it first)")


def pair_shapes(pair: dict[str, Any]) -> dict[str, ModelShape]:
    """``{role: shape}`` of a resolved pair config's target and draft, without downloading."""
    loader = pair.get("loader", "tiny")
    if loader in ("hf", "gguf_index"):
        return {r: s for r in ("draft", "target") if (s := _spec_shape(pair, r)) is not None}
    if loader == "smollm2":
        return {"target": KNOWN_SHAPES["HuggingFaceTB/SmolLM2-135M-Instruct"]}  # a distilled draft is tiny
    return _built_shapes(json.dumps({**pair, "dtype": "float32"}, sort_keys=True))


def cell_peak(cfg, pair: dict[str, Any], weights_bytes: int, entry: str) -> dict[str, int]:
    """:func:`calibration_peak_bytes` of a composed search (``entry="search"``) or KL cell."""
    s = cfg.search
    shapes = pair_shapes(pair)
    if "target" not in shapes:
        raise ConfigError(f"pair {pair.get('name')!r} has no target model to search a mask for")
    n = int(s.n_calibration)
    n_search = n - round(n * float(s.get("held_out", 0.0) or 0.0)) if entry == "search" else n
    dtype = str(s.get("dtype", "float32") if entry == "kl" else s.dtype)
    return calibration_peak_bytes(shapes["target"], shapes.get("draft"), n_search * int(s.seq_len),
                                  int(s.batch_size), int(s.seq_len), BYTES.get(dtype, 4), weights_bytes,
                                  float(s.get("memo_mib", 1024)), float(s.get("stat_mib", 64)), tv_terms=entry == "kl",
                                  cache_mib=float(s.get("cache_mib", 0.0)) if entry == "search" else 0.0)
