"""Checks of a cost file before it prices anything (``docs/cost_file.md``): one ConfigError line per
malformed file, naming what is wrong and the command that measures a good one.

:func:`check_grid` checks the grid form that :class:`~viasd.analysis.cost.CostModel` reads (a file of
``python -m experiments.bench --cost-curve``, or a ``viasd.cost/v1`` entry converted to it);
:func:`check_shape_doc` checks the parts of a ``viasd.cost/v1`` file (``python -m experiments.gpu_smoke
--paper-shapes``) that one pair's conversion reads. A cost is a finite, positive number of seconds (a
measured forward takes time); ``head_row`` (the cost of an extra logits row) may be 0; the routed
intercept ``routed_base`` is a fitted line's value at zero layers, so it only has to be finite, while
the routed forward through all of a model's layers (``routed_base + n_layers · routed_layer``, the
measured full pass) must be positive like any cost.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from viasd.errors import ConfigError

GRID_FIX = "re-measure it with `python -m experiments.bench --cost-curve pair=<pair> curve.remeasure=true`"
SHAPE_FIX = "re-measure it with `python -m experiments.gpu_smoke --paper-shapes`"


def _fail(where: str, what: str, fix: str) -> ConfigError:
    return ConfigError(f"cost file {where}: {what}; {fix}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _axis(v: Any, name: str, low: int, where: str, fix: str, empty: bool = False) -> list[int]:
    """A grid axis: whole numbers ``>= low``, strictly ascending (non-empty unless ``empty``)."""
    if not isinstance(v, list) or not all(_is_int(x) for x in v) or (not v and not empty):
        raise _fail(where, f"{name} must be a list of whole numbers (got {v!r:.60})", fix)
    if any(x < low for x in v) or any(b <= a for a, b in zip(v, v[1:])):
        raise _fail(where, f"{name} must be strictly ascending whole numbers >= {low} (got {v})", fix)
    return v


def _number(v: Any, name: str, where: str, fix: str, positive: bool = True) -> float:
    """A cost value: a finite number, ``> 0`` when ``positive`` (else any finite)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise _fail(where, f"{name} is not a number (got {v!r:.40})", fix)
    if not math.isfinite(v):
        raise _fail(where, f"{name} is not finite (got {v})", fix)
    if positive and v <= 0:
        raise _fail(where, f"{name} is not positive (got {v}): a forward takes time", fix)
    return float(v)


def _curve(spec: Any, name: str, grid: dict[str, list[int]], where: str, positive: bool) -> list[list[float]]:
    """The decode grid ``[len(ns)][len(contexts)]`` and prefill line of one curve, checked; returns the grid."""
    ns, ctxs, pre = grid["ns"], grid["contexts"], grid["prefill_ns"]
    if not isinstance(spec, dict):
        raise _fail(where, f"{name} must be an object with decode and prefill (got {spec!r:.40})", GRID_FIX)
    decode = spec.get("decode")
    if (not isinstance(decode, list) or len(decode) != len(ns)
            or not all(isinstance(r, list) and len(r) == len(ctxs) for r in decode)):
        raise _fail(where, f"{name}.decode must be a {len(ns)} × {len(ctxs)} grid (decode sizes ns × contexts)",
                    GRID_FIX)
    for i, row in enumerate(decode):
        for j, v in enumerate(row):
            _number(v, f"{name}.decode[n={ns[i]}][context={ctxs[j]}]", where, GRID_FIX, positive)
    prefill = spec.get("prefill") or []
    if not isinstance(prefill, list) or (prefill and len(prefill) != len(pre)):
        raise _fail(where, f"{name}.prefill must be empty or one cost per prefill_ns {pre}", GRID_FIX)
    for n, v in zip(pre, prefill):
        _number(v, f"{name}.prefill[n={n}]", where, GRID_FIX, positive)
    return decode


