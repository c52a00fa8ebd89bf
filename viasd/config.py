"""Typed configuration objects shared by the library and the Hydra entry points.

Hydra composes YAML into DictConfigs; :func:`to_dataclass` turns a node into one of these
dataclasses (unknown keys are an error naming the allowed ones), so library code is typed and
every knob has one documented default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from viasd.errors import ConfigError

T = TypeVar("T")


@dataclass
class ModelSpec:
    """One model of a pair: a hub id or local path (``id``), optional GGUF file and revision."""

    id: str = ""
    revision: str | None = None
    dtype: str | None = None  # None: the pair's dtype
    gguf_file: str | None = None


@dataclass
class PairConfig:
    """A draft/target pair (plus an optional intermediate model for ablations).

    ``loader`` picks how the pair is built: ``tiny`` (random models from config, no download),
    ``hf`` (``from_pretrained`` on hub ids or paths), ``smollm2`` (the embedded default).
    """

    name: str = "tiny-llama"
    loader: str = "tiny"
    family: str = "llama"  # tiny loader only: llama | gemma2 | qwen2 | t5
    draft: ModelSpec | None = None
    target: ModelSpec | None = None
    intermediate: ModelSpec | None = None
    dtype: str = "float32"  # or "auto": fp32/bf16 chosen by a probe on this machine (models.backend)
    device: str = "cpu"
    backend: str = "auto"  # auto | eager | packed (oneDNN prepacked linears; auto = packed on CPU)
    device_map: str | None = None
    trust_remote_code: bool = False
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerationConfig:
    """Sampling and stopping settings shared by every method.

    ``temperature == 0`` is greedy. ``top_k``/``top_p`` are applied identically to draft and
    target, so lossless methods are lossless w.r.t. the *processed* target distribution.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop_strings: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    eos_token_ids: list[int] | None = None  # None: the target's generation config

    def eos_ids(self, pair) -> list[int]:
        """The EOS ids in force for ``pair`` (empty when ``ignore_eos``)."""
        if self.ignore_eos:
            return []
        return list(self.eos_token_ids) if self.eos_token_ids is not None else pair.eos_token_ids

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens}); set generation.max_new_tokens")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (got {self.temperature}); 0 means greedy")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (got {self.top_k}); 0 disables top-k")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] (got {self.top_p})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


_SCALARS = {int: "an integer", float: "a number", bool: "true or false"}


def _scalar_type(annotation: Any) -> tuple[type | None, bool]:
    """``(int|float|bool or None, None allowed)`` for a field annotation like ``int | None``."""
    if annotation in _SCALARS:
        return annotation, False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in _SCALARS:
            return rest[0], len(rest) < len(args)
    return None, True


def _check_type(where: str, key: str, annotation: Any, value: Any) -> None:
    """Raise a ConfigError when a numeric/boolean field gets a value of another type."""
    kind, nullable = _scalar_type(annotation)
    if kind is None or (value is None and nullable):
        return
    ok = isinstance(value, bool) if kind is bool else (
        isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{where}.{key} must be {_SCALARS[kind]}, got {value!r}; e.g. {where}.{key}=" +
                          {int: "4", float: "0.5", bool: "true"}[kind])


def to_dataclass(cls: type[T], node: Any, where: str | None = None) -> T:
    """Build dataclass ``cls`` from a dict / DictConfig / instance, recursively and strictly.

    Unknown keys raise a ConfigError listing the accepted ones; a value of the wrong type for
    an ``int`` / ``float`` / ``bool`` field (e.g. ``method.gamma=abc``) raises a ConfigError
    naming ``where.key`` (``where`` defaults to the class name).
    """
    if node is None:
        return cls()
    if isinstance(node, cls):
        return node
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(node, dict):
        raise ConfigError(f"expected a mapping for {cls.__name__}, got {node!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(node) - set(fields)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} keys {sorted(unknown)}; accepted: {sorted(fields)}")
    kwargs = {}
    hints = {ModelSpec: ("draft", "target", "intermediate")}
    try:
        annotations = typing.get_type_hints(cls)
    except Exception:  # an annotation that cannot be resolved: no type checks for this class
        annotations = {}
    for k, v in node.items():
        _check_type(where or cls.__name__, k, annotations.get(k), v)
        if cls is PairConfig and k in hints[ModelSpec] and isinstance(v, dict):
            v = to_dataclass(ModelSpec, v)
        kwargs[k] = v
    return cls(**kwargs)
