"""The method registry: every decoding method registers here under a short name.

Each method module decorates its loop with :func:`register_method`; :mod:`viasd.decoding.api`
imports the built-in method modules explicitly, so importing the API registers them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from viasd.decoding.result import DecodeResult
from viasd.registry import Registry


@dataclass
class MethodSpec:
    """A registered decoding method."""

    name: str
    fn: Callable[..., DecodeResult]
    config_cls: type
    lossless: bool
    description: str = ""


METHODS: Registry[MethodSpec] = Registry("method")


def register_method(name: str, config_cls: type, lossless: bool, description: str = ""):
    """Decorator registering ``fn(pair, prompt_ids, cfg, gen, rng) -> DecodeResult`` as ``name``."""

    def deco(fn):
        METHODS.register(name)(MethodSpec(name, fn, config_cls, lossless, description))
        return fn

    return deco
