"""Model pairs: load a draft + target (+ optional intermediate) from a :class:`PairConfig`.

Loaders are registered by kind (``tiny``, ``hf``, ``gguf_index``; ``smollm2`` lazily, from
:mod:`viasd.distill.pair`, a layer above this one); pair *names* are the YAML
files under ``conf/pair/``. ``pair=hf pair.target.id=<hub id or folder> [pair.draft.id=…]``
(or ``pair.target.gguf=<file.gguf>``) loads any checkpoint without a YAML; its draft must
share the target's tokenizer (compared as vocabularies; a narrower LM head is widened with
``-inf`` logits so both produce the same width). :func:`load_pair` checks the output widths
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
from viasd.engine.compiled import compile_forward
from viasd.engine.routing import vocab_size_of  # noqa: F401  (re-exported)
from viasd.errors import ConfigError
from viasd.models.backend import apply_backend, probe_dtype, resolve_backend
from viasd.paths import PROJECT_ROOT
from viasd.registry import Registry

log = logging.getLogger(__name__)

PAIR_LOADERS: Registry = Registry("pair loader")
# The embedded default pair's loader builds the distilled draft, a layer above this one.
PAIR_LOADERS.register_lazy("smollm2", "viasd.distill.pair:load_smollm2_pair")
PAIR_CONF_DIR = PROJECT_ROOT / "conf" / "pair"

#: ``pair.options`` keys that configure the slim verifier, not the models (every loader leaves them to
#: :func:`load_pair`, which copies them to ``ModelPair.extras``): shipped DIMR masks by keep ratio and the
#: ablation ``slim.mask: auto`` may fall back to (:func:`viasd.dimr.masks.mask_source`).
MASK_OPTIONS = ("slim_layers", "slim_fallback")

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
        return to_dataclass(PairConfig, _gguf_specs(OmegaConf.load(PAIR_CONF_DIR / f"{name_or_cfg}.yaml")))
    return to_dataclass(PairConfig, _gguf_specs(name_or_cfg))


def _gguf_specs(node: Any) -> Any:
    """Map a model spec's ``gguf: <file>`` (the command-line spelling) onto ``id`` + ``gguf_file``."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    if not isinstance(node, dict):
        return node
    node = dict(node)
    for role in ("target", "draft", "intermediate"):
        spec = node.get(role)
        if isinstance(spec, dict) and "gguf" in spec:
            spec = dict(spec)
            gguf = spec.pop("gguf")
            if gguf:
                f = local_path(gguf)
                if not f.is_file():
                    raise ConfigError(f"pair.{role}.gguf: file not found: {f}")
                spec["id"], spec["gguf_file"] = str(f.parent), f.name
            node[role] = spec
    return node


def load_pair(name_or_cfg: str | PairConfig | dict, **overrides: Any) -> ModelPair:
    """Load a pair by name or config; ``overrides`` replace PairConfig fields (e.g. ``dtype``).

    Applies ``pair.backend`` and ``pair.dtype: auto`` (see :mod:`viasd.models.backend`) and
    records the choices in ``pair.extras["runtime"]`` (``dtype``, ``backend``, ``dtype_probe``).
    """
    cfg = pair_config(name_or_cfg)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    if cfg.compile and cfg.backend not in ("auto", "eager"):
        raise ConfigError(f"+pair.compile=true compiles the model's own linear layers; pair.backend={cfg.backend} "
                          "replaces them: set pair.backend=eager (or auto)")
    backend = resolve_backend("eager" if cfg.compile else cfg.backend, cfg.device if cfg.device_map is None else "cuda")
    probe = None
    if cfg.dtype == "auto":
        cfg.dtype, probe = probe_dtype(cfg.device)
    dtype = resolve_dtype(cfg.dtype)
    pair = PAIR_LOADERS.get(cfg.loader)(cfg)
    check_vocab(pair)
    unique = {id(m): m for m in (pair.target, pair.draft, pair.intermediate) if m is not None}
    for m in unique.values():  # an intermediate that is the draft is one module: packed once
        if cfg.device_map is None:
            m.to(device=cfg.device, dtype=dtype)
            m.eval()
            apply_backend(m, backend)
    if cfg.compile:  # after placement: the compiled forward runs the models where they sit
        for m in unique.values():
            compile_forward(m, cfg.compile_backend, cfg.compile_cache_len)
    pair.extras["runtime"] = {"dtype": cfg.dtype, "backend": backend, "dtype_probe": probe}
    if cfg.compile:
        pair.extras["runtime"]["compile"] = cfg.compile_backend
    pair.extras.update({k: cfg.options[k] for k in MASK_OPTIONS if cfg.options.get(k) is not None})
    return pair


def model_options(cfg: PairConfig) -> dict[str, Any]:
    """``cfg.options`` without the slim-verifier keys (:data:`MASK_OPTIONS`): what a loader builds from."""
    return {k: v for k, v in dict(cfg.options).items() if k not in MASK_OPTIONS}


