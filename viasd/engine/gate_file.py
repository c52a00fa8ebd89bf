"""Learned-gate files (``method.gate_path=``): what ``experiments.train_gate`` writes and ``via_sd`` and the
replay read (a file reader below the methods, beside the streams they decode with).

A gate file (``torch.save`` of tensors and plain values, loaded with ``weights_only=True``) holds
the standardized logistic regression of :func:`~viasd.core.gate.gate_probability` (``mean``,
``scale``, ``coef``, ``intercept``) and ``meta``: the pair, the slim verifier's mask (its trace
spec and kept layers), the feature names, the top-k they are computed from, the gate temperature,
λ, the trace it was trained on and its held-out metrics. Its SHA-256 enters the run identity
(:func:`viasd.harness.identity.input_files`). A gate for another pair, mask or feature set is one
:class:`~viasd.errors.ConfigError`, and so is a malformed file (:func:`check_gate_data`): ``mean``,
``scale``, ``coef`` must be 1-D float tensors of one value per feature, finite, with every ``scale``
positive (a NaN coefficient makes every probability NaN — every token escalated — and a zero scale NaN or
±infinite ones); ``intercept`` a finite number; ``meta.topk`` a whole number ``>= 1``; ``meta.pair`` a
name and ``meta.layers`` whole layer indices.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from viasd.core.gate import FEATURES, gate_probability
from viasd.errors import ConfigError


@dataclass
class GateModel:
    """A loaded gate: its coefficients (``[F]`` tensors) and ``meta`` (see the module docstring)."""

    mean: torch.Tensor
    scale: torch.Tensor
    coef: torch.Tensor
    intercept: float
    meta: dict[str, Any]

    @property
    def topk(self) -> int:
        return int(self.meta["topk"])

    def probability(self, features: torch.Tensor) -> torch.Tensor:
        """``[n, F]`` features → ``[n]`` probabilities that the slim verifier's decision is the target's."""
        return gate_probability(features, self.mean, self.scale, self.coef, self.intercept)

    def check(self, pair_name: str, layers: list[int] | None) -> None:
        """One error line unless this gate was trained for ``pair_name`` and the slim mask ``layers``."""
        want = (self.meta.get("pair"), self.meta.get("layers"))
        have = (pair_name, [int(i) for i in layers] if layers is not None else None)
        if want != have:
            raise ConfigError(f"gate {self.meta.get('path', '')} was trained for pair {want[0]!r} with slim layers "
                              f"{want[1]} (mask {self.meta.get('mask')!r}), not pair {have[0]!r} with slim layers "
                              f"{have[1]}; train one for this pair and mask with `python -m experiments.train_gate`")


RETRAIN = "retrain it with `python -m experiments.train_gate run=<ar run id> mask=<mask> out=<gate file>`"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_gate_data(d: Any, where: str) -> None:
    """One ConfigError line naming the fix unless ``d`` (a loaded gate file) is well formed (module docstring)."""
    def bad(what: str) -> ConfigError:
        return ConfigError(f"gate file {where}: {what}; {RETRAIN}")

    if not isinstance(d, dict) or not isinstance(d.get("meta"), dict):
        raise bad("not an object of mean, scale, coef, intercept and meta")
    meta, n = d["meta"], len(FEATURES)
    if list(meta.get("features", [])) != list(FEATURES):
        raise bad(f"it uses features {meta.get('features')}, this version {list(FEATURES)}")
    for key in ("mean", "scale", "coef"):
        v = d.get(key)
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            raise bad(f"{key} must be a float tensor of {n} values (got {type(v).__name__})")
        if tuple(v.shape) != (n,):
            raise bad(f"{key} has shape {list(v.shape)}, not [{n}]: one value per feature of {list(FEATURES)}")
        if not bool(torch.isfinite(v).all()):
            raise bad(f"{key} holds NaN or infinite values (the gate would escalate every token)")
    if not bool((d["scale"] > 0).all()):
        raise bad("scale holds values <= 0 (a feature divided by 0 gives NaN or infinite probabilities: every "
                  "token escalated or trusted)")
    b = d.get("intercept")
    if isinstance(b, torch.Tensor) and b.numel() == 1:
        b = float(b)
    if isinstance(b, bool) or not isinstance(b, numbers.Real) or not math.isfinite(b):
        raise bad(f"intercept must be a finite number (got {b!r:.40})")
    topk = meta.get("topk")
    if not _is_int(topk) or topk < 1:
        raise bad(f"meta.topk must be a whole number >= 1 (got {topk!r:.40}): the top-k the features read")
    if not isinstance(meta.get("pair"), str) or not meta["pair"]:
        raise bad(f"meta.pair must name the pair it was trained for (got {meta.get('pair')!r:.40})")
    layers = meta.get("layers")
    if layers is not None and (not isinstance(layers, list) or not all(_is_int(i) and i >= 0 for i in layers)):
        raise bad(f"meta.layers must be the slim verifier's layer indices (got {layers!r:.60})")
    for key in ("train_problems", "test_problems"):
        if key in meta and (not isinstance(meta[key], list) or not all(_is_int(i) for i in meta[key])):
            raise bad(f"meta.{key} must be a list of example indices")


def save_gate(path: str | Path, mean, scale, coef, intercept: float, meta: dict[str, Any]) -> Path:
    """Write a gate file (``mean``, ``scale``, ``coef``: ``[F]`` array-likes) → its path; one error line, and
    nothing written, when it would not load (:func:`check_gate_data`)."""
    path = Path(path)
    d = {"mean": torch.as_tensor(mean, dtype=torch.float64), "scale": torch.as_tensor(scale, dtype=torch.float64),
         "coef": torch.as_tensor(coef, dtype=torch.float64), "intercept": float(intercept),
         "meta": {**meta, "features": list(FEATURES)}}
    check_gate_data(d, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(d, path)
    return path


def load_gate(path: str | Path | None) -> GateModel:
    """Load a gate file; a missing, unreadable or foreign (other feature set) file is one error line."""
    if not path:
        raise ConfigError("method.gate=learned needs method.gate_path=<gate file>; train one with "
                          "`python -m experiments.train_gate run=<ar run id> mask=<mask> out=gate.pt`")
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError(f"gate file not found: {p}; train one with `python -m experiments.train_gate`")
    try:
        d = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # any unreadable file: not a gate
        raise ConfigError(f"{p} is not a gate file ({type(e).__name__}); train one with "
                          "`python -m experiments.train_gate`") from None
    check_gate_data(d, str(p))
    return GateModel(d["mean"], d["scale"], d["coef"], float(d["intercept"]), {**d["meta"], "path": str(p)})
