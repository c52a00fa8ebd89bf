"""Slim-verifier masks: resolve ``slim.mask`` to routed streams, budgets, ablations, mask artifacts.

A mask is a list of kept layers or ``{attn: [...], mlp: [...]}`` (kept sub-layers). A mask
artifact is a JSON file (pair, model revisions, number of layers, the mask under ``layers``,
objective and its value, every trial, search seconds) written by the DIMR search under
``<cache>/masks/<pair>/keep<ratio>-<objective>[-sublayers].json``; one published for a fresh clone
(the exact bytes: its sha256 is part of the run ids of the runs that read it) lies at the same
name under the results store, ``results/runs/_masks/<pair>/`` (``python -m experiments.store
publish <search or run id>``, :mod:`viasd.dimr.publish`). ``slim.mask`` accepts ``auto`` (that
file), a path, an explicit mask, or an ablation name (``random``, ``first_k``, ``every_other``,
``independent``, ``full``) in the search space ``slim.space`` (``layers`` or ``sublayers``).

``auto`` never falls back silently: it reads the searched artifact (:func:`find_mask`: the cached
one, else the published one; both, with other bytes, is a ConfigError), else the pair's shipped
layer list (``pair.options.slim_layers``; whole layers, searched for KL: another objective never reads
it), else the ablation the pair config
names as its fallback (``pair.options.slim_fallback``; the tiny random pairs name
``every_other``, since a search over random weights means nothing), else it stops with one line
naming the search command. :func:`mask_source` makes that decision from the configs alone (dry
runs and the grid's prerequisite check use it before anything is loaded).

**Budgets count parameters read per token.** A keep ratio ``r`` allows the parameters of
``budget(n, r)`` whole decoder layers, the first and last among them (the embedding and LM head,
read by every pass, are left out), so a whole-layer and a sub-layer mask of the same ratio read the same number of
weights (a whole-layer mask of ``k`` equal layers hits it exactly). Every candidate keeps
the first and the last layer whole; sub-layer masks fill the rest of the budget greedily in
their own order (score, random permutation, or execution order for ``first_k``). The
sub-layer ``every_other`` keeps every attention sub-layer and evenly spaced MLPs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from viasd.engine.paths import unit_params
from viasd.engine.routing import ATTN, MLP, RoutingPlan, Unit, all_units, num_layers
from viasd.engine.stream import SharedPrefix, Stream
from viasd.errors import ConfigError
from viasd.paths import cache_dir, results_dir

ABLATIONS = ("random", "first_k", "every_other", "independent", "full")
#: Ablations a pair config may name as what ``auto`` uses when no mask was searched or shipped.
FALLBACKS = ("every_other", "first_k", "random")
SPACES = ("layers", "sublayers")
#: Reserved folder of the results store holding the published DIMR masks (``<pair>/<mask name>``).
MASKS_DIR = "_masks"


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


class Budget:
    """Parameters read per token by each sub-layer of a model, and the limit of a keep ratio.

    ``costs``: ``{(layer, kind): parameters}``; ``limit``: parameters of ``budget(n, r)`` layers —
    the first and the last, and ``budget − 2`` middle layers of the mean middle layer's size (T5's
    block 0 also holds the position bias); ``fixed``: units every candidate keeps (first and last
    layer — the first ``keep_first`` layers with ``keep_first > 1``); ``free``: the others, in execution order.
    """

    def __init__(self, costs: Mapping[Unit, int], n_layers: int, keep_ratio: float, keep_first: int = 1):
        self.costs, self.n = dict(costs), n_layers
        self.total = sum(self.costs.values())
        ends = {0, n_layers - 1}
        middle = [u for u in all_units(n_layers) if u[0] not in ends]
        mean = sum(self.costs[u] for u in middle) / max(1, n_layers - 2)
        self.limit = sum(self.costs[u] for u in all_units(n_layers) if u[0] in ends) + \
            (budget(n_layers, keep_ratio) - 2) * mean if n_layers > 2 else self.total
        fixed = set(range(max(1, keep_first))) | {n_layers - 1}
        self.fixed = [u for u in all_units(n_layers) if u[0] in fixed]
        self.free = [u for u in all_units(n_layers) if u[0] not in fixed]

    @classmethod
    def of(cls, model, keep_ratio: float, keep_first: int = 1) -> Budget:
        return cls(unit_params(model), num_layers(model), keep_ratio, keep_first)

    def cost(self, plan: RoutingPlan) -> int:
        """Parameters a pass of ``plan`` reads per token (its decoder sub-layers)."""
        return sum(self.costs[u] for u in plan.units())

    def fraction(self, plan: RoutingPlan) -> float:
        """``cost(plan)`` over the parameters of every decoder sub-layer."""
        return self.cost(plan) / self.total

    def fill(self, order: Sequence[Unit], contiguous: bool = False) -> RoutingPlan:
        """The fixed units plus units of ``order`` taken while they fit the limit (``contiguous``:
        stop at the first that does not fit, an early exit)."""
        kept, used = list(self.fixed), sum(self.costs[u] for u in self.fixed)
        for u in order:
            if u in kept:
                continue
            if used + self.costs[u] <= self.limit * (1 + 1e-9):
                kept.append(u)
                used += self.costs[u]
            elif contiguous:
                break
        return plan_of_units(kept)


def plan_of_units(units) -> RoutingPlan:
    """The plan keeping exactly ``units`` (unchecked)."""
    return RoutingPlan(tuple(sorted(i for i, k in units if k == ATTN)), tuple(sorted(i for i, k in units if k == MLP)))


def sublayer_random(b: Budget, seed: int) -> RoutingPlan:
    """Seeded random sub-layer mask: a random order of the free sub-layers, filled to the budget."""
    order = list(b.free)
    random.Random(seed).shuffle(order)
    return b.fill(order)


def sublayer_first_k(b: Budget) -> RoutingPlan:
    """Early exit at a sub-layer: the longest prefix of the execution order within the budget
    (the last layer is not kept, as in the whole-layer ``first_k``)."""
    kept, used = [], 0
    for u in all_units(b.n):
        if used + b.costs[u] > b.limit * (1 + 1e-9):
            break
        kept.append(u)
        used += b.costs[u]
    return plan_of_units(kept)


def sublayer_every_other(b: Budget) -> RoutingPlan:
    """Every attention sub-layer, then evenly spaced MLPs (first and last) while they fit."""
    attn = [u for u in b.free if u[1] == ATTN]
    mlps = [u for u in b.free if u[1] == MLP]
    fit = b.fill(attn)
    room = int((b.limit - b.cost(fit)) // max(1, min(b.costs[u] for u in mlps))) if mlps else 0
    k = min(len(mlps), room)
    picked = [mlps[round(j * (len(mlps) - 1) / (k - 1))] if k > 1 else mlps[len(mlps) // 2] for j in range(k)]
    return b.fill(attn + picked)


def mask_name(keep_ratio: float, objective: str = "kl", space: str = "layers") -> str:
    """File name of the mask of a budget / objective / search space (``keep0.80-kl.json``)."""
    suffix = "" if space == "layers" else f"-{space}"
    return f"keep{float(keep_ratio):.2f}-{objective}{suffix}.json"


def mask_path(pair_name: str, keep_ratio: float, objective: str = "kl", space: str = "layers") -> Path:
    """Where the DIMR search stores the mask for a pair / budget / objective / search space (the cache)."""
    return cache_dir() / "masks" / pair_name / mask_name(keep_ratio, objective, space)


def published_mask_path(pair_name: str, keep_ratio: float, objective: str = "kl", space: str = "layers",
                        root: Path | None = None) -> Path:
    """Where the results store (``root``, default ``results/runs/``) holds the published mask of the same key."""
    return Path(root or results_dir()) / MASKS_DIR / pair_name / mask_name(keep_ratio, objective, space)


def find_mask(pair_name: str, keep_ratio: float, objective: str = "kl",
              space: str = "layers") -> tuple[str, Path] | None:
    """``("published", path)`` or ``("artifact", path)``: the searched mask ``mask: auto`` reads (None: none).

    The published mask (the results store's) unless only the cache has one; a cached mask byte-equal
    to the published one reads as published (a fresh clone reads the same bytes). Both present with
    other bytes is a ConfigError: the run ids would follow this machine's cache, not the repository.
    """
    cached = mask_path(pair_name, keep_ratio, objective, space)
    published = published_mask_path(pair_name, keep_ratio, objective, space)
    if published.is_file():
        if cached.is_file() and cached.read_bytes() != published.read_bytes():
            raise ConfigError(f"the DIMR mask cached at {cached} is not the one published at {published} (pair "
                              f"{pair_name}, keep {float(keep_ratio):.2f}, {objective}, {space}): remove the cached "
                              f"file to read the published mask, or remove the published one and publish yours "
                              f"(`python -m experiments.store publish <its search run id>`)")
        return "published", published
    return ("artifact", cached) if cached.is_file() else None


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


def _space(slim_cfg) -> str:
    space = str(getattr(slim_cfg, "space", "layers"))
    if space not in SPACES:
        raise ConfigError(f"slim.space must be one of {SPACES} (got {space!r})")
    return space


def ablation_plan(target, name: str, keep_ratio: float, seed: int = 0, space: str = "layers") -> RoutingPlan:
    """The ``random`` / ``first_k`` / ``every_other`` mask of ``target`` at ``keep_ratio`` in ``space``."""
    n = num_layers(target)
    if space == "sublayers":
        b = Budget.of(target, keep_ratio)
        plan = {"random": lambda: sublayer_random(b, seed), "first_k": lambda: sublayer_first_k(b),
                "every_other": lambda: sublayer_every_other(b)}[name]()
        return RoutingPlan.build(plan, n, f"sub-layer {name} mask")
    layers = {"random": lambda: random_mask(n, keep_ratio, seed), "first_k": lambda: first_k_mask(n, keep_ratio),
              "every_other": lambda: every_other_mask(n, keep_ratio)}[name]()
    return RoutingPlan.build(layers, n)


@dataclass(frozen=True)
class MaskSource:
    """Where a slim config's mask comes from, decided without loading a model.

    ``kind``: ``published`` (a searched DIMR mask the results store holds), ``artifact`` (one only
    this machine's cache holds), ``shipped`` (the pair config's layer
    list), ``fallback`` (the ablation ``pair.options.slim_fallback`` names), ``ablation``
    (asked for by name), ``explicit`` (a layer list), ``file`` (a mask path), or ``search``
    (none yet: ``detail`` is the command that searches it).
    """

    kind: str
    detail: str

    def describe(self) -> str:
        labels = {"published": "published DIMR mask", "artifact": "searched DIMR artifact", "shipped": "shipped layer list", "fallback": "pair fallback",
                  "ablation": "explicit ablation", "explicit": "explicit layers", "file": "mask file",
                  "search": "search to run"}
        return f"{labels[self.kind]}: {self.detail}"


def search_command(pair_name: str, keep_ratio: float, objective: str = "kl", scale: str | None = None,
                   space: str = "layers") -> str:
    """The command that searches (and caches) the DIMR mask ``mask: auto`` looks for.

    At ``scale=paper`` it is that pair's ``table1`` cell (paper calibration sizes), else
    ``experiments.search`` at the search defaults.
    """
    obj = ("" if objective == "kl" else f" search.objective={objective}") + \
        ("" if space == "layers" else f" search.space={space}")
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
    space = _space(slim_cfg)
    if isinstance(mask, (list, tuple)):
        return MaskSource("explicit", str(list(mask)))
    if isinstance(mask, Mapping):
        return MaskSource("explicit", json.dumps({k: list(v) for k, v in mask.items()}, sort_keys=True))
    mask = str(mask)
    if mask in ABLATIONS:
        where = " (sub-layers)" if space == "sublayers" and mask in FALLBACKS else ""
        return MaskSource("ablation", mask + (f" (seed {slim_cfg.seed})" if mask == "random" else "") + where)
    if mask != "auto":
        if not (mask.endswith(".json") or Path(mask).is_file()):
            raise unknown_mask_error(mask)
        if not Path(mask).expanduser().is_file():
            raise ConfigError(f"mask file not found: {mask}")
        return MaskSource("file", mask)
    found = find_mask(pair_name, ratio, slim_cfg.objective, space)
    if found is not None:
        return MaskSource(found[0], str(found[1]))
    shipped = (options.get("slim_layers") or {}).get(f"{ratio:.2f}")
    if space == "layers" and slim_cfg.objective == "kl" and shipped is not None:  # shipped masks are KL searches
        return MaskSource("shipped", f"pair.options.slim_layers['{ratio:.2f}']")
    fallback = options.get("slim_fallback")
    if fallback is not None:
        if fallback not in FALLBACKS:
            raise ConfigError(f"pair.options.slim_fallback must be one of {', '.join(FALLBACKS)} (got {fallback!r})")
        return MaskSource("fallback", f"{fallback} (pair.options.slim_fallback)")
    return MaskSource("search", search_command(search_pair or pair_name, ratio, slim_cfg.objective, scale, space))


def no_mask_error(pair_name: str, slim_cfg, source: MaskSource) -> ConfigError:
    """The one-line error of a ``mask: auto`` that has no mask to read (``source.kind == "search"``)."""
    key = (pair_name, float(slim_cfg.keep_ratio), slim_cfg.objective, _space(slim_cfg))
    return ConfigError(
        f"no DIMR mask for pair {pair_name!r} at keep_ratio={key[1]:.2f} ({mask_path(*key)} missing, none "
        f"published at {published_mask_path(*key)}): search it first with "
        f"`{source.detail}`, or ask for an ablation explicitly (method.slim.mask=every_other)"
    )


def resolve_plan(pair, slim_cfg) -> tuple[Any, RoutingPlan | None, str]:
    """``(model, plan, description)`` for a slim config; ``plan`` is None for an independent model.

    ``mask: auto`` follows :func:`mask_source`; with no mask to read it raises the ConfigError
    naming the search command (never a silent ablation).
    """
    target = pair.target
    n = num_layers(target)
    mask, space = slim_cfg.mask, _space(slim_cfg)
    ratio = float(slim_cfg.keep_ratio)
    if isinstance(mask, (list, tuple, Mapping)):
        plan = RoutingPlan.build(mask, n, "slim.mask")
        return target, plan, f"explicit {plan.spec()}"
    mask = str(mask)
    if mask == "independent":
        if pair.intermediate is None:
            raise ConfigError(f"slim.mask=independent needs an intermediate model; pair {pair.name!r} has none "
                              "(set pair.intermediate.id)")
        return pair.intermediate, None, "independent intermediate model"
    if mask == "full":
        return target, RoutingPlan.full(n), "full"
    if mask in FALLBACKS:
        plan = ablation_plan(target, mask, ratio, int(slim_cfg.seed), space)
        where = "" if space == "layers" else " (sub-layers)"
        return target, plan, (f"random seed {slim_cfg.seed}" if mask == "random" else mask) + where
    if mask == "auto":
        source = mask_source(pair.name, pair.extras, slim_cfg)
        if source.kind in ("published", "artifact"):
            path = Path(source.detail)
            art = load_mask_artifact(path, n)
            return target, RoutingPlan.build(art["layers"], n, f"mask {path}"), f"dimr {path.name}"
        if source.kind == "shipped":
            pre = pair.extras["slim_layers"][f"{ratio:.2f}"]
            return target, RoutingPlan.build(pre, n, "pair default slim mask"), "pair default"
        if source.kind == "fallback":
            name = pair.extras["slim_fallback"]
            where = "" if space == "layers" else ", sub-layers"
            return target, ablation_plan(target, name, ratio, int(slim_cfg.seed), space), \
                f"{name} (pair fallback{where})"
        raise no_mask_error(pair.name, slim_cfg, source)
    if mask.endswith(".json") or Path(mask).is_file():
        art = load_mask_artifact(mask, n)
        return target, RoutingPlan.build(art["layers"], n, f"mask {mask}"), f"file {mask}"
    raise unknown_mask_error(mask)


def unknown_mask_error(mask: str) -> ConfigError:
    return ConfigError(f"unknown slim.mask {mask!r}: use auto, a mask .json path, a list of layers, "
                       f"{{attn: [...], mlp: [...]}}, or one of {', '.join(ABLATIONS)}")


def _resolved(pair, slim_cfg) -> tuple[Any, RoutingPlan | None, str]:
    key = (pair.name, json.dumps(slim_cfg.mask, sort_keys=True, default=str), float(slim_cfg.keep_ratio),
           slim_cfg.objective, _space(slim_cfg), int(slim_cfg.seed))
    cache = pair.extras.setdefault("_slim_plans", {})
    if key not in cache:
        cache[key] = resolve_plan(pair, slim_cfg)
    return cache[key]


def slim_stream(pair, prompt_ids: torch.Tensor, slim_cfg) -> Stream:
    """A :class:`Stream` for the slim verifier of ``pair`` alone (routed target or independent model)."""
    model, plan, _ = _resolved(pair, slim_cfg)
    return Stream(model, prompt_ids, "slim", plan)


def verifier_streams(pair, prompt_ids: torch.Tensor, slim_cfg) -> tuple[Stream, Stream]:
    """``(full, slim)`` streams of the target and its slim verifier for one prompt ``[1, P]``.

    With ``slim_cfg.share_prefix`` (default) and a routed slim verifier, both streams share a
    :class:`~viasd.engine.stream.SharedPrefix` of the sub-layers before the plan's first
    skipped one; otherwise each keeps its own cache.
    """
    model, plan, _ = _resolved(pair, slim_cfg)
    if plan is None or not getattr(slim_cfg, "share_prefix", True):
        return Stream(pair.target, prompt_ids, "target"), Stream(model, prompt_ids, "slim", plan)
    prefix = SharedPrefix(pair.target, prompt_ids, plan.first_skipped(num_layers(pair.target)))
    return (Stream(pair.target, prompt_ids, "target", prefix=prefix),
            Stream(pair.target, prompt_ids, "slim", plan, prefix=prefix))
