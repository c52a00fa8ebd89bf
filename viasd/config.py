"""Typed configuration objects shared by the library and the Hydra entry points.

Hydra composes YAML into DictConfigs typed by these dataclasses (the schemas registered in its
ConfigStore by :mod:`viasd.harness.config`); :func:`to_dataclass` turns a node, dict or instance
into one (unknown keys and wrong types are one error line naming the key), so library code is
typed and every knob has one documented default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from viasd.errors import ConfigError

T = TypeVar("T")


@dataclass
class ModelSpec:
    """One model of a pair: a hub id or local path (``id``), optional GGUF file and revision."""

    id: str | None = ""  # None: set on the command line (pair=hf) or by the loader (smollm2)
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
    device_map: str | None = None  # auto: one GPU when a model fits one, else a balanced split (models.placement)
    allow_offload: bool = False  # device_map=auto may put modules on cpu/disk (refused otherwise)
    compile: bool = False  # static KV cache + torch.compile of each model's forward (viasd.engine.compiled)
    compile_backend: str = "inductor"  # torch.compile backend (aot_eager / eager: no code generation)
    compile_cache_len: int = 4096  # positions of the static cache (prompt + generated + one block)
    trust_remote_code: bool = False
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerationConfig:
    """Sampling and stopping settings shared by every method.

    ``temperature == 0`` is greedy. ``top_k``/``top_p`` are applied identically to draft and
    target, so lossless methods are lossless w.r.t. the *processed* target distribution.
    """

    max_new_tokens: int | None = 64  # None (composed configs only): the task's own
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
        if self.max_new_tokens is None or self.max_new_tokens < 1:
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


_KINDS = {int: ("an integer", "4"), float: ("a number", "0.5"), bool: ("true or false", "true")}


def _field_kind(cls: Any, key: Any) -> tuple[str, str] | None:
    """``(phrase, example)`` for an int/float/bool (or optional) field ``key`` of dataclass ``cls``."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(key, str)):
        return None
    ann = typing.get_type_hints(cls).get(key)
    args = [a for a in typing.get_args(ann) if a is not type(None)] if typing.get_origin(ann) in (
        typing.Union, types.UnionType) else [ann]
    return _KINDS.get(args[0]) if len(args) == 1 else None


def to_dataclass(cls: type[T], node: Any, where: str | None = None) -> T:
    """Dataclass ``cls`` from a dict / DictConfig / instance, typed by OmegaConf's structured merge.

    Nested dataclass fields are typed too. An unknown key or a value of the wrong type raises one
    :class:`ConfigError` line naming ``where.key`` (``where`` defaults to the class name). Range
    checks stay in the classes' ``validate()``.
    """
    if node is None:
        return cls()
    if isinstance(node, cls):
        return node
    if not isinstance(node, (dict, DictConfig)):
        raise ConfigError(f"expected a mapping for {cls.__name__}, got {node!r}")
    try:
        if isinstance(node, DictConfig):  # resolve interpolations against the node's own root
            node = OmegaConf.to_container(node, resolve=True)
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), node))
    except OmegaConfBaseException as e:
        at = ".".join(p for p in (where or cls.__name__, e.full_key) if p)
        owner = e.object_type
        if isinstance(e, ConfigKeyError) and isinstance(owner, type) and dataclasses.is_dataclass(owner):
            accepted = sorted(f.name for f in dataclasses.fields(owner))
            raise ConfigError(f"unknown {owner.__name__} keys [{e.key!r}] at {at}; accepted: {accepted}") from None
        kind = _field_kind(owner, e.key) if isinstance(e, ValidationError) else None
        if kind is not None:
            raise ConfigError(f"{at} must be {kind[0]}, got {e.value!r}; e.g. {at}={kind[1]}") from None
        raise ConfigError(f"{at}: {str(e).splitlines()[0]}") from None
