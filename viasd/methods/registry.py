"""The method registry: every decoding method registers here under a short name.

Each method module decorates its loop with :func:`register_method`. The built-in methods are
listed here explicitly and imported lazily (on the first lookup of their name), so nothing
registers by the side effect of an unrelated import. ``viasd`` is the user-facing alias of
``via_sd`` (``method=viasd`` on the command line and in old runs' configs). The ``cascade``
drafter, defined with the ``cascade_sd`` method, is listed here the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from viasd.engine.drafters import DRAFTERS
from viasd.engine.result import DecodeResult
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


BUILTIN = {
    "ar": "viasd.methods.ar",
    "sd": "viasd.methods.sd",
    "cascade_sd": "viasd.methods.cascade_sd",
    "faster_cascades": "viasd.methods.faster_cascades",
    "via_sd": "viasd.methods.via_sd",
    "hf_assisted": "viasd.methods.hf_assisted",
    "hf_prompt_lookup": "viasd.methods.hf_assisted",
}
for _name, _module in BUILTIN.items():
    METHODS.register_lazy(_name, _module)
METHODS.alias("viasd", "via_sd")
# The Cascade-SD cascade is a drafter of every method too (method.drafter.name=cascade).
DRAFTERS.register_lazy("cascade", "viasd.methods.cascade_sd")
