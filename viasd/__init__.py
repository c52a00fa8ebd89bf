"""viasd: a research harness for multi-tier speculative decoding (VIA-SD and its baselines).

The public Python API is re-exported here (:mod:`viasd.api`), imported on first use so that
``import viasd.<module>`` stays as light as before::

    import viasd
    pair = viasd.pair_from_models(target, tokenizer, draft)
    out = viasd.generate(pair, "Name three rivers.", "via_sd", tau_accept=0.9, max_new_tokens=64)
    out.text, out.tokens, out.counters
"""

from __future__ import annotations

from typing import Any

__all__ = ["pair_from_models", "generate", "trace", "replay_policy", "method_defaults", "decode", "DecodeResult",
           "ModelPair", "ConfigError"]

_HOMES = {"pair_from_models": "viasd.api", "generate": "viasd.api", "trace": "viasd.api",
          "replay_policy": "viasd.api", "method_defaults": "viasd.api", "decode": "viasd.methods.api",
          "DecodeResult": "viasd.engine.result", "ModelPair": "viasd.models.pairs", "ConfigError": "viasd.errors"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'viasd' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