def store_name(cfg: PairConfig | dict) -> str:
    """The name runs and DIMR masks of a pair are stored under: ``cfg.name``, except ``pair=hf``,
    which names one checkpoint ``hf-<target folder or .gguf file name>``."""
    name = cfg.name if isinstance(cfg, PairConfig) else str(cfg.get("name"))
    if name != "hf":
        return name
    cfg = cfg if isinstance(cfg, PairConfig) else pair_config(cfg)
    if cfg.target is None or not cfg.target.id:
        return name
    path = cfg.target.id + (f"/{cfg.target.gguf_file}" if cfg.target.gguf_file else "")
    return "hf-" + Path(path.rstrip("/")).name


@PAIR_LOADERS.register("tiny")
def _load_tiny(cfg: PairConfig) -> ModelPair:
    from viasd.models.tiny import build_tiny_pair

    draft, target, tok = build_tiny_pair(cfg.family, seed=cfg.seed, **model_options(cfg))
    return ModelPair(name=cfg.name, target=target, draft=draft, tokenizer=tok)


def intermediate_is_draft(cfg: PairConfig) -> bool:
    """Whether ``pair.intermediate`` names the same model as ``pair.draft`` (id, revision, dtype, file):
    loaders then load it once and share the module (the slim-verifier ablation's independent
    verifier may be the pair's own draft when a model-free drafter proposes)."""
    d, i = cfg.draft, cfg.intermediate
    return bool(d is not None and i is not None and d.id and i.id
                and (d.id, d.revision, d.dtype, d.gguf_file) == (i.id, i.revision, i.dtype, i.gguf_file))


def _check_source(spec: ModelSpec, role: str) -> None:
    """A local folder that does not exist is one clear line (not a hub lookup that fails later)."""
    looks_local = spec.id.startswith(("/", ".", "~")) or spec.id.count("/") > 1 or "\\" in spec.id
    path = local_path(spec.id)
    if looks_local and not path.exists():
        raise ConfigError(f"pair.{role}.id: folder not found: {path} (give an existing model folder or a hub id "
                          "such as Qwen/Qwen2.5-0.5B-Instruct)")
    if path.is_dir() and not (path / "config.json").is_file() and not spec.gguf_file:
        raise ConfigError(f"pair.{role}.id: {path} holds no config.json; point it at a folder saved with "
                          f"save_pretrained, or a .gguf file with pair.{role}.gguf=FILE")


def _load_error(what: str, spec: ModelSpec, e: Exception) -> ConfigError:
    msg = (str(e).strip().splitlines() or [""])[0][:300]
    hint = ("the file may be truncated or corrupt: re-download or re-save it"
            if "safetensor" in f"{type(e).__name__} {msg}".lower() or "header" in msg.lower()
            else "check the hub id / local path, your network and HF token, or pick an offline pair (pair=smollm2)")
    return ConfigError(f"could not load the {what} {spec.id}{'/' + spec.gguf_file if spec.gguf_file else ''} "
                       f"({type(e).__name__}: {msg}); {hint}")


def _from_pretrained(spec: ModelSpec, cfg: PairConfig) -> PreTrainedModel:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    kwargs: dict[str, Any] = dict(
        revision=spec.revision,
        dtype=resolve_dtype(spec.dtype or cfg.dtype),
        trust_remote_code=cfg.trust_remote_code,
    )
    if spec.gguf_file:
        kwargs["gguf_file"] = spec.gguf_file
    mcfg = AutoConfig.from_pretrained(spec.id, revision=spec.revision, trust_remote_code=cfg.trust_remote_code,
                                      **({"gguf_file": spec.gguf_file} if spec.gguf_file else {}))
    auto = AutoModelForSeq2SeqLM if getattr(mcfg, "is_encoder_decoder", False) else AutoModelForCausalLM
    if cfg.device_map == "auto":  # one GPU when it fits, a balanced split otherwise, never a silent offload
        kwargs["device_map"] = auto_device_map(auto, mcfg, kwargs["dtype"], spec.id, cfg.allow_offload)
    elif cfg.device_map:
        kwargs["device_map"] = cfg.device_map
    return auto.from_pretrained(spec.id, **kwargs).eval()


def auto_device_map(auto: Any, mcfg: Any, dtype: torch.dtype, name: str, allow_offload: bool) -> dict[str, Any]:
    """The device map of ``pair.device_map=auto``: the model built on the meta device (no weights)
    placed over the GPUs' free memory (:func:`viasd.models.placement.place`)."""
    from accelerate import init_empty_weights

    from viasd.models.placement import gpu_max_memory, place

    with init_empty_weights():
        meta = auto.from_config(mcfg, dtype=dtype)
    return place(meta, gpu_max_memory(), name, allow_offload)


def _tokenizer(spec: ModelSpec, cfg: PairConfig) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec.id, revision=spec.revision, trust_remote_code=cfg.trust_remote_code,
                                         **({"gguf_file": spec.gguf_file} if spec.gguf_file else {}))


