"""Speed benchmarks: run several methods on the same prompts and compare them to ``ar``.

Methods run interleaved per prompt (so drift in machine load hits all of them alike) after a
warm-up. Reported per method: tokens/s, speedup over ``ar``, rejection rate, mean accepted
length, tokens per target call, forward calls per model, the cost ratio ``c`` (draft 1-token
forward / target 1-token forward), the measured block cost ``T = t(γ+1)/t(1)`` of the target
(from :func:`cost_curve` in the same process) and the ideal speedup
``(1−α^{γ+1})/((1−α)(γc+T))`` from the measured acceptance ``α = 1 − rejection rate`` (with
``T = 1`` it is Leviathan et al.'s bound, kept as ``ideal_speedup_flat``), and the token match of
the output with ``ar``'s.

:func:`cost_curve` measures one model's forward time for 1..K new tokens after a fixed cached
context, as ratios ``t(k)/t(1)``, next to the model's bandwidth floor (bytes of the weights a
token reads / measured single-thread read bandwidth, :func:`read_bandwidth`).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from viasd.config import GenerationConfig
from viasd.core.rules import expected_tokens, ideal_speedup
from viasd.engine.paths import unit_modules
from viasd.engine.result import DecodeResult
from viasd.engine.routing import RoutingPlan, all_units, decoder_layers
from viasd.engine.stream import Stream, start_sequence
from viasd.errors import ConfigError
from viasd.harness.runner import aggregate
from viasd.methods.api import decode
from viasd.models.backend import PackedLinear
from viasd.utils.fs import atomic_write_json


@dataclass
class Variant:
    """One benchmark row: a label, a registered method and its config."""

    label: str
    method: str
    cfg: dict[str, Any] = field(default_factory=dict)


def ideal_with_block_cost(alpha: float, gamma: int, c: float, block: float) -> float:
    """Ideal speedup ``(1 − α^{γ+1}) / ((1 − α)(γc + T))`` with the measured verification cost
    ``T = t(γ+1)/t(1)`` of a γ+1-token block (``T = 1`` gives Leviathan et al. 2023, Thm. 3.8)."""
    return expected_tokens(alpha, gamma) / (gamma * c + block)


def token_match(a: list[int], b: list[int]) -> float:
    """Fraction of positions where two token sequences agree (over the longer length)."""
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b)) / n if n else 1.0


def run_bench(pair, prompts: list[str], variants: list[Variant], gen: GenerationConfig, warmup: int = 1,
              seed: int = 0, progress: bool = True, curve_reps: int = 3) -> list[dict[str, Any]]:
    """Run every variant on every prompt; returns one row of statistics per variant.

    ``warmup`` untimed decodes per variant come first; then the target's block costs
    ``t(γ+1)/t(1)`` are measured (:func:`cost_curve` on CPU time, ``curve_reps`` repeats, at the
    mean prompt length plus half the generation) for the ideal-speedup column.
    """
    ids = [pair.encode(p) for p in prompts]
    for v in variants:  # warm-up (allocator, kernels)
        for x in ids[:warmup]:
            decode(pair, x, v.method, v.cfg, gen, seed=seed)
    gammas = sorted({int(v.cfg["gamma"]) for v in variants if v.cfg.get("gamma")})
    context = int(sum(x.shape[1] for x in ids) / len(ids)) + gen.max_new_tokens // 2
    curve = {1: 1.0}
    if gammas:
        curve = cost_curve(pair.target, [1] + [g + 1 for g in gammas], context, curve_reps, clock="cpu")
    results: dict[str, list[DecodeResult]] = {v.label: [] for v in variants}
    for i, x in enumerate(tqdm(ids, desc="bench", unit="prompt", disable=not progress)):
        for v in variants:
            results[v.label].append(decode(pair, x, v.method, v.cfg, gen, seed=seed + i))
    base = results.get("ar")
    ar_tps = aggregate(base)["tokens_per_s"] if base else math.nan
    ar_target_s = aggregate(base)["target_s"] / max(1, aggregate(base)["target_calls"]) if base else math.nan
    rows = []
    for v in variants:
        agg = aggregate(results[v.label])
        gamma = v.cfg.get("gamma")
        alpha = 1 - agg["rejection_rate"] if not math.isnan(agg["rejection_rate"]) else math.nan
        c = math.nan
        for name in ("draft", "self_draft"):
            if agg.get(f"{name}_calls"):
                c = (agg[f"{name}_s"] / agg[f"{name}_calls"]) / ar_target_s
        if v.cfg.get("drafter", {}).get("name") == "ngram":
            c = 0.0
        known = gamma and not (math.isnan(alpha) or math.isnan(c))
        block = curve[int(gamma) + 1] / curve[1] if gamma else math.nan
        ideal = ideal_with_block_cost(alpha, int(gamma), c, block) if known else math.nan
        flat = ideal_speedup(alpha, int(gamma), c) if known else math.nan
        speed = agg["tokens_per_s"] / ar_tps if ar_tps else math.nan
        agree = (sum(token_match(r.tokens, b.tokens) for r, b in zip(results[v.label], base)) / len(base)
                 if base else math.nan)
        row = {"variant": v.label, "method": v.method, "config": v.cfg, **agg, "speedup_vs_ar": speed,
               "alpha": alpha, "cost_ratio_c": c, "block_cost_T": block, "ideal_speedup": ideal,
               "ideal_speedup_flat": flat,
               "measured_over_ideal": speed / ideal if ideal and not math.isnan(ideal) else math.nan,
               "token_match_vs_ar": agree}
        rows.append(row)
    return rows


COLUMNS = [("variant", "{}"), ("tokens_per_s", "{:.1f}"), ("speedup_vs_ar", "{:.2f}x"),
           ("rejection_rate", "{:.3f}"), ("mean_accepted", "{:.2f}"), ("tokens_per_target_call", "{:.2f}"),
           ("target_calls", "{:.0f}"), ("draft_calls", "{:.0f}"), ("cost_ratio_c", "{:.3f}"),
           ("block_cost_T", "{:.2f}"), ("ideal_speedup", "{:.2f}x"), ("measured_over_ideal", "{:.2f}"),
           ("token_match_vs_ar", "{:.3f}")]


def format_table(rows: list[dict[str, Any]], columns=COLUMNS) -> str:
    """A Markdown table of benchmark rows (NaN shown as ``–``)."""
    def fmt(v, f):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        try:
            return f.format(v)
        except (ValueError, TypeError):
            return str(v)

    head = "| " + " | ".join(c for c, _ in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r.get(c), f) for c, f in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def write_json(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    meta = {**meta, "host": platform.node(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(Path(path), {"meta": meta, "rows": rows})


# --------------------------------------------------------------------------- cost curves

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def cost_curves(entries: Sequence[tuple[Any, RoutingPlan | None]], ks: Sequence[int] = tuple(range(1, 9)),
                context: int = 256, reps: int = 5, seed: int = 0,
                clock: str = "wall", all_rows: bool = True) -> list[dict[int, float]]:
    """Forward seconds of each ``(model, plan)`` scoring ``k`` new tokens after ``context`` cached ones.

    Runs through the project's :class:`~viasd.engine.stream.Stream` (routed when ``plan`` is
    given), rolling the cache back to the context after every block. Models and ``k`` values
    are interleaved within each repeat (one untimed warm-up round first) so load drift hits
    them alike; the minimum over ``reps`` is kept. ``clock``: ``wall`` (perf_counter) or
    ``cpu`` (this process's CPU time: what a forward costs when other processes share the
    cores; with 1 torch thread it excludes the time the thread waits to be scheduled).
    ``all_rows``: the forward returns ``k`` logits rows (a verification), else one (a decode step).

    Returns:
        One ``{k: seconds}`` per entry.
    """
    gen = torch.Generator().manual_seed(seed)
    hi = max(5, min(min(int(m.config.vocab_size) for m, _ in entries), 1000))
    ctx = torch.randint(4, hi, (1, context), generator=gen)
    streams, seqs = [], []
    for model, plan in entries:
        x = ctx.to(next(model.parameters()).device)
        start = start_sequence(model, x)
        seqs.append(x if start is x else torch.cat([start, x[:, : context - start.shape[1]]], dim=1))
        streams.append(Stream(model, x, "curve", plan=plan))
        streams[-1].logits(seqs[-1])
    best = [{int(k): math.inf for k in ks} for _ in entries]
    for r in range(reps + 1):
        for k in best[0]:
            new = torch.randint(4, hi, (1, k), generator=gen)
            for stream, seq0, b in zip(streams, seqs, best):
                seq = torch.cat([seq0, new.to(seq0.device)], dim=1)
                t0 = CLOCKS[clock]()
                stream.logits(seq, last=k if all_rows else 1)
                stream.synchronize()  # the timed section ends when the device is done (streams do not sync)
                if r:
                    b[k] = min(b[k], CLOCKS[clock]() - t0)
                stream.rollback(seq0.shape[1])
    return best


def cost_curve(model, ks: Sequence[int] = tuple(range(1, 9)), context: int = 256, reps: int = 5,
               plan: RoutingPlan | None = None, seed: int = 0, clock: str = "wall") -> dict[int, float]:
    """:func:`cost_curves` of one model: ``{k: seconds}``."""
    return cost_curves([(model, plan)], ks, context, reps, seed, clock)[0]


def weight_bytes(model, plan: RoutingPlan | None = None) -> int:
    """Bytes of the weights one decode step reads: every linear map (LM head included) of the
    decoder layers that run, excluding the input-embedding lookup and a T5 encoder (run once)."""
    skipped: list[torch.nn.Module] = []
    if plan is not None:
        kept = set(plan.units())
        skipped += [m for u in all_units(len(decoder_layers(model))) if u not in kept for m in unit_modules(model, u)]
    if getattr(model.config, "is_encoder_decoder", False):
        skipped.append(model.get_encoder())
    skip = {id(m) for s in skipped for m in s.modules()}
    size = next(model.parameters()).element_size()
    total = sum(m.in_features * m.out_features * size for m in model.modules()
                if isinstance(m, (torch.nn.Linear, PackedLinear)) and id(m) not in skip)
    head = model.get_output_embeddings()
    if not isinstance(head, (torch.nn.Linear, PackedLinear)):  # e.g. a vocabulary-subset head
        total += head.weight.numel() * head.weight.element_size()
    return int(total)


def read_bandwidth(mib: int = 256, reps: int = 5, clock: str = "wall") -> float:
    """Measured read bandwidth in bytes/s: the fastest of ``reps`` sums over a ``mib`` MiB buffer
    (with the caller's torch thread count, the benchmarks use 1; ``clock`` as in :func:`cost_curves`)."""
    buf = torch.ones(mib * 2**20 // 4)
    buf.sum()
    best = math.inf
    for _ in range(reps):
        t0 = CLOCKS[clock]()
        buf.sum()
        best = min(best, CLOCKS[clock]() - t0)
    return buf.numel() * 4 / best


def curve_models(pair, keep_ratio: float) -> list[tuple[str, Any, RoutingPlan | None]]:
    """The models of a pair a cost curve covers: draft (if any), slim verifier at ``keep_ratio``
    (routed target, decoder-only or T5) and target, as ``(label, model, plan)``."""
    from viasd.dimr.masks import resolve_plan
    from viasd.methods.via_sd import SlimConfig

    out = [("draft", pair.draft, None)] if pair.draft is not None else []
    model, plan, _ = resolve_plan(pair, SlimConfig(keep_ratio=keep_ratio))
    if plan is not None:
        out.append((f"slim@{keep_ratio:.2f}", model, plan))
    return out + [("target", pair.target, None)]


def cost_curve_rows(pairs: dict[str, Any], bandwidth: float, ks: Sequence[int], context: int, reps: int,
                    keep_ratio: float, clock: str = "wall") -> list[dict[str, Any]]:
    """One row per backend (``pairs``: backend label → pair) and model of the pair (see
    :func:`curve_models`), all measured interleaved: ``t1_ms``, ``r{k}`` = t(k)/t(1), the
    bandwidth floor ``floor_ms`` and ``floor_frac`` = floor / t(1) (1.0 = at the floor)."""
    entries = [(backend, label, model, plan) for backend, pair in pairs.items()
               for label, model, plan in curve_models(pair, keep_ratio)]
    times = cost_curves([(m, p) for _, _, m, p in entries], ks, context, reps, clock=clock)
    rows = []
    for (backend, label, model, plan), t in zip(entries, times):
        floor = weight_bytes(model, plan) / bandwidth
        rows.append({"backend": backend, "model": label, "weight_mb": weight_bytes(model, plan) / 1e6,
                     "t1_ms": t[ks[0]] * 1e3, **{f"r{k}": t[k] / t[ks[0]] for k in ks},
                     "floor_ms": floor * 1e3,
                     "floor_frac": floor / t[ks[0]], "tokens_per_s_1": 1 / t[ks[0]]})
    return rows


def curve_columns(ks: Sequence[int]) -> list[tuple[str, str]]:
    """Table columns of :func:`cost_curve_rows`."""
    return ([("backend", "{}"), ("model", "{}"), ("weight_mb", "{:.0f}"), ("t1_ms", "{:.1f}")]
            + [(f"r{k}", "{:.2f}") for k in ks] + [("floor_ms", "{:.1f}"), ("floor_frac", "{:.2f}")])


@dataclass
class CostGrid:
    """Where :func:`measure_cost_model` measures (``curve.cost`` of ``conf/bench.yaml``)."""

    enabled: bool = True
    ns: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20])
    contexts: list[int] = field(default_factory=lambda: [64, 512, 1536])
    prefill_ns: list[int] = field(default_factory=lambda: [64, 256])
    reps: int = 3
    remeasure: bool = False


