"""The single entry point :func:`decode` over the method registry.

Methods register with :func:`~viasd.methods.registry.register_method` (name, typed
config class, whether they are lossless w.r.t. the target); the registry lists the built-in
ones and imports each on first use. :func:`decode` validates inputs, seeds the generator, runs the
method and fills in the decoded text.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from viasd.config import GenerationConfig, to_dataclass
from viasd.engine.result import DecodeResult
from viasd.errors import ConfigError
from viasd.methods.registry import METHODS, MethodSpec, register_method  # noqa: F401  (re-exported)


def method_config(name: str, cfg: Any = None) -> Any:
    """The typed config of method ``name`` from a dict/DictConfig (``name`` key ignored), validated."""
    spec = METHODS.get(name)
    if cfg is not None and not isinstance(cfg, spec.config_cls):
        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
        cfg = {k: v for k, v in dict(cfg).items() if k != "name"}
    out = to_dataclass(spec.config_cls, cfg, where="method")
    if hasattr(out, "validate"):
        out.validate()
    return out


def decode(
    pair,
    prompt: str | torch.Tensor,
    method: str = "sd",
    method_cfg: Any = None,
    gen: GenerationConfig | dict | None = None,
    seed: int = 0,
) -> DecodeResult:
    """Decode one prompt with a registered method.

    Args:
        pair: a :class:`~viasd.models.pairs.ModelPair`.
        prompt: text, or ``LongTensor[1, P]`` token ids.
        method: registered method name (``ar``, ``sd``, ``hf_assisted``, …).
        method_cfg: the method's config (dataclass, dict or DictConfig).
        gen: generation settings.
        seed: seeds the sampling generator.

    Returns:
        The method's :class:`DecodeResult` with ``text`` decoded.
    """
    spec = METHODS.get(method)
    cfg = method_config(method, method_cfg)
    gen = to_dataclass(GenerationConfig, gen)
    gen.validate()
    ids = pair.encode(prompt) if isinstance(prompt, str) else prompt
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise ConfigError(f"prompt ids must have shape [1, P] with P >= 1 (got {tuple(ids.shape)}); batch size is 1")
    rng = torch.Generator(device=ids.device).manual_seed(seed)
    result = spec.fn(pair, ids, cfg, gen, rng)
    result.text = pair.tokenizer.decode(result.tokens, skip_special_tokens=True)
    return result


def warm_up(pair, prompt: str | torch.Tensor, method: str, method_cfg: Any = None,
            gen: GenerationConfig | dict | None = None, max_new_tokens: int = 8) -> None:
    """One short untimed decode (at most ``max_new_tokens``) so one-time costs (allocator,
    kernel selection, lazy initialisation) stay out of the first timed example."""
    gen = to_dataclass(GenerationConfig, gen)
    short = GenerationConfig(**{**gen.__dict__, "max_new_tokens": min(max_new_tokens, gen.max_new_tokens)})
    decode(pair, prompt, method, method_cfg, short)