class WidenedHead(torch.nn.Module):
    """An LM head whose logits ``[.., V0]`` are extended to ``[.., vocab]`` with ``-inf``: rows a
    checkpoint pads its embedding with beyond the shared tokenizer are never predicted."""

    def __init__(self, head: torch.nn.Module, vocab: int):
        super().__init__()
        self.head, self.vocab = head, vocab

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [.., H]`` → ``[.., vocab]`` logits."""
        out = self.head(hidden)
        pad = out.new_full((*out.shape[:-1], self.vocab - out.shape[-1]), float("-inf"))
        return torch.cat([out, pad], -1)


def check_tokenizers(tokenizers: dict[str, PreTrainedTokenizerBase], ids: dict[str, str]) -> None:
    """Raise one ConfigError naming both models when a tokenizer's vocabulary differs from the target's."""
    ref = tokenizers["target"].get_vocab()
    for role, tok in tokenizers.items():
        if role == "target":
            continue
        vocab = tok.get_vocab()
        if vocab != ref:
            diff = len(set(vocab.items()) ^ set(ref.items()))
            raise ConfigError(f"vocabulary mismatch: the {role} {ids[role]} and the target {ids['target']} use different "
                              f"tokenizers ({len(vocab)} vs {len(ref)} tokens, {diff} entries differ); pick a {role} "
                              "from the target's family (same tokenizer)")


def widen_heads(models: list[PreTrainedModel]) -> None:
    """Give every causal model of a pair the widest LM-head width (``-inf`` logits on the padding)."""
    width = max(vocab_size_of(m) for m in models)
    for m in models:
        if vocab_size_of(m) < width:
            if getattr(m.config, "is_encoder_decoder", False):
                raise ConfigError(f"{m.config._name_or_path}: LM head narrower than its pair's ({width}); "
                                  "encoder-decoder heads are not widened")
            m.set_output_embeddings(WidenedHead(m.get_output_embeddings(), width))


@PAIR_LOADERS.register("hf")
def _load_hf(cfg: PairConfig) -> ModelPair:
    specs = {role: spec for role, spec in (("target", cfg.target), ("draft", cfg.draft),
                                            ("intermediate", cfg.intermediate)) if spec is not None and spec.id}
    if "target" not in specs:
        raise ConfigError(f"pair {cfg.name!r}: set pair.target.id to a hub id or model folder "
                          "(or pair.target.gguf=FILE.gguf)")
    if intermediate_is_draft(cfg):
        del specs["intermediate"]
    for role, spec in specs.items():
        _check_source(spec, role)
    models, toks = {}, {}
    for role, spec in specs.items():
        try:
            toks[role] = _tokenizer(spec, cfg)
            models[role] = _from_pretrained(spec, cfg)
        except (OSError, ValueError, RuntimeError) as e:
            raise _load_error(role, spec, e) from e
        except Exception as e:  # safetensors' own error type for a truncated file
            if "safetensor" not in type(e).__module__.lower() + type(e).__name__.lower():
                raise
            raise _load_error(role, spec, e) from e
        models[role].config._name_or_path = spec.id + (f"/{spec.gguf_file}" if spec.gguf_file else "")
    check_tokenizers(toks, {r: models[r].config._name_or_path for r in models})
    widen_heads(list(models.values()))
    name = store_name(cfg)  # pair=hf: one run-store / mask-cache name per target checkpoint
    intermediate = models.get("draft") if intermediate_is_draft(cfg) else models.get("intermediate")
    return ModelPair(name=name, target=models["target"], draft=models.get("draft"), tokenizer=toks["target"],
                     intermediate=intermediate)


def local_path(p: str | Path) -> Path:
    return Path(p).expanduser().resolve()


@PAIR_LOADERS.register("gguf_index")
def _load_gguf_index(cfg: PairConfig) -> ModelPair:
    """Real models from the package index, named by spec (``pair.target.id`` etc., see
    :data:`viasd.models.gguf_index.INDEX_MODELS`); draft and intermediate are optional and must
    tokenize exactly like the target. ``options.slim_layers`` ships DIMR masks (see :data:`MASK_OPTIONS`).
    """
    from viasd.models.gguf_index import check_same_tokenizer, load_index_model

    if cfg.target is None or not cfg.target.id:
        raise ConfigError(f"pair {cfg.name!r}: set pair.target.id to a package-index model name")
    models: dict[str, PreTrainedModel | None] = {}
    target, tok = load_index_model(cfg.target.id, dtype=resolve_dtype(cfg.target.dtype or cfg.dtype))
    for role in ("draft", "intermediate"):
        spec = getattr(cfg, role)
        models[role] = None
        if role == "intermediate" and intermediate_is_draft(cfg):
            models[role] = models["draft"]
        elif spec is not None and spec.id:
            model, other_tok = load_index_model(spec.id, dtype=resolve_dtype(spec.dtype or cfg.dtype))
            check_same_tokenizer(other_tok, tok, (spec.id, cfg.target.id))
            model.config._name_or_path = f"{spec.id} (GGUF from the package index)"
            models[role] = model
    target.config._name_or_path = f"{cfg.target.id} (GGUF from the package index)"
    return ModelPair(name=cfg.name, target=target, draft=models["draft"], tokenizer=tok,
                     intermediate=models["intermediate"])  # fmt: skip
