"""The method registry: every decoding method registers here under a short name.

Each method module decorates its loop with :func:`register_method`. The built-in methods are
listed here explicitly and imported lazily (on the first lookup of their name), so nothing
registers by the side effect of an unrelated import. ``viasd`` is the user-facing alias of
``via_sd`` (``method=viasd`` on the command line and in old runs' configs). Drafters, the
``cascade`` one included, register in :mod:`viasd.engine.drafters`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
    #: whether trace replay can run it (``viasd.analysis.replay.REPLAYS``: for most, the method's own loop over
    #: a trace world, :mod:`viasd.engine.world`); ``experiments.replay`` refuses the others with one line
    replayable: bool = False


METHODS: Registry[MethodSpec] = Registry("method")


def register_method(name: str, config_cls: type, lossless: bool, description: str = "", replayable: bool = False):
    """Decorator registering ``fn(pair, prompt_ids, cfg, gen, rng) -> DecodeResult`` as ``name``
    (``replayable``: trace replay can run it)."""

    def deco(fn):
        METHODS.register(name)(MethodSpec(name, fn, config_cls, lossless, description, replayable))
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