def check_grid(data: Any, where: str) -> None:
    """Raise one ConfigError line unless ``data`` is a well-formed grid-form cost document (module docstring):
    ``grid`` axes, a ``target`` among ``models``, each model's curves of the grid's shape, every cost finite and
    positive."""
    if not isinstance(data, dict):
        raise _fail(where, f"not a JSON object of grid, meta and models (it holds a {type(data).__name__})",
                    GRID_FIX)
    g = data.get("grid")
    if not isinstance(g, dict):
        raise _fail(where, "no grid object (ns, contexts, prefill_ns)", GRID_FIX)
    grid = {"ns": _axis(g.get("ns"), "grid.ns", 1, where, GRID_FIX),
            "contexts": _axis(g.get("contexts"), "grid.contexts", 0, where, GRID_FIX),
            "prefill_ns": _axis(g.get("prefill_ns", []), "grid.prefill_ns", 1, where, GRID_FIX, empty=True)}
    if not isinstance(data.get("meta", {}), dict):
        raise _fail(where, "meta must be an object", GRID_FIX)
    models = data.get("models")
    if not isinstance(models, dict):
        raise _fail(where, f"models must be an object of model name -> costs (got {type(models).__name__})", GRID_FIX)
    if "target" not in models:
        raise _fail(where, f"no target model (it has {sorted(models)})", GRID_FIX)
    for name, m in models.items():
        if not isinstance(m, dict):
            raise _fail(where, f"model {name!r} must be an object (got {type(m).__name__})", GRID_FIX)
        n_layers = m.get("n_layers")
        if n_layers is not None and (not _is_int(n_layers) or n_layers < 1):
            raise _fail(where, f"{name}.n_layers must be a whole number >= 1 or null (got {n_layers!r})", GRID_FIX)
        if m.get("native") is None:
            raise _fail(where, f"model {name!r} has no native curve", GRID_FIX)
        _curve(m["native"], f"{name}.native", grid, where, positive=True)
        _number(m.get("head_row", 0.0), f"{name}.head_row", where, GRID_FIX, positive=False)
        if m.get("head_row", 0.0) < 0:
            raise _fail(where, f"{name}.head_row is negative (got {m['head_row']}): an extra logits row costs >= 0",
                        GRID_FIX)
        routed = [m.get(k) for k in ("routed_base", "routed_layer")]
        if any(r is not None for r in routed):
            if any(r is None for r in routed):
                raise _fail(where, f"model {name!r} needs both routed_base and routed_layer, or neither", GRID_FIX)
            base = _curve(routed[0], f"{name}.routed_base", grid, where, positive=False)
            per = _curve(routed[1], f"{name}.routed_layer", grid, where, positive=False)
            if n_layers is not None:
                for i, (rb, rl) in enumerate(zip(base, per)):
                    for j, (b, p) in enumerate(zip(rb, rl)):
                        _number(b + n_layers * p, f"{name} routed through all {n_layers} layers "
                                f"[n={grid['ns'][i]}][context={grid['contexts'][j]}]", where, GRID_FIX)


def _ms_table(t: Any, name: str, ctxs: list[int], ks: list[int], where: str) -> None:
    """``t[ctx][k]`` milliseconds of a ``viasd.cost/v1`` model: every context and token count, finite, positive."""
    if not isinstance(t, dict):
        raise _fail(where, f"{name} must be an object of context -> token count -> ms", SHAPE_FIX)
    for c in ctxs:
        row = t.get(str(c))
        if not isinstance(row, dict) or any(str(k) not in row for k in ks):
            raise _fail(where, f"{name}[{c}] must hold every token count of ks {ks}", SHAPE_FIX)
        for k in ks:
            _number(row[str(k)], f"{name}[{c}][{k}]", where, SHAPE_FIX)


def check_shape_doc(doc: dict[str, Any], pair: str, where: str) -> None:
    """Raise one ConfigError line unless the parts of a ``viasd.cost/v1`` document that ``pair``'s conversion
    reads are well formed (``ks``, ``contexts``, ``models``, ``pairs``, each of the pair's models' ``layers``,
    ``t_ms`` and the ``slim_t_ms`` of its ``slim_layers``: finite, positive milliseconds)."""
    ks = _axis(doc.get("ks"), "ks", 1, where, SHAPE_FIX)
    ctxs = _axis(doc.get("contexts"), "contexts", 0, where, SHAPE_FIX)
    for key in ("models", "pairs"):
        if not isinstance(doc.get(key), dict):
            raise _fail(where, f"{key} must be an object (got {type(doc.get(key)).__name__})", SHAPE_FIX)
    roles = doc["pairs"].get(pair)
    if roles is None:
        return  # the caller names the pairs the file has
    if not isinstance(roles, dict):
        raise _fail(where, f"pairs[{pair!r}] must be an object of role -> model", SHAPE_FIX)
    for role in ("draft", "target", "intermediate"):
        model = roles.get(role)
        row = doc["models"].get(model) if isinstance(model, str) else None
        if row is None:
            continue
        if not isinstance(row, dict) or not _is_int(row.get("layers")) or row["layers"] < 1:
            raise _fail(where, f"model {model!r} needs a whole number of layers >= 1", SHAPE_FIX)
        _ms_table(row.get("t_ms"), f"{model}.t_ms", ctxs, ks, where)
        slim = row.get("slim_layers") or {}
        if not isinstance(slim, dict) or not all(_is_int(n) and n >= 1 for n in slim.values()):
            raise _fail(where, f"{model}.slim_layers must map keep ratios to whole layer counts", SHAPE_FIX)
        for keep, n in slim.items():
            if n < row["layers"]:
                _ms_table((row.get("slim_t_ms") or {}).get(keep), f"{model}.slim_t_ms[{keep}]", ctxs, ks, where)
