"""The compiled decode path (``+pair.compile=true``): a static KV cache and ``torch.compile`` of the
model's own forward.

:func:`compile_forward` registers a model (``viasd.models.pairs.load_pair`` does it for every model
of a pair with ``compile: true``); a :class:`~viasd.engine.stream.Stream` of a registered model then
takes the model's one ``StaticCache`` of ``cache_len`` positions (one per model, so the compiled
graph sees the same cache tensors in every decode and is not recompiled per stream; a stream
started later takes it over, and the earlier one refuses to run on), runs its prefill eager (as
transformers advises: a prompt-sized graph is compiled once per length) and every later forward
compiled. Rolling the cache back moves its write position (:func:`rewind`): the entries after it
stay in memory, masked by position, and are overwritten by the next tokens.

It serves the methods whose streams run the model's plain forward — ``ar``, ``sd`` and
``cascade_sd`` with model or lookup drafters; a routed or shared-prefix stream (``via_sd``'s slim
verifier, the ``self`` drafter) refuses with one line. Decoder-only models with full attention
only: an encoder-decoder or a sliding-window cache is refused at load time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import StaticCache

from viasd.errors import ConfigError

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class CompiledForward:
    """A model's compiled forward, its static cache and the stream that holds the cache (``owner``)."""

    forward: Callable
    backend: str
    cache_len: int
    static: StaticCache
    owner: object = None

    def take(self, stream) -> StaticCache:
        """The model's static cache, rolled back to empty, now ``stream``'s."""
        rewind(self.static, 0)
        self.owner = stream
        return self.static

    def check(self, stream) -> None:
        """Refuse a stream whose cache a later stream of the same model took over."""
        if self.owner is not stream:
            raise ConfigError(f"two streams of one compiled model run at once ({stream.name!r} after a newer one): "
                              "+pair.compile=true keeps one static cache per model; set +pair.compile=false")


def compile_forward(model, backend: str = "inductor", cache_len: int = 4096) -> CompiledForward:
    """Register ``model`` for the compiled path: ``torch.compile(model.forward, backend=backend)``
    (``inductor``; ``aot_eager`` / ``eager`` trace without generating code) over a static cache of
    ``cache_len`` positions. Refuses (:class:`~viasd.errors.ConfigError`) what it cannot roll back."""
    name = type(model).__name__
    if getattr(model.config, "is_encoder_decoder", False):
        raise ConfigError(f"+pair.compile=true compiles decoder-only models ({name} is an encoder-decoder); "
                          "set +pair.compile=false")
    if int(cache_len) < 1:
        raise ConfigError(f"pair.compile_cache_len must be >= 1 (got {cache_len})")
    if any(layer.is_sliding for layer in StaticCache(config=model.config, max_cache_len=8).layers):
        raise ConfigError(f"+pair.compile=true: {name} has sliding-window layers, whose static cache cannot roll "
                          "back by position; set +pair.compile=false")
    static = StaticCache(config=model.config, max_cache_len=int(cache_len))
    compiled = CompiledForward(torch.compile(model.forward, backend=backend), backend, int(cache_len), static)
    _COMPILED[model] = compiled
    return compiled


def compiled(model) -> CompiledForward | None:
    """The registered compiled forward of ``model`` (None: it runs eager)."""
    return _COMPILED.get(model)


def rewind(cache: StaticCache, length: int) -> None:
    """Roll a static cache back to its first ``length`` positions: move every layer's write position
    (in place: the compiled graph keeps reading the same tensor)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(length)
