"""Slim-verifier masks: resolve ``slim.mask`` to a routed stream, and store mask artifacts.

A mask artifact is a JSON file (pair, model revisions, number of layers, kept layers,
objective and its value, every trial, search seconds) written by the DIMR search under
``<cache>/masks/<pair>/keep<ratio>-<objective>.json``. ``slim.mask`` accepts ``auto`` (that
file), a path, an explicit list of layers, or an ablation name (``random``, ``first_k``,
``every_other``, ``independent``, ``full``).
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import Any

import torch

from viasd.engine.routing import RoutingPlan, num_layers
from viasd.engine.stream import Stream
from viasd.errors import ConfigError
from viasd.paths import cache_dir

ABLATIONS = ("random", "first_k", "every_other", "independent", "full")


def budget(n_layers: int, keep_ratio: float) -> int:
    """Number of kept layers for a keep ratio (at least 2: first and last)."""
    return max(2, min(n_layers, round(keep_ratio * n_layers)))


def random_mask(n_layers: int, keep_ratio: float, seed: int) -> list[int]:
    """Seeded random mask of the given budget that keeps the first and last layer."""
    k = budget(n_layers, keep_ratio)
    middle = random.Random(seed).sample(range(1, n_layers - 1), k - 2) if n_layers > 2 else []
    return sorted({0, n_layers - 1, *middle})[:k] if k < n_layers else list(range(n_layers))


def first_k_mask(n_layers: int, keep_ratio: float) -> list[int]:
    """Early exit: the first ``k`` layers."""
    return list(range(budget(n_layers, keep_ratio)))


def every_other_mask(n_layers: int, keep_ratio: float = 0.5) -> list[int]:
    """Evenly spaced layers (first and last included) at the budget — every other layer at 0.5."""
    k = budget(n_layers, keep_ratio)
    return sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)})


def mask_path(pair_name: str, keep_ratio: float, objective: str = "kl") -> Path:
    """Where the DIMR search stores the mask for a pair / budget / objective."""
    return cache_dir() / "masks" / pair_name / f"keep{keep_ratio:.2f}-{objective}.json"


def load_mask_artifact(path: str | Path, n_layers: int | None = None) -> dict[str, Any]:
    """Read a mask artifact; a missing/corrupt file or a layer-count mismatch is a ConfigError."""
    path = Path(path)
    try:
        art = json.loads(path.read_text())
        layers = art["layers"]
    except FileNotFoundError as e:
        raise ConfigError(f"mask file not found: {path}") from e
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"mask file {path} is not a valid mask artifact ({e}); re-run experiments.search") from e
    if n_layers is not None and art.get("n_layers", n_layers) != n_layers:
        raise ConfigError(f"mask {path} was searched for a model with {art.get('n_layers')} layers, "
                          f"but this model has {n_layers}; re-run experiments.search for this pair")
    return {**art, "layers": layers}


def resolve_plan(pair, slim_cfg) -> tuple[Any, RoutingPlan | None, str]:
    """``(model, plan, description)`` for a slim config; ``plan`` is None for an independent model."""
    target = pair.target
    n = num_layers(target)
    mask = slim_cfg.mask
    ratio = float(slim_cfg.keep_ratio)
    if isinstance(mask, (list, tuple)):
        return target, RoutingPlan.build(mask, n, "slim.mask"), f"explicit {list(mask)}"
    mask = str(mask)
    if mask == "independent":
        if pair.intermediate is None:
            raise ConfigError(f"slim.mask=independent needs an intermediate model; pair {pair.name!r} has none "
                              "(set pair.intermediate.id)")
        return pair.intermediate, None, "independent intermediate model"
    if mask == "full":
        return target, RoutingPlan.build(range(n), n), "full"
    if mask == "random":
        return target, RoutingPlan.build(random_mask(n, ratio, int(slim_cfg.seed)), n), f"random seed {slim_cfg.seed}"
    if mask == "first_k":
        return target, RoutingPlan.build(first_k_mask(n, ratio), n), "first_k"
    if mask == "every_other":
        return target, RoutingPlan.build(every_other_mask(n, ratio), n), "every_other"
    if mask == "auto":
        path = mask_path(pair.name, ratio, slim_cfg.objective)
        if path.is_file():
            art = load_mask_artifact(path, n)
            return target, RoutingPlan.build(art["layers"], n, f"mask {path}"), f"dimr {path.name}"
        pre = pair.extras.get("slim_layers", {}).get(f"{ratio:.2f}") if pair.extras.get("slim_layers") else None
        if pre is not None:
            return target, RoutingPlan.build(pre, n, "pair default slim mask"), "pair default"
        warnings.warn(
            f"no DIMR mask for pair {pair.name!r} at keep_ratio={ratio:.2f} ({path} missing); using every_other. "
            f"Run `python -m experiments.search pair={pair.name} search.keep_ratio={ratio}` to search one",
            stacklevel=3,
        )
        return target, RoutingPlan.build(every_other_mask(n, ratio), n), "every_other (fallback)"
    if mask.endswith(".json") or Path(mask).is_file():
        art = load_mask_artifact(mask, n)
        return target, RoutingPlan.build(art["layers"], n, f"mask {mask}"), f"file {mask}"
    raise ConfigError(f"unknown slim.mask {mask!r}: use auto, a mask .json path, a list of layers, "
                      f"or one of {', '.join(ABLATIONS)}")


_WARNED: set[str] = set()


def slim_stream(pair, prompt_ids: torch.Tensor, slim_cfg) -> Stream:
    """A :class:`Stream` for the slim verifier of ``pair`` (routed target or independent model)."""
    key = (pair.name, str(slim_cfg.mask), float(slim_cfg.keep_ratio), slim_cfg.objective)
    cache = pair.extras.setdefault("_slim_plans", {})
    if key not in cache:
        cache[key] = resolve_plan(pair, slim_cfg)
    model, plan, _ = cache[key]
    return Stream(model, prompt_ids, "slim", plan)
