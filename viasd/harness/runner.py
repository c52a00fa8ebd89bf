"""Run one configured experiment: load the pair and task, decode every example, log, summarize.

:func:`run` is what ``python -m experiments.run`` calls after Hydra composes the config; it is
also what experiment grids call per cell. It writes a run folder to the local run store (and
W&B when enabled), skips a run whose identical config *and input files* already finished, and
returns the summary dict. A run's identity (:func:`identity`) is the resolved config plus the
SHA-256 of every input file it reads (prompt/data file, DIMR mask artifact); its summary
records the slim mask actually used, the speedup over the ``ar`` run of the identical workload
(when that run is in the store) and the sweep objective ``speedup_at_quality``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from viasd.config import GenerationConfig, to_dataclass
from viasd.dimr.calibration import calibration_inputs
from viasd.dimr.masks import mask_path, resolve_plan
from viasd.engine.result import DecodeResult
from viasd.errors import RunInterrupted
from viasd.harness.config import drop_unset
from viasd.methods.api import METHODS, decode, method_config, warm_up
from viasd.paths import data_dir
from viasd.tracking.baseline import ar_index, matched_ar, speedup, speedup_at_quality, tier_shares
from viasd.tracking.store import RunStore, file_sha256, run_id_for
from viasd.tracking.wandb_logger import WandbLogger, labels_for, upload_finished

log = logging.getLogger(__name__)

SUMMARY_KEYS = ("method", "pair", "task", "n_examples", "new_tokens", "wall_s", "tokens_per_s",
                "rejection_rate", "target_calls_per_token", "mean_accepted", "speedup_vs_ar", "speedup_at_quality")


def aggregate(results: list[DecodeResult] | list[dict[str, Any]]) -> dict[str, Any]:
    """Corpus-level decoding statistics: sums of counters, ratios of sums (results or their summaries)."""
    tot: dict[str, float] = {}
    for r in results:
        for k, v in (r.summary() if isinstance(r, DecodeResult) else r).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in (
                    "tokens_per_s", "rejection_rate", "mean_accepted", "tokens_per_target_call",
                    "target_calls_per_token"):
                tot[k] = tot.get(k, 0) + (0 if isinstance(v, float) and math.isnan(v) else v)
    new, wall = tot.get("new_tokens", 0), tot.get("wall_s", 0.0)
    drafted, accepted, rounds = tot.get("drafted", 0), tot.get("accepted", 0), tot.get("rounds", 0)
    tot["tokens_per_s"] = new / wall if wall else math.nan
    tot["rejection_rate"] = 1 - accepted / drafted if drafted else math.nan
    tot["mean_accepted"] = new / rounds if rounds else math.nan
    tot["tokens_per_target_call"] = new / tot["target_calls"] if tot.get("target_calls") else math.nan
    tot["target_calls_per_token"] = tot["target_calls"] / new if new and "target_calls" in tot else math.nan
    return tot


# Keys of an example record that are not decoding statistics.
EXAMPLE_ONLY = ("id", "prompt", "prediction", "raw_output", "reference", "token_ids", "score")

_PAIRS: dict[str, Any] = {}


def cached_pair(pair_cfg: DictConfig):
    """Load a pair once per process (grids reuse it across cells)."""
    from viasd.models.pairs import load_pair

    key = json.dumps(OmegaConf.to_container(pair_cfg, resolve=True), sort_keys=True)
    if key not in _PAIRS:
        _PAIRS.clear()  # keep one pair in memory
        _PAIRS[key] = load_pair(pair_cfg)
    return _PAIRS[key]


_HASHES: dict[tuple[str, int, int], str] = {}


def _sha(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _HASHES:
        _HASHES[key] = file_sha256(path)
    return _HASHES[key]


def input_files(cfg: DictConfig) -> dict[str, Path]:
    """Every existing input file a run of ``cfg`` reads: ``{config key: path}``.

    The task's prompt file (``task.path``) or offline data file (``task.offline_file``, relative
    to the data folder), and the DIMR mask artifact a ``method.slim.mask`` of ``auto`` or a
    ``.json`` path resolves to. Missing files are left out (the task/mask loader reports them).
    """
    files: dict[str, Path] = {}
    task = cfg.get("task") or {}
    if task.get("path"):
        files["task.path"] = Path(str(task.path)).expanduser().resolve()
    if task.get("offline_file") and task.get("source", "offline") != "hub":
        p = Path(str(task.offline_file))
        base = None if p.is_absolute() else data_dir(required=False)
        if p.is_absolute() or base is not None:
            files["task.offline_file"] = p if p.is_absolute() else base / p
    slim = (cfg.get("method") or {}).get("slim") if isinstance(cfg.get("method"), DictConfig) else None
    if slim is not None and isinstance(slim.get("mask"), str):
        mask = slim.mask
        if mask == "auto":
            files["method.slim.mask"] = mask_path(str(cfg.pair.name), float(slim.get("keep_ratio", 0.5)),
                                                  str(slim.get("objective", "kl")), str(slim.get("space", "layers")))
        elif mask.endswith(".json"):
            files["method.slim.mask"] = Path(mask).expanduser().resolve()
    return {k: p for k, p in files.items() if p.is_file()}


def layers_sha256(layers: list[int] | None) -> str:
    """The hash a slim mask given as a layer list (not a file) is recorded under."""
    return hashlib.sha256(json.dumps(layers).encode()).hexdigest()


def shipped_mask_input(cfg: DictConfig, inputs: dict[str, str]) -> dict[str, str]:
    """``{"method.slim.mask": sha256}`` of the pair-shipped layer list a ``method.slim.mask: auto``
    resolves to when no mask artifact is cached (empty otherwise): the hash
    :func:`slim_mask_used` records, so a run's id follows the mask it reads, and runs that never
    read one keep their id when a pair config ships a new mask."""
    slim = OmegaConf.select(cfg, "method.slim", default=None)
    if slim is None or "method.slim.mask" in inputs or str(slim.get("mask")) != "auto" or \
            str(slim.get("space", "layers")) != "layers":  # pairs ship whole-layer masks only
        return {}
    shipped = OmegaConf.select(cfg, "pair.options.slim_layers", default=None) or {}
    layers = shipped.get(f"{float(slim.get('keep_ratio', 0.5)):.2f}")
    if layers is None:
        return {}
    return {"method.slim.mask": layers_sha256([int(i) for i in layers])}


def identity(cfg: DictConfig, entry: str | None = None) -> dict[str, Any]:
    """The resolved config that names a run (``run_id_for`` of it), per entry (run/search/kl).

    Includes ``inputs``: ``{config key: sha256}`` of every file of :func:`input_files` and of a
    pair-shipped slim mask (:func:`shipped_mask_input`), so an edited prompt/data/mask gives a new
    run id (KL runs: the mask only); ``pair.options.slim_layers`` itself is left out; leaves out
    the keys the config schemas add
    at their unset value (:func:`~viasd.harness.config.drop_unset`), so older run ids stay valid.
    """
    resolved = drop_unset(OmegaConf.to_container(cfg, resolve=True))
    entry = entry or OmegaConf.select(cfg, "exp.entry", default="run")
    options = (resolved.get("pair") or {}).get("options")
    if isinstance(options, dict):  # shipped masks are inputs of the methods that read them, not the pair's
        options.pop("slim_layers", None)
    if entry in ("run", "kl"):
        inputs = {k: _sha(p) for k, p in input_files(cfg).items()}
        inputs.update(shipped_mask_input(cfg, inputs))
        resolved["inputs"] = inputs if entry == "run" else {k: v for k, v in inputs.items() if k.startswith("method.")}
    if entry == "search":
        resolved.update(calibration_inputs(cfg))  # in-domain calibration: the stored runs it reads
        resolved["method"] = {"name": "dimr_search"}
        resolved["task"] = {"name": "calibration"}
    elif entry == "kl":
        resolved["method"] = {"name": "kl_geometry", "slim": resolved.get("method", {}).get("slim", {})}
        resolved["task"] = {"name": "+".join(cfg.search.calibration)}
    return resolved


def _prepare(cfg: DictConfig) -> None:
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    import transformers

    transformers.logging.set_verbosity_error()


def slim_mask_used(pair, mcfg: Any, inputs: dict[str, str]) -> dict[str, Any] | None:
    """``{"layers", "source", "sha256"}`` of the slim verifier a method config resolves to (None: no slim).

    ``sha256`` is the mask artifact's file hash when one is read, else the hash of the layer list.
    """
    slim = getattr(mcfg, "slim", None)
    if slim is None:
        return None
    _, plan, desc = resolve_plan(pair, slim)
    layers = plan.spec() if plan is not None else None
    sha = inputs.get("method.slim.mask") if ("dimr" in desc or "file" in desc) else None
    return {"layers": layers, "source": desc,
            "sha256": sha or layers_sha256(layers)}


def matched_speedups(summary: dict[str, Any], resolved: dict[str, Any], store: RunStore,
                     delta: float) -> dict[str, Any]:
    """``speedup_vs_ar``, ``speedup_at_quality`` and ``ar_run_id`` against the matched ``ar`` run."""
    ar = {"run_id": summary.get("run_id"), "summary": summary} if summary.get("method") == "ar" else \
        matched_ar(resolved, ar_index(store))
    if ar is None:
        return {"speedup_vs_ar": math.nan, "speedup_at_quality": math.nan, "ar_run_id": None}
    return {"speedup_vs_ar": speedup(summary, ar["summary"]),
            "speedup_at_quality": speedup_at_quality(summary, ar["summary"], delta), "ar_run_id": ar["run_id"]}


def run(cfg: DictConfig) -> dict[str, Any]:
    """Execute the run described by a composed config; returns its summary."""
    from viasd.tasks import build_task

    _prepare(cfg)
    method_name = cfg.method.name
    mcfg = method_config(method_name, cfg.method)  # validates before anything expensive
    task = build_task(cfg.task)
    task.preflight()  # e.g. code tasks refuse now, not after generation, when no sandbox is available
    gen_cfg = OmegaConf.to_container(cfg.generation, resolve=True)
    if gen_cfg.get("max_new_tokens") is None:
        gen_cfg["max_new_tokens"] = int(task.max_new_tokens)
    gen = to_dataclass(GenerationConfig, gen_cfg)
    gen.validate()
    resolved = identity(cfg)
    run_id = run_id_for(resolved)
    store = RunStore(cfg.tracking.store_dir)
    done = _finished(cfg, resolved)
    if done is not None:
        upload_finished(cfg.tracking, store.path(run_id))
        return done
    examples = task.examples()
    pair = cached_pair(cfg.pair)
    if not gen.stop_strings:
        gen.stop_strings = list(task.stop_strings_for(pair.tokenizer))
    files = input_files(cfg)
    data = data_dir(required=False)
    meta = {"inputs": {k: {"path": str(p), "sha256": resolved["inputs"][k]} for k, p in files.items()},
            "data_dir": str(data) if data else None, "threads": torch.get_num_threads(),
            "runtime": pair.extras.get("runtime", {})}
    # Examples an interrupted attempt at this run finished are kept, not decoded again (same run
    # id = same config and inputs); only the prefix in task order is reused.
    earlier = store.partial_examples(run_id)
    reuse = []
    for ex, rec in zip(examples, earlier):
        if rec.get("id") != ex.id:
            break
        reuse.append(rec)
    run_dir = store.open(run_id, resolved, meta, resume=reuse)
    if reuse:
        print(f"[viasd] {run_id}: resuming after {len(reuse)} examples an interrupted attempt finished")
    mask = slim_mask_used(pair, mcfg, resolved["inputs"])
    if mask is not None:
        run_dir.update_meta(slim_mask=mask)
    labels = labels_for(resolved)
    wb = WandbLogger(cfg.tracking, resolved, run_id, **labels)
    results: list[dict[str, Any]] = [{k: r[k] for k in r if k not in EXAMPLE_ONLY} for r in reuse]
    predictions: list[str] = [r["prediction"] for r in reuse]
    try:
        if examples:  # one untimed short decode: one-time costs stay out of the timed examples
            warm_up(pair, pair.encode(task.render(examples[0], pair.tokenizer)), method_name, mcfg, gen)
        t0 = time.perf_counter()
        bar = tqdm(examples, desc=f"{labels['job_type']} on {pair.name}/{task.name}", unit="ex", file=sys.stderr)
        for i, ex in enumerate(bar):
            if i < len(reuse):
                continue
            text = task.render(ex, pair.tokenizer)
            res = decode(pair, pair.encode(text), method_name, mcfg, gen, seed=int(cfg.seed) + i)
            pred = task.postprocess(res.text)
            results.append(res.summary())
            predictions.append(pred)
            record = {"id": ex.id, "prompt": text, "prediction": pred, "raw_output": res.text,
                      "reference": ex.reference, "token_ids": res.tokens, **res.summary()}
            run_dir.log_example(record)
            wb.log_example(i, record)
            bar.set_postfix(tok_s=f"{res.tokens_per_s:.1f}", rej=f"{res.rejection_rate:.2f}")
        corpus, per_example = task.score(predictions, examples)
    except KeyboardInterrupt as e:
        run_dir.abort()
        wb.finish(failed=True)
        raise RunInterrupted(run_dir.path) from e
    except BaseException:
        run_dir.abort()
        wb.finish(failed=True)
        raise
    summary = {"method": labels["job_type"], "method_impl": method_name, "pair": pair.name, "task": task.name,
               "n_examples": len(examples), "run_id": run_id, "seed": int(cfg.seed),
               "total_s": time.perf_counter() - t0, "resumed_examples": len(reuse), "lossless": METHODS.get(method_name).lossless,
               **aggregate(results),
               **{f"runtime/{k}": v for k, v in pair.extras.get("runtime", {}).items() if k != "dtype_probe"},
               **{f"metric/{k}": v for k, v in corpus.items()}}
    if mask is not None:
        summary.update({"slim_mask/layers": mask["layers"], "slim_mask/source": mask["source"],
                        "slim_mask/sha256": mask["sha256"]})
    if summary.get("tier1_accepted") or summary.get("escalations") or summary.get("tier2_regenerated"):
        summary.update({f"tier_share/{k}": v for k, v in tier_shares(summary).items()})
    summary.update(matched_speedups(summary, resolved, store, float(cfg.tracking.get("quality_delta", 1.0))))
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


def _finished(cfg: DictConfig, resolved: dict[str, Any]) -> dict[str, Any] | None:
    store = RunStore(cfg.tracking.store_dir)
    run_id = run_id_for(resolved)
    if cfg.tracking.get("skip_finished", True) and store.is_finished(run_id):
        print(f"[viasd] {run_id}: already finished in {store.path(run_id)}, skipping")
        return json.loads((store.path(run_id) / "summary.json").read_text())
    return None


def run_search(cfg: DictConfig) -> dict[str, Any]:
    """DIMR search for ``cfg.pair`` at ``cfg.search``; logs trials and the mask as a run."""
    from viasd.dimr.search import SearchConfig, search_mask

    _prepare(cfg)
    scfg = to_dataclass(SearchConfig, cfg.search)
    scfg.validate()
    resolved = identity(cfg, "search")
    done = _finished(cfg, resolved)
    if done is not None and Path(done.get("path", "")).is_file():
        return done
    pair = cached_pair(OmegaConf.merge(cfg.pair, {"dtype": scfg.dtype}))
    run_id = run_id_for(resolved)
    wb = WandbLogger(cfg.tracking, resolved, run_id, **labels_for(resolved))
    art = search_mask(pair, scfg, on_trial=wb.trial_logger(),  # trials reach W&B as they run
                      store_dir=cfg.tracking.store_dir)
    rnd = art["baselines"]["random"]
    print(f"\nDIMR {art['pair']}: keep {art['keep_ratio']} = {art['budget']}/{art['n_layers']} layers' parameters "
          f"({art['space']}, {art['objective']}), {art['n_trials']} trials in {art['search_seconds']:.0f}s")
    rows = [("searched", art), *((name, art["baselines"][name]) for name in ("first_k", "every_other"))]
    rows += [(f"held-out {name}", h) for name, h in (art.get("held_out") or {}).items() if isinstance(h, dict)]
    for name, b in rows:
        print(f"  {name:<21} {b['layers']}  KL(q||q')={b['kl_q_slim']:.4f}  top1={b['top1_agreement']:.3f}  "
              f"conf.top1={b['confident_top1']:.3f} (share {b['confident_share']:.2f})  params {b['param_fraction']:.3f}")
    if rnd:
        kls = sorted(r["kl_q_slim"] for r in rnd)
        print(f"  random x{len(rnd)}   KL(q||q') min={kls[0]:.4f} median={kls[len(kls) // 2]:.4f}")
    print(f"mask written to {art['path']}")
    store = RunStore(cfg.tracking.store_dir)
    run_dir = store.open(run_id, resolved)
    for t in art["trials"]:
        run_dir.log_example(t)
    summary = {k: v for k, v in art.items() if k not in ("trials", "config")}
    summary.update({"method": "dimr_search", "task": "calibration", "n_examples": art["n_trials"],
                    "mask_sha256": file_sha256(Path(art["path"]))})
    run_dir.finish(summary)
    wb.log_artifact(Path(art["path"]), f"mask-{pair.name}-keep{scfg.keep_ratio:.2f}", "dimr_mask")
    wb.log_run(summary, run_dir.path)
    wb.finish()
    return summary


def run_kl(cfg: DictConfig) -> dict[str, Any]:
    """KL geometry of ``cfg.pair`` and its slim verifier (``cfg.method.slim``) on calibration text."""
    from viasd.dimr.calibration import calibration_texts
    from viasd.dimr.search import kl_geometry
    from viasd.methods.via_sd import SlimConfig

    _prepare(cfg)
    slim_node = OmegaConf.to_container(cfg.method, resolve=True).get("slim", {}) if "method" in cfg else {}
    slim_cfg = to_dataclass(SlimConfig, slim_node)
    calib = list(cfg.search.calibration)
    resolved = identity(cfg, "kl")
    done = _finished(cfg, resolved)
    if done is not None:
        return done
    pair = cached_pair(OmegaConf.merge(cfg.pair, {"dtype": cfg.search.get("dtype", "float32")}))
    _, plan, desc = resolve_plan(pair, slim_cfg)
    if plan is None:
        from viasd.errors import ConfigError

        raise ConfigError("KL geometry is measured for routed slim verifiers; an independent model has no mask")
    texts = calibration_texts(calib, int(cfg.search.n_calibration), int(cfg.seed))
    out = kl_geometry(pair, plan.spec(), texts, int(cfg.search.seq_len), int(cfg.search.batch_size),
                      float(cfg.search.get("memo_mib", 1024)), float(cfg.search.get("stat_mib", 64)))
    out.update({"layers": plan.spec(), "mask": desc, "method": "kl_geometry", "pair": pair.name,
                "task": "+".join(calib), "keep_ratio": slim_cfg.keep_ratio})
    print(json.dumps(out, indent=2))
    run_dir = RunStore(cfg.tracking.store_dir).open(run_id_for(resolved), resolved)
    run_dir.finish(out)
    return out
