"""Load-free speed: forward calls priced with each model's measured cost.

A cost file (``<store>/_cost/<pair>__<host>-<cpu tag>__<backend>-<dtype>-t<threads>.json``, written by
``python -m experiments.bench --cost-curve``; its ``meta.cpu`` names the CPU it was measured on) holds, per model of a pair (``target``, ``draft``,
``intermediate``), the measured seconds of one forward that feeds ``n`` new tokens after
``context`` cached ones and returns one logits row:

* ``native``: the model's own forward (the target and draft streams);
* ``routed_base`` + ``layers · routed_layer``: a forward through a routing plan that runs
  ``layers`` decoder layers (slim verifiers, the ``self`` drafter — and any forward that runs
  only some layers, e.g. a full pass resuming at the first skipped layer), fitted from routed
  passes over all and over half of the layers;
* ``head_row``: seconds per extra logits row (``last − 1``: verification rows, audit rows).

The paper-shape cost file of ``python -m experiments.gpu_smoke --paper-shapes`` (``viasd.cost/v1``,
``docs/cost_file.md``; measured per model, on a GPU or the CPU) is read by the same loader:
:meth:`CostModel.load` with the pair's name converts it (:func:`from_shape_costs`) to the grid form
above, so one loader prices a trace with costs measured on another machine. Every file is checked before it
prices anything (:mod:`viasd.analysis.cost_check`): a malformed one — NaN, zero or negative costs, grids of the
wrong shape — is one ConfigError line naming the fix.

``t(n, context)`` is interpolated linearly on the measured grid (decode sizes × contexts; ``fit="grid"``,
the default) or read off the least-squares bilinear surface ``a + b·n + c·context + d·n·context``
through the grid (``fit="bilinear"``: :func:`fit_bilinear`; four numbers per curve, so one noisy grid
point does not bend the prices around it — on a grid measured on a busy machine it moved predicted
speedups by up to 15%: ``docs/results.md``), and, for prefills beyond it, along a prefill line measured
at an empty context plus the decode grid's context slope scaled by ``n``. :func:`predict_example` prices a finished example from its
counters (calls, tokens, logits rows per model) when no trace gives each call;
:class:`~viasd.analysis.sim.SimStream` prices each replayed call exactly (``docs/replay.md``).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.interpolate import RegularGridInterpolator, interp1d

from viasd.analysis.cost_check import SHAPE_FIX, check_grid, check_shape_doc
from viasd.errors import ConfigError
from viasd.paths import COST_DIR, PROJECT_ROOT
from viasd.utils.fs import atomic_write_json
from viasd.utils.machine import cpu_tag

COST = COST_DIR  # reserved folder of the run store


def cost_name(pair: str, runtime: dict[str, Any], threads: int, host: str | None = None, cpu: str | None = None
              ) -> str:
    """The cost file name of a pair measured on ``host`` and ``cpu`` (default: this machine's) with a
    runtime; the CPU enters as a tag, so two CPUs behind one host name keep separate files."""
    host = host or platform.node() or "host"
    return (f"{pair}__{host}-{cpu_tag(cpu)}__{runtime.get('backend', 'eager')}-{runtime.get('dtype', 'float32')}"
            f"-t{threads}.json")


#: How a curve reads its decode grid (module doc): interpolate the measured points, or their bilinear fit.
FITS = ("grid", "bilinear")


def fit_bilinear(decode: np.ndarray, ns: Sequence[int], ctxs: Sequence[int]) -> np.ndarray:
    """The least-squares surface ``t = a + b·n + c·ctx + d·n·ctx`` through a decode grid, on that grid.

    ``decode``: ``[len(ns), len(ctxs)]`` seconds; returns the fitted ``[len(ns), len(ctxs)]`` (floored at
    0). With fewer grid points than the four coefficients the grid is returned as it is."""
    decode = np.asarray(decode, dtype=np.float64)
    n, c = np.meshgrid(np.asarray(ns, float), np.asarray(ctxs, float), indexing="ij")
    x = np.stack([np.ones_like(n), n, c, n * c], axis=-1).reshape(-1, 4)
    if np.linalg.matrix_rank(x) < 4:
        return decode
    coef, *_ = np.linalg.lstsq(x, decode.ravel(), rcond=None)
    return np.maximum(0.0, x @ coef).reshape(decode.shape)


class Curve:
    """``t(n, context)`` of one forward kind: a decode grid plus a prefill line (seconds)."""

    def __init__(self, spec: dict[str, Any], ns: list[int], ctxs: list[int], prefill_ns: list[int],
                 fit: str = "grid"):
        decode = np.asarray(spec["decode"], dtype=np.float64)  # [len(ns), len(ctxs)]
        if fit == "bilinear":
            decode = fit_bilinear(decode, ns, ctxs)
        self.grid = RegularGridInterpolator((np.asarray(ns, float), np.asarray(ctxs, float)), decode,
                                            bounds_error=False, fill_value=None)
        self.n_max, self.ctxs = max(ns), ctxs
        slope = (decode[-1, -1] - decode[-1, 0]) / (ctxs[-1] - ctxs[0]) if len(ctxs) > 1 else 0.0
        self.ctx_slope = max(0.0, slope) / self.n_max  # per token fed and per cached token
        pf = np.asarray(spec.get("prefill") or [], dtype=np.float64)
        self.prefill = interp1d(np.asarray(prefill_ns, float), pf, fill_value="extrapolate") if len(pf) > 1 else None

    def __call__(self, n: int, ctx: int) -> float:
        if n <= self.n_max or self.prefill is None:
            return max(0.0, float(self.grid([[n, ctx]])[0]))
        return max(0.0, float(self.prefill(n)) + self.ctx_slope * n * ctx)


@dataclass
class ModelCost:
    """The cost of one model: native / routed curves and the extra-row cost (see the module docstring)."""

    n_layers: int | None
    native: Curve
    routed_base: Curve | None
    routed_layer: Curve | None
    head_row: float

    def seconds(self, n: int, ctx: int, last: int = 1, layers: float | None = None) -> float:
        """Predicted seconds of a forward feeding ``n`` tokens after ``ctx`` cached ones, returning
        ``last`` rows; ``layers``: a routed forward through that many decoder layers."""
        if layers is None or self.routed_base is None:
            t = self.native(n, ctx)
        else:
            t = self.routed_base(n, ctx) + layers * self.routed_layer(n, ctx)
        return t + max(0, last - 1) * self.head_row


SHAPE_SCHEMA = "viasd.cost/v1"  # the paper-shape file of experiments.gpu_smoke (viasd.harness.shape_costs)


def from_shape_costs(doc: dict[str, Any], pair: str, where: str = "(viasd.cost/v1)") -> dict[str, Any]:
    """The grid form (this module's docstring) of ``pair``'s models in a ``viasd.cost/v1`` document.

    ``native.decode[k][ctx]`` is the measured ``t_ms[ctx][k]`` in seconds (``k`` = 1…8 tokens fed,
    the file's contexts); ``routed_base`` + ``layers · routed_layer`` is the line through the full
    forward (all layers) and the smallest slim verifier measured (``slim_layers[keep]`` layers);
    there is no prefill line (larger ``n`` extrapolates along the grid) and no extra-row cost
    (``head_row`` 0). Raises ConfigError naming the pairs the file has when ``pair`` is not one, and one
    line for a malformed file (:func:`~viasd.analysis.cost_check.check_shape_doc`; ``where``: its path).
    """
    check_shape_doc(doc, pair, where)
    roles = doc["pairs"].get(pair)
    if roles is None:
        raise ConfigError(f"the {SHAPE_SCHEMA} cost file has no pair {pair!r} (it has {sorted(doc['pairs'])});"
                          " name one with cost_pair=NAME")
    ks, ctxs = [int(k) for k in doc["ks"]], [int(c) for c in doc["contexts"]]

    def curve(t_ms: dict[str, dict[str, float]]) -> dict[str, Any]:  # t_ms[ctx][k] ms -> decode[k][ctx] s
        return {"decode": [[t_ms[str(c)][str(k)] / 1000 for c in ctxs] for k in ks], "prefill": []}

    models = {}
    for role in ("draft", "target", "intermediate"):
        row = doc["models"].get(roles.get(role) or "")
        if row is None:
            continue
        entry: dict[str, Any] = {"n_layers": row["layers"], "native": curve(row["t_ms"]), "head_row": 0.0}
        slim = {keep: int(n) for keep, n in (row.get("slim_layers") or {}).items() if int(n) < int(row["layers"])}
        if slim:
            keep = min(slim, key=slim.get)
            full, part, n_full, n_part = row["t_ms"], row["slim_t_ms"][keep], int(row["layers"]), slim[keep]
            per = {c: {k: (full[c][k] - part[c][k]) / (n_full - n_part) for k in full[c]} for c in full}
            base = {c: {k: full[c][k] - n_full * per[c][k] for k in full[c]} for c in full}
            entry["routed_base"], entry["routed_layer"] = curve(base), curve(per)
        models[role] = entry
    if "target" not in models:
        raise ConfigError(f"the {SHAPE_SCHEMA} cost file has no measured target of pair {pair!r} "
                          f"(skipped: {(doc.get('skipped') or {}).get(roles.get('target'), 'not measured')}); "
                          + SHAPE_FIX)
    return {"meta": {"cpu": doc.get("device"), "device": doc.get("device"), "dtype": doc.get("dtype"),
                     "source": SHAPE_SCHEMA, "pair": pair, "paper_shapes": (doc.get("shapes") or {}).get("paper")},
            "grid": {"ns": ks, "contexts": ctxs, "prefill_ns": []}, "models": models}


class CostModel:
    """Every model of a pair priced from one cost file (``data``: its JSON, in the grid form; ``sha256``:
    of the file's bytes, ``pair``: the ``viasd.cost/v1`` entry read — both set by :meth:`load`; ``fit``:
    how each curve reads its grid, one of :data:`FITS`)."""

    def __init__(self, data: dict[str, Any], path: Path | None = None, sha256: str | None = None,
                 pair: str | None = None, fit: str = "grid"):
        if fit not in FITS:
            raise ConfigError(f"cost fit {fit!r} is not one of {', '.join(FITS)}")
        check_grid(data, str(path) if path is not None else "(in memory)")  # one line naming the fix
        self.data, self.path, self.meta = data, path, data.get("meta", {})
        self.sha256, self.pair, self.fit = sha256, pair, fit
        g = data["grid"]
        curve = (lambda spec: Curve(spec, g["ns"], g["contexts"], g["prefill_ns"], fit) if spec else None)
        self.models = {name: ModelCost(m.get("n_layers"), curve(m["native"]), curve(m.get("routed_base")),
                                       curve(m.get("routed_layer")), float(m.get("head_row", 0.0)))
                       for name, m in data["models"].items()}
        self._memo: dict[tuple, float] = {}

    @classmethod
    def load(cls, path: str | Path, pair: str | None = None, fit: str = "grid") -> CostModel:
        """The cost model of a grid-form file, or of ``pair`` in a ``viasd.cost/v1`` file
        (:func:`from_shape_costs`), reading its grids by ``fit``; one ConfigError line when the file cannot
        be read."""
        path = Path(path)
        try:
            raw = path.read_bytes()
            data = json.loads(raw)
            if isinstance(data, dict) and data.get("schema") == SHAPE_SCHEMA:
                if not pair:
                    pairs = data.get("pairs") if isinstance(data.get("pairs"), dict) else {}
                    raise ConfigError(f"cost file {path} is a {SHAPE_SCHEMA} file of several pairs; name the pair "
                                      f"(cost_pair=NAME; it has {sorted(pairs)})")
                data = from_shape_costs(data, pair, str(path))
            else:
                check_grid(data, str(path))
                pair = data.get("meta", {}).get("pair")
            return cls(data, path, hashlib.sha256(raw).hexdigest(), pair, fit)
        except ConfigError:
            raise
        except (OSError, KeyError, ValueError, TypeError, AttributeError, IndexError) as e:
            raise ConfigError(f"cost file {path} is unreadable ({e}); re-measure it with "
                              "`python -m experiments.bench --cost-curve pair=<pair> curve.remeasure=true`") from e

    def save(self, path: Path) -> None:
        atomic_write_json(path, self.data)

    def record(self, repo: Path = PROJECT_ROOT) -> dict[str, Any]:
        """What a frontier this model priced records of it (``docs/replay.md`` §9): ``path`` (relative to
        ``repo`` when the file is inside it, else absolute), ``sha256`` of its bytes as loaded, and ``pair``
        (the ``viasd.cost/v1`` entry read; a grid file's own pair), and ``fit`` when it is not ``grid``."""
        path = None if self.path is None else Path(self.path).resolve()
        if path is not None and path.is_relative_to(Path(repo).resolve()):
            path = path.relative_to(Path(repo).resolve())
        rec = {"path": None if path is None else str(path), "sha256": self.sha256, "pair": self.pair}
        return rec if self.fit == "grid" else {**rec, "fit": self.fit}

    def entry(self, model: str) -> ModelCost:
        if model not in self.models:
            raise ConfigError(f"the cost file {self.path} has no {model!r} model (it has {sorted(self.models)}); "
                              "re-measure with `python -m experiments.bench --cost-curve curve.remeasure=true`")
        return self.models[model]

    def price(self, model: str, n: int, ctx: int, last: int = 1, layers: float | None = None) -> float:
        """Seconds of one forward of ``model``: :meth:`ModelCost.seconds`, memoized at contexts that are
        multiples of 16 and interpolated between them (exact: the curves are linear in the context
        between grid contexts, which are multiples of 16)."""
        lo, frac = ctx // 16, (ctx % 16) / 16

        def at(b: int) -> float:
            key = (model, n, b, last, layers)
            if key not in self._memo:
                self._memo[key] = self.entry(model).seconds(n, 16 * b, last, layers)
            return self._memo[key]

        return at(lo) + frac * (at(lo + 1) - at(lo)) if frac else at(lo)

    def pricer(self, model: str, layers: int | None = None):
        """``(n, ctx, last) -> seconds`` for one stream (:class:`~viasd.analysis.sim.SimStream`)."""
        return lambda n, ctx, last: self.price(model, n, ctx, last, layers)


def find_cost(store_root: Path | Sequence[Path], pair: str, runtime: dict[str, Any] | None = None,
              threads: int | None = None, cpu: str | None = None) -> CostModel | None:
    """The cost model of ``pair`` in ``<store>/_cost/``: among the files of the runtime (else of the pair),
    one measured on ``cpu`` (a run's ``meta["cpu"]``, :func:`~viasd.utils.machine.cpu_name`) first, then
    this machine's file, then any; None when there is none. A run that names no CPU (decoded before runs
    recorded theirs) is priced by a file that names none either — measured in the same era, the one its
    committed tables were priced by — in any of the stores, before the rules above: which machine
    regenerates a table does not change its numbers.
    ``store_root``: one store, or several searched in turn (the local store, then the results store
    committed in the repository, whose ``_cost/`` travels with the runs it prices)."""
    roots = [store_root] if isinstance(store_root, (str, Path)) else list(store_root)
    for legacy in ((True, False) if not cpu else (False,)):
        for root in dict.fromkeys(Path(r) for r in roots):
            found = _find_cost_file(root / COST, pair, runtime, threads, cpu, legacy)
            if found is not None:
                return CostModel.load(found)
    return None


def _measured_on(path: Path) -> str | None:
    try:
        meta = json.loads(path.read_text()).get("meta", {})
        return meta.get("cpu") if isinstance(meta, dict) else None
    except (OSError, ValueError, AttributeError):  # unreadable or malformed: loading it says why
        return None


def _find_cost_file(folder: Path, pair: str, runtime: dict[str, Any] | None, threads: int | None,
                    cpu: str | None = None, legacy: bool = False) -> Path | None:
    """``legacy``: only files that name no CPU (for a run that names none)."""
    if not folder.is_dir():
        return None
    files = sorted(folder.glob(f"{pair}__*.json"))
    mine = cost_name(pair, runtime, threads) if runtime is not None and threads is not None else None
    if mine is not None:
        files = [f for f in files if f.name.endswith(mine.split("__")[-1])] or files
    if legacy:
        files = [f for f in files if _measured_on(f) is None]
        return next((f for f in files if f.name == mine), files[0] if files else None)
    if cpu:
        same = [f for f in files if _measured_on(f) == cpu]
        if same:
            return same[0]
    if mine is not None and (folder / mine).is_file():
        return folder / mine
    return files[0] if files else None


def verifier_rows(rec: dict[str, Any], stream: str) -> int:
    """Logits rows a stream's calls returned in one finished example, from its counters (``ar``: one
    per call; the target of ``sd``/``cascade_sd``: ``drafted + rounds``; VIA-SD's target: the verified
    positions plus the audit rows; the slim verifier: ``drafted + slim calls``; drafters: one per call)."""
    calls = int(rec.get(f"{stream}_calls", 0) or 0)
    if stream == "target" and "escalations" in rec:
        return int(rec.get("tier3_accepted", 0) + rec.get("tier3_rejected", 0) + rec.get("escalations", 0)
                   + rec.get("audit/rows", 0))
    if stream == "target" and rec.get("drafted"):
        return int(rec["drafted"] + rec.get("rounds", 0))
    if stream == "slim":
        return int(rec.get("drafted", 0) + calls)
    return calls


def run_layers(entry: ModelCost, rec: dict[str, Any], stream: str, layers: float | None) -> float | None:
    """Decoder layers per token ``stream`` ran in one finished example: ``<stream>_layer_tokens /
    <stream>_tokens`` when that differs from the nominal ``layers`` (None: all of them) by half a layer
    or more and the cost file has routed curves to price it; else ``layers`` unchanged."""
    work, tokens = float(rec.get(f"{stream}_layer_tokens") or 0.0), int(rec.get(f"{stream}_tokens") or 0)
    nominal = entry.n_layers if layers is None else layers
    if not work or not tokens or nominal is None or entry.routed_base is None:
        return layers
    mean = work / tokens
    return mean if abs(mean - nominal) >= 0.5 else layers


def predict_example(cost: CostModel, rec: dict[str, Any], prompt_len: int,
                    streams: dict[str, tuple[str, int | None]]) -> dict[str, float]:
    """Predicted seconds per stream of one finished example from its counters.

    ``streams``: stream name → (cost model entry, routed layers or None). The first call of each
    stream feeds the prompt (at most ``prompt_len`` tokens), the others share the rest of its
    tokens evenly at the mean context (prompt + half the output); extra logits rows cost
    ``head_row`` each (:func:`verifier_rows`). A stream whose logged ``<stream>_layer_tokens`` says it
    ran fewer (or more) decoder layers per token than its nominal plan — the full model resuming after a
    prefix it shares with the slim verifier, the slim verifier computing that prefix — is priced as a
    routed forward through its mean layers per token (:func:`run_layers`). Returns ``{stream: seconds}``
    and ``"total"``.
    """
    out, n_new = {}, int(rec.get("new_tokens", 0))
    for name, (model, layers) in streams.items():
        calls, tokens = int(rec.get(f"{name}_calls", 0) or 0), int(rec.get(f"{name}_tokens", 0) or 0)
        if not calls:
            continue
        layers = run_layers(cost.entry(model), rec, name, layers)
        first = max(1, min(prompt_len, tokens - (calls - 1)))
        rest = calls - 1
        t = cost.price(model, first, 0, 1, layers)
        if rest:
            t += rest * cost.entry(model).seconds(max(1, round((tokens - first) / rest)), prompt_len + n_new // 2,
                                                  1, layers)
        t += max(0, verifier_rows(rec, name) - calls) * cost.entry(model).head_row
        out[name] = t
    out["total"] = sum(out.values())
    return out


def relative_error(predicted: float, measured: float) -> float:
    """``predicted / measured − 1`` (NaN when either is missing)."""
    if not predicted or not measured or math.isnan(predicted) or math.isnan(measured):
        return math.nan
    return predicted / measured - 1.0
