"""Speed benchmarks: run several methods on the same prompts and compare them to ``ar``.

Methods run interleaved per prompt (so drift in machine load hits all of them alike) after a
warm-up. Reported per method: tokens/s, speedup over ``ar``, rejection rate, mean accepted
length, tokens per target call, forward calls per model, the cost ratio ``c`` (draft 1-token
forward / target 1-token forward) and the ideal speedup ``(1−α^{γ+1})/((1−α)(γc+1))`` from the
measured acceptance ``α = 1 − rejection rate``, and agreement of the output with ``ar``'s.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from viasd.config import GenerationConfig
from viasd.decoding.api import decode
from viasd.decoding.result import DecodeResult
from viasd.decoding.rules import ideal_speedup
from viasd.runner import aggregate


@dataclass
class Variant:
    """One benchmark row: a label, a registered method and its config."""

    label: str
    method: str
    cfg: dict[str, Any] = field(default_factory=dict)


def agreement(a: list[int], b: list[int]) -> float:
    """Fraction of positions where two token sequences agree (over the longer length)."""
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b)) / n if n else 1.0


def run_bench(pair, prompts: list[str], variants: list[Variant], gen: GenerationConfig, warmup: int = 1,
              seed: int = 0, progress: bool = True) -> list[dict[str, Any]]:
    """Run every variant on every prompt; returns one row of statistics per variant."""
    ids = [pair.encode(p) for p in prompts]
    for v in variants:  # warm-up (allocator, kernels)
        for x in ids[:warmup]:
            decode(pair, x, v.method, v.cfg, gen, seed=seed)
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
        ideal = ideal_speedup(alpha, int(gamma), c) if gamma and not (math.isnan(alpha) or math.isnan(c)) else math.nan
        speed = agg["tokens_per_s"] / ar_tps if ar_tps else math.nan
        agree = (sum(agreement(r.tokens, b.tokens) for r, b in zip(results[v.label], base)) / len(base)
                 if base else math.nan)
        row = {"variant": v.label, "method": v.method, "config": v.cfg, **agg, "speedup_vs_ar": speed,
               "alpha": alpha, "cost_ratio_c": c, "ideal_speedup": ideal,
               "measured_over_ideal": speed / ideal if ideal and not math.isnan(ideal) else math.nan,
               "agreement_with_ar": agree}
        rows.append(row)
    return rows


COLUMNS = [("variant", "{}"), ("tokens_per_s", "{:.1f}"), ("speedup_vs_ar", "{:.2f}x"),
           ("rejection_rate", "{:.3f}"), ("mean_accepted", "{:.2f}"), ("tokens_per_target_call", "{:.2f}"),
           ("target_calls", "{:.0f}"), ("draft_calls", "{:.0f}"), ("cost_ratio_c", "{:.3f}"),
           ("ideal_speedup", "{:.2f}x"), ("measured_over_ideal", "{:.2f}"), ("agreement_with_ar", "{:.3f}")]


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
    from viasd.tracking.store import atomic_write_json

    meta = {**meta, "host": platform.node(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(Path(path), {"meta": meta, "rows": rows})
