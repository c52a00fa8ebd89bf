"""Run one configured experiment: load the pair and task, decode every example, log, summarize.

:func:`run` is what ``python -m experiments.run`` calls after Hydra composes the config; it is
also what experiment grids call per cell. It writes a run folder to the local run store (and
W&B when enabled), skips a run whose identical config already finished, and returns the
summary dict.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from viasd.config import GenerationConfig, to_dataclass
from viasd.decoding.api import METHODS, decode, method_config
from viasd.decoding.result import DecodeResult
from viasd.tracking.store import RunStore, run_id_for

log = logging.getLogger(__name__)

SUMMARY_KEYS = ("method", "pair", "task", "n_examples", "new_tokens", "wall_s", "tokens_per_s",
                "rejection_rate", "mean_accepted")


def aggregate(results: list[DecodeResult]) -> dict[str, Any]:
    """Corpus-level decoding statistics: sums of counters, ratios of sums."""
    tot: dict[str, float] = {}
    for r in results:
        for k, v in r.summary().items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in (
                    "tokens_per_s", "rejection_rate", "mean_accepted", "tokens_per_target_call"):
                tot[k] = tot.get(k, 0) + (0 if isinstance(v, float) and math.isnan(v) else v)
    new, wall = tot.get("new_tokens", 0), tot.get("wall_s", 0.0)
    drafted, accepted, rounds = tot.get("drafted", 0), tot.get("accepted", 0), tot.get("rounds", 0)
    tot["tokens_per_s"] = new / wall if wall else math.nan
    tot["rejection_rate"] = 1 - accepted / drafted if drafted else math.nan
    tot["mean_accepted"] = new / rounds if rounds else math.nan
    tot["tokens_per_target_call"] = new / tot["target_calls"] if tot.get("target_calls") else math.nan
    return tot


def _prepare(cfg: DictConfig) -> None:
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    import transformers

    transformers.logging.set_verbosity_error()


def run(cfg: DictConfig) -> dict[str, Any]:
    """Execute the run described by a composed config; returns its summary."""
    from viasd.models.pairs import load_pair
    from viasd.tasks import build_task
    from viasd.tracking.wandb_logger import WandbLogger

    _prepare(cfg)
    method_name = cfg.method.name
    mcfg = method_config(method_name, cfg.method)  # validates before anything expensive
    task = build_task(cfg.task)
    gen_cfg = OmegaConf.to_container(cfg.generation, resolve=True)
    if gen_cfg.get("max_new_tokens") is None:
        gen_cfg["max_new_tokens"] = int(task.max_new_tokens)
    gen = to_dataclass(GenerationConfig, gen_cfg)
    gen.validate()
    if task.stop_strings and not gen.stop_strings:
        gen.stop_strings = list(task.stop_strings)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    run_id = run_id_for(resolved)
    store = RunStore(cfg.tracking.store_dir)
    if cfg.tracking.get("skip_finished", True) and store.is_finished(run_id):
        print(f"[viasd] {run_id}: already finished in {store.path(run_id)}, skipping")
        import json

        return json.loads((store.path(run_id) / "summary.json").read_text())
    examples = task.examples()
    pair = load_pair(cfg.pair)
    run_dir = store.open(run_id, resolved)
    wb = WandbLogger(cfg.tracking, resolved, run_id)
    results: list[DecodeResult] = []
    predictions: list[str] = []
    t0 = time.perf_counter()
    try:
        bar = tqdm(examples, desc=f"{method_name} on {pair.name}/{task.name}", unit="ex", file=sys.stderr)
        for i, ex in enumerate(bar):
            text = task.render(ex, pair.tokenizer)
            res = decode(pair, pair.encode(text), method_name, mcfg, gen, seed=int(cfg.seed) + i)
            pred = task.postprocess(res.text)
            results.append(res)
            predictions.append(pred)
            run_dir.log_example({"id": ex.id, "prompt": text, "prediction": pred, "raw_output": res.text,
                                 "reference": ex.reference, "token_ids": res.tokens, **res.summary()})
            bar.set_postfix(tok_s=f"{res.tokens_per_s:.1f}", rej=f"{res.rejection_rate:.2f}")
        corpus, per_example = task.score(predictions, examples)
    except BaseException:
        run_dir.abort()
        wb.finish(failed=True)
        raise
    summary = {"method": method_name, "pair": pair.name, "task": task.name, "n_examples": len(examples),
               "run_id": run_id, "seed": int(cfg.seed), "total_s": time.perf_counter() - t0,
               "lossless": METHODS.get(method_name).lossless, **aggregate(results),
               **{f"metric/{k}": v for k, v in corpus.items()}}
    run_dir.finish(summary, per_example)
    wb.log_run(summary, run_dir.path)
    wb.finish()
    print_summary(summary, run_dir.path)
    return summary


def print_summary(summary: dict[str, Any], path) -> None:
    """Print a small summary table to stdout."""
    rows = [(k, summary.get(k)) for k in SUMMARY_KEYS] + [(k, v) for k, v in summary.items() if k.startswith("metric/")]
    width = max(len(k) for k, _ in rows)
    print("\n" + "-" * (width + 20))
    for k, v in rows:
        print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    print("-" * (width + 20))
    print(f"run folder: {path}")
