"""DIMR-search and KL-geometry runs: offline measurements of a pair, kept in the run store.

:func:`run_search` (``python -m experiments.search``, ``exp.entry: search``) searches a routing mask
and logs its trials; :func:`run_kl` (``python -m experiments.kl``, ``exp.entry: kl``) measures the
KL geometry of a slim verifier. Both go through the store like decoding runs
(:mod:`viasd.harness.runner`): a finished run that proves itself is returned, otherwise the run is
computed under its lock (a second process waits, naming the holder) and written with its summary last.
A search logs each trial to its folder as it is evaluated, so an interrupted search resumes from the
trials it finished (the same command; ``python -m experiments.store stash`` carries them to another machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from viasd.config import to_dataclass
from viasd.dimr.masks import published_mask_path, resolve_plan
from viasd.errors import ConfigError
from viasd.harness.identity import _prepare, cached_pair, identity
from viasd.harness.prereq import require_mask
from viasd.harness.runner import claim, set_aside_invalid
from viasd.paths import results_dir
from viasd.tracking.store import RunStore, file_sha256, run_id_for
from viasd.tracking.wandb_logger import WandbLogger, labels_for
from viasd.utils.fs import jsonable


def _store_run(cfg: DictConfig, resolved: dict[str, Any], compute, reuse=lambda summary: True) -> dict[str, Any]:
    """A DIMR-search or KL run through the store: a finished one (``reuse(summary)``) is returned;
    else, under its lock, the folder is opened with the records an interrupted attempt left and
    ``compute(resumed, run_dir)`` gives ``(records, summary, after)``: ``records`` are the run's records
    (``compute`` may log them to ``run_dir`` as they come; the folder is rewritten where it holds
    others), then the summary is written and ``after(summary, folder)`` runs."""
    store, run_id = RunStore(cfg.tracking.store_dir), run_id_for(resolved)

    def finished() -> dict[str, Any] | None:
        found = store.find(run_id) if cfg.tracking.get("skip_finished", True) else None
        if found is not None and reuse(found["summary"]):
            print(f"[viasd] {run_id}: already finished in {found['path']}, skipping")
            return found["summary"]
        return None

    if (done := finished()) is not None:
        return done
    lock = store.lock(run_id)
    claim(store, lock, run_id, wait=True)
    try:
        if (done := finished()) is not None:
            return done
        set_aside_invalid(store, run_id)
        resumed = store.partial_examples(run_id)
        run_dir = store.open(run_id, resolved, resume=resumed)
        records, summary, after = compute(resumed, run_dir)
        if run_dir.records != [jsonable(r) for r in records]:
            run_dir.rewrite(records)
        summary = run_dir.finish({**summary, "run_id": run_id})
    finally:
        lock.release()
        store.drop_if_empty(run_id)
    after(summary, run_dir.path)
    return summary


def run_search(cfg: DictConfig) -> dict[str, Any]:
    """DIMR search for ``cfg.pair`` at ``cfg.search``; logs trials and the mask as a run."""
    from viasd.dimr.search import SearchConfig, search_mask

    _prepare(cfg)
    scfg = to_dataclass(SearchConfig, cfg.search)
    scfg.validate()
    resolved = identity(cfg, "search")
    if (published := _published_search(run_id_for(resolved), scfg)) is not None:
        return published

    def compute(resumed: list[dict[str, Any]], run_dir):
        pair = cached_pair(OmegaConf.merge(cfg.pair, {"dtype": scfg.dtype}))
        wb = WandbLogger(cfg.tracking, resolved, run_id_for(resolved), **labels_for(resolved))
        to_wandb, seen = wb.trial_logger(), [0]

        def on_trial(trial: dict[str, Any]) -> None:  # to W&B as they run; to the folder past the resumed ones
            to_wandb(trial)
            seen[0] += 1
            if seen[0] > len(resumed):
                run_dir.log_example(trial)

        if resumed:
            print(f"[viasd] {run_id_for(resolved)}: resuming the search after {len(resumed)} trials an "
                  f"interrupted attempt finished")
        art = search_mask(pair, scfg, on_trial=on_trial, store_dir=cfg.tracking.store_dir, resume=resumed)
        rnd = art["baselines"]["random"]
        print(f"\nDIMR {art['pair']}: keep {art['keep_ratio']} = {art['budget']}/{art['n_layers']} layers' parameters "
              f"({art['space']}, {art['objective']}), {art['n_trials']} trials in {art['search_seconds']:.0f}s")
        rows = [("searched", art), *((name, art["baselines"][name]) for name in ("first_k", "every_other"))]
        rows += [(f"held-out {name}", h) for name, h in (art.get("held_out") or {}).items() if isinstance(h, dict)]
        for name, b in rows:
            print(f"  {name:<21} {b['layers']}  KL(q||q')={b['kl_q_slim']:.4f}  top1={b['top1_agreement']:.3f}  "
                  f"conf.top1={b['confident_top1']:.3f} (share {b['confident_share']:.2f})  "
                  f"params {b['param_fraction']:.3f}")
        if rnd:
            kls = sorted(r["kl_q_slim"] for r in rnd)
            print(f"  random x{len(rnd)}   KL(q||q') min={kls[0]:.4f} median={kls[len(kls) // 2]:.4f}")
        print(f"mask written to {art['path']}")
        summary = {k: v for k, v in art.items() if k not in ("trials", "config")}
        summary.update({"method": "dimr_search", "task": "calibration", "n_examples": art["n_trials"],
                        "mask_sha256": file_sha256(Path(art["path"]))})

        def after(summary: dict[str, Any], folder: Path) -> None:
            wb.log_artifact(Path(art["path"]), f"mask-{pair.name}-keep{scfg.keep_ratio:.2f}", "dimr_mask")
            wb.log_run(summary, folder)
            wb.finish()

        return art["trials"], summary, after

    return _store_run(cfg, resolved, compute, reuse=lambda s: Path(s.get("path", "")).is_file())


def _published_search(run_id: str, scfg) -> dict[str, Any] | None:
    """The summary of search ``run_id`` when the results store has it finished and its mask published
    (the same bytes: :mod:`viasd.dimr.publish`), so a fresh clone does not search again; else None."""
    found = RunStore(results_dir()).find(run_id) if results_dir().is_dir() and not scfg.out else None
    if found is None:
        return None
    s = found["summary"]
    path = published_mask_path(str(s.get("pair")), scfg.keep_ratio, scfg.objective, scfg.space)
    if not path.is_file() or file_sha256(path) != s.get("mask_sha256"):
        return None
    print(f"[viasd] {run_id}: finished in the results store ({found['path']}), its mask published at {path}: skipping")
    return {**s, "path": str(path)}


def run_kl(cfg: DictConfig) -> dict[str, Any]:
    """KL geometry of ``cfg.pair`` and its slim verifier (``cfg.method.slim``) on calibration text."""
    from viasd.dimr.calibration import calibration_texts
    from viasd.dimr.search import kl_geometry
    from viasd.methods.via_sd import SlimConfig

    _prepare(cfg)
    slim_node = OmegaConf.to_container(cfg.method, resolve=True).get("slim", {}) if "method" in cfg else {}
    slim_cfg = to_dataclass(SlimConfig, slim_node)
    calib = list(cfg.search.calibration)
    require_mask(cfg)

    def compute(resumed: list[dict[str, Any]], run_dir):
        pair = cached_pair(OmegaConf.merge(cfg.pair, {"dtype": cfg.search.get("dtype", "float32")}))
        _, plan, desc = resolve_plan(pair, slim_cfg)
        if plan is None:
            raise ConfigError("KL geometry is measured for routed slim verifiers; an independent model has no mask")
        texts = calibration_texts(calib, int(cfg.search.n_calibration), int(cfg.seed))
        out = kl_geometry(pair, plan.spec(), texts, int(cfg.search.seq_len), int(cfg.search.batch_size),
                          float(cfg.search.get("memo_mib", 1024)), float(cfg.search.get("stat_mib", 64)))
        out.update({"layers": plan.spec(), "mask": desc, "method": "kl_geometry", "pair": pair.name,
                    "task": "+".join(calib), "keep_ratio": slim_cfg.keep_ratio})
        print(json.dumps(out, indent=2))
        return [], out, lambda summary, folder: None

    return _store_run(cfg, resolved=identity(cfg, "kl"), compute=compute)
