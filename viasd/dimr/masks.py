"""Slim-verifier masks: resolve ``slim.mask`` to a routed stream, and store mask artifacts.

A mask artifact is a JSON file (pair, model revisions, number of layers, kept layers,
objective and its value, every trial, search seconds) written by the DIMR search under
``<cache>/masks/<pair>/keep<ratio>-<objective>.json``. ``slim.mask`` accepts ``auto`` (that
file), a path, an explicit list of layers, or an ablation name (``random``, ``first_k``,
``every_other``, ``independent``, ``full``).

``auto`` never falls back silently: it reads the searched artifact, else the pair's shipped
layer list (``pair.options.slim_layers``), else the ablation the pair config names as its
fallback (``pair.options.slim_fallback``; the tiny random pairs name ``every_other``, since a
search over random weights means nothing), else it stops with one line naming the search
command. :func:`mask_source` makes that decision from the configs alone (dry runs and the
grid's prerequisite check use it before anything is loaded).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from viasd.engine.routing import RoutingPlan, num_layers
from viasd.engine.stream import Stream
from viasd.errors import ConfigError
from viasd.paths import cache_dir

ABLATIONS = ("random", "first_k", "every_other", "independent", "full")
#: Ablations a pair config may name as what ``auto`` uses when no mask was searched or shipped.
FALLBACKS = ("every_other", "first_k", "random")


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


def ablation_layers(name: str, n_layers: int, keep_ratio: float, seed: int = 0) -> list[int]:
    """Kept layers of the ablation ``name`` (one of :data:`FALLBACKS`) at a budget."""
    if name == "random":
        return random_mask(n_layers, keep_ratio, seed)
    return first_k_mask(n_layers, keep_ratio) if name == "first_k" else every_other_mask(n_layers, keep_ratio)


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


@dataclass(frozen=True)
class MaskSource:
    """Where a slim config's mask comes from, decided without loading a model.

    ``kind``: ``artifact`` (a searched DIMR mask file), ``shipped`` (the pair config's layer
    list), ``fallback`` (the ablation ``pair.options.slim_fallback`` names), ``ablation``
    (asked for by name), ``explicit`` (a layer list), ``file`` (a mask path), or ``search``
    (none yet: ``detail`` is the command that searches it).
    """

    kind: str
    detail: str

    def describe(self) -> str:
        labels = {"artifact": "searched DIMR artifact", "shipped": "shipped layer list", "fallback": "pair fallback",
                  "ablation": "explicit ablation", "explicit": "explicit layers", "file": "mask file",
                  "search": "search to run"}
        return f"{labels[self.kind]}: {self.detail}"


def search_command(pair_name: str, keep_ratio: float, objective: str = "kl", scale: str | None = None) -> str:
    """The command that searches (and caches) the DIMR mask ``mask: auto`` looks for.

    At ``scale=paper`` it is that pair's ``table1`` cell (paper calibration sizes), else
    ``experiments.search`` at the search defaults.
    """
    obj = "" if objective == "kl" else f" search.objective={objective}"
    if scale == "paper":
        return f"python -m experiments.run +exp=table1 scale=paper pair={pair_name} search.keep_ratio={keep_ratio:g}{obj}"
    return f"python -m experiments.search pair={pair_name} search.keep_ratio={keep_ratio:g}{obj}"


def mask_source(pair_name: str, options: Mapping[str, Any] | None, slim_cfg, scale: str | None = None,
                search_pair: str | None = None) -> MaskSource:
    """Where ``slim_cfg.mask`` comes from for pair ``pair_name`` (``options``: ``pair.options``).

    ``search_pair``: how the search command names the pair (default ``pair_name``; e.g.
    ``hf pair.target.id=…`` for a ``pair=hf`` checkpoint).
    """
    mask, ratio, options = slim_cfg.mask, float(slim_cfg.keep_ratio), options or {}
    if isinstance(mask, (list, tuple)):
        return MaskSource("explicit", str(list(mask)))
    mask = str(mask)
    if mask in ABLATIONS:
        return MaskSource("ablation", mask + (f" (seed {slim_cfg.seed})" if mask == "random" else ""))
    if mask != "auto":
        if not (mask.endswith(".json") or Path(mask).is_file()):
            raise unknown_mask_error(mask)
        if not Path(mask).expanduser().is_file():
            raise ConfigError(f"mask file not found: {mask}")
        return MaskSource("file", mask)
    path = mask_path(pair_name, ratio, slim_cfg.objective)
    if path.is_file():
        return MaskSource("artifact", str(path))
    if (options.get("slim_layers") or {}).get(f"{ratio:.2f}") is not None:
        return MaskSource("shipped", f"pair.options.slim_layers['{ratio:.2f}']")
    fallback = options.get("slim_fallback")
    if fallback is not None:
        if fallback not in FALLBACKS:
            raise ConfigError(f"pair.options.slim_fallback must be one of {', '.join(FALLBACKS)} (got {fallback!r})")
        return MaskSource("fallback", f"{fallback} (pair.options.slim_fallback)")
    return MaskSource("search", search_command(search_pair or pair_name, ratio, slim_cfg.objective, scale))


def no_mask_error(pair_name: str, slim_cfg, source: MaskSource) -> ConfigError:
    """The one-line error of a ``mask: auto`` that has no mask to read (``source.kind == "search"``)."""
    return ConfigError(
        f"no DIMR mask for pair {pair_name!r} at keep_ratio={float(slim_cfg.keep_ratio):.2f} "
        f"({mask_path(pair_name, float(slim_cfg.keep_ratio), slim_cfg.objective)} missing): search it first with "
        f"`{source.detail}`, or ask for an ablation explicitly (method.slim.mask=every_other)"
    )


def resolve_plan(pair, slim_cfg) -> tuple[Any, RoutingPlan | None, str]:
    """``(model, plan, description)`` for a slim config; ``plan`` is None for an independent model.

    ``mask: auto`` follows :func:`mask_source`; with no mask to read it raises the ConfigError
    naming the search command (never a silent ablation).
    """
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
    if mask in FALLBACKS:
        return target, RoutingPlan.build(ablation_layers(mask, n, ratio, int(slim_cfg.seed)), n), \
            (f"random seed {slim_cfg.seed}" if mask == "random" else mask)
    if mask == "auto":
        source = mask_source(pair.name, pair.extras, slim_cfg)
        if source.kind == "artifact":
            path = Path(source.detail)
            art = load_mask_artifact(path, n)
            return target, RoutingPlan.build(art["layers"], n, f"mask {path}"), f"dimr {path.name}"
        if source.kind == "shipped":
            pre = pair.extras["slim_layers"][f"{ratio:.2f}"]
            return target, RoutingPlan.build(pre, n, "pair default slim mask"), "pair default"
        if source.kind == "fallback":
            name = pair.extras["slim_fallback"]
            layers = ablation_layers(name, n, ratio, int(slim_cfg.seed))
            return target, RoutingPlan.build(layers, n), f"{name} (pair fallback)"
        raise no_mask_error(pair.name, slim_cfg, source)
    if mask.endswith(".json") or Path(mask).is_file():
        art = load_mask_artifact(mask, n)
        return target, RoutingPlan.build(art["layers"], n, f"mask {mask}"), f"file {mask}"
    raise unknown_mask_error(mask)


def unknown_mask_error(mask: str) -> ConfigError:
    return ConfigError(f"unknown slim.mask {mask!r}: use auto, a mask .json path, a list of layers, "
                       f"or one of {', '.join(ABLATIONS)}")


def slim_stream(pair, prompt_ids: torch.Tensor, slim_cfg) -> Stream:
    """A :class:`Stream` for the slim verifier of ``pair`` (routed target or independent model)."""
    key = (pair.name, str(slim_cfg.mask), float(slim_cfg.keep_ratio), slim_cfg.objective)
    cache = pair.extras.setdefault("_slim_plans", {})
    if key not in cache:
        cache[key] = resolve_plan(pair, slim_cfg)
    model, plan, _ = cache[key]
    return Stream(model, prompt_ids, "slim", plan)
