"""``python -m experiments.search pair=… search.keep_ratio=0.5 [search.objective=kl|pythagorean]``

Runs the DIMR mask search for one pair and budget, writes the mask artifact to the cache (which
``method.slim.mask=auto`` picks up) and to the run store, and prints the searched mask next to
the baselines (first_k, every_other, random masks of the same budget).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from viasd.errors import ConfigError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    import torch
    import transformers

    from viasd.config import to_dataclass
    from viasd.dimr.search import SearchConfig, search_mask
    from viasd.models.pairs import load_pair
    from viasd.tracking.store import RunStore, run_id_for

    transformers.logging.set_verbosity_error()
    try:
        if cfg.get("threads"):
            torch.set_num_threads(int(cfg.threads))
        scfg = to_dataclass(SearchConfig, cfg.search)
        scfg.validate()
        pair = load_pair(cfg.pair)
        art = search_mask(pair, scfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    rnd = art["baselines"]["random"]
    print(f"\nDIMR {art['pair']}: keep {art['budget']}/{art['n_layers']} layers ({art['objective']}), "
          f"{art['n_trials']} trials in {art['search_seconds']:.0f}s")
    print(f"  searched     {art['layers']}  KL(q||q')={art['kl_q_slim']:.4f}  top1={art['top1_agreement']:.3f}")
    for name in ("first_k", "every_other"):
        b = art["baselines"][name]
        print(f"  {name:<12} {b['layers']}  KL(q||q')={b['kl_q_slim']:.4f}  top1={b['top1_agreement']:.3f}")
    if rnd:
        kls = sorted(r["kl_q_slim"] for r in rnd)
        print(f"  random x{len(rnd)}   KL(q||q') min={kls[0]:.4f} median={kls[len(kls) // 2]:.4f}")
    print(f"mask written to {art['path']}")
    # The search is a run too: keep it in the run store for table1 / fig_dimr.
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["method"] = {"name": "dimr_search"}
    resolved["task"] = {"name": "calibration"}
    store = RunStore(cfg.tracking.store_dir)
    run = store.open(run_id_for(resolved), resolved)
    for t in art["trials"]:
        run.log_example(t)
    summary = {k: v for k, v in art.items() if k not in ("trials", "config")}
    summary.update({"method": "dimr_search", "task": "calibration"})
    run.finish(summary)


if __name__ == "__main__":
    main()