def _model_entries(pair) -> list[tuple[str, str, Any, RoutingPlan | None]]:
    """``(cost entry, kind, model, plan)`` measured for a cost file: every model's own forward and,
    for the target, routed passes over all and over half of its layers (the per-layer fit)."""
    out = [("target", "native", pair.target, None)]
    try:
        n = len(decoder_layers(pair.target))
    except ConfigError:  # not routable: no slim verifier to price
        n = 0
    if n >= 2:
        out += [("target", "full", pair.target, RoutingPlan.build(range(n), n)),
                ("target", "half", pair.target, RoutingPlan.build(range(n // 2), n))]
    if pair.draft is not None:
        out.append(("draft", "native", pair.draft, None))
    if pair.intermediate is not None and pair.intermediate is not pair.draft:
        out.append(("intermediate", "native", pair.intermediate, None))
    return out


def measure_cost_model(pair, ns: Sequence[int], contexts: Sequence[int], prefill_ns: Sequence[int], reps: int,
                       clock: str = "cpu", log=print) -> dict[str, Any]:
    """The cost file of a pair (:class:`viasd.analysis.cost.CostModel` reads it): per model and forward
    kind the seconds of feeding ``n`` tokens after ``context`` cached ones with one logits row, on the
    grid ``ns × contexts`` and the prefill line ``prefill_ns`` (after one cached token); the target's
    routed passes fitted as ``base + layers · per_layer``; the cost of an extra logits row."""
    entries = _model_entries(pair)
    pairs_ = [(m, p) for _, _, m, p in entries]
    decode = []
    for ctx in contexts:
        log(f"  cost model: {len(entries)} forwards x {len(ns)} sizes after {ctx} cached tokens")
        decode.append(cost_curves(pairs_, ns, ctx, reps, clock=clock, all_rows=False))
    log(f"  cost model: prefill of {list(prefill_ns)} tokens")
    prefill = cost_curves(pairs_, prefill_ns, 1, max(1, reps // 2), clock=clock, all_rows=False)
    h = max(ns)
    rows_all = cost_curves(pairs_, [h], contexts[len(contexts) // 2], reps, clock=clock, all_rows=True)
    curves: dict[tuple[str, str], dict[str, Any]] = {}
    for j, (name, kind, _, _) in enumerate(entries):
        grid = [[decode[c][j][n] for c in range(len(contexts))] for n in ns]
        head = max(0.0, (rows_all[j][h] - decode[len(contexts) // 2][j][h]) / (h - 1)) if h > 1 else 0.0
        curves[(name, kind)] = {"decode": grid, "prefill": [prefill[j][n] for n in prefill_ns], "head_row": head}
    models: dict[str, Any] = {}
    for name in dict.fromkeys(e[0] for e in entries):
        native = curves[(name, "native")]
        model = next(m for e, _, m, _ in entries if e == name)
        try:
            n_layers = len(decoder_layers(model))
        except ConfigError:
            n_layers = None
        entry = {"n_layers": n_layers, "native": native, "head_row": native["head_row"]}
        if (name, "full") in curves:
            full, half = curves[(name, "full")], curves[(name, "half")]
            lf, lh = n_layers, n_layers // 2
            per = {k: (np.asarray(full[k]) - np.asarray(half[k])) / (lf - lh) for k in ("decode", "prefill")}
            entry["routed_layer"] = {k: v.tolist() for k, v in per.items()}
            entry["routed_base"] = {k: (np.asarray(full[k]) - lf * per[k]).tolist() for k in ("decode", "prefill")}
        models[name] = entry
    if pair.intermediate is not None and pair.intermediate is pair.draft:
        models["intermediate"] = models["draft"]
    return {"grid": {"ns": list(ns), "contexts": list(contexts), "prefill_ns": list(prefill_ns)}, "models": models}
