"""Learned-gate files (``method.gate_path=``): what ``experiments.train_gate`` writes and ``via_sd`` reads.

A gate file (``torch.save`` of tensors and plain values, loaded with ``weights_only=True``) holds
the standardized logistic regression of :func:`~viasd.core.gate.gate_probability` (``mean``,
``scale``, ``coef``, ``intercept``) and ``meta``: the pair, the slim verifier's mask (its trace
spec and kept layers), the feature names, the top-k they are computed from, the gate temperature,
λ, the trace it was trained on and its held-out metrics. Its SHA-256 enters the run identity
(:func:`viasd.harness.identity.input_files`). A gate for another pair, mask or feature set is one
:class:`~viasd.errors.ConfigError`.
"""

from __future__ import annotations

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


def save_gate(path: str | Path, mean, scale, coef, intercept: float, meta: dict[str, Any]) -> Path:
    """Write a gate file (``mean``, ``scale``, ``coef``: ``[F]`` array-likes) → its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"mean": torch.as_tensor(mean, dtype=torch.float64), "scale": torch.as_tensor(scale, dtype=torch.float64),
                "coef": torch.as_tensor(coef, dtype=torch.float64), "intercept": float(intercept),
                "meta": {**meta, "features": list(FEATURES)}}, path)
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
        model = GateModel(d["mean"], d["scale"], d["coef"], float(d["intercept"]), {**d["meta"], "path": str(p)})
    except Exception as e:  # any unreadable file: not a gate
        raise ConfigError(f"{p} is not a gate file ({type(e).__name__}); train one with "
                          "`python -m experiments.train_gate`") from None
    if list(model.meta.get("features", [])) != list(FEATURES):
        raise ConfigError(f"gate {p} uses features {model.meta.get('features')}, this version {list(FEATURES)}; "
                          "retrain it with `python -m experiments.train_gate`")
    return model
