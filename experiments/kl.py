"""``python -m experiments.kl pair=… method=viasd method.slim.mask=auto [search.calibration=[xsum]]``

Measures the KL geometry of a pair and its slim verifier on calibration text: KL(p‖q),
KL(p‖q'), KL(q'‖q), KL(q‖q') and the TV distances, and the Pythagorean gap
``KL(p‖q) − (KL(p‖q') + KL(q'‖q))``. Prints them and writes a run to the run store (fig_kl).
"""

from __future__ import annotations

import json
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from viasd.errors import ConfigError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    import torch
    import transformers

    from viasd.config import to_dataclass
    from viasd.decoding.methods.viasd import SlimConfig
    from viasd.dimr.masks import resolve_plan
    from viasd.dimr.search import calibration_texts, kl_geometry
    from viasd.models.pairs import load_pair
    from viasd.tracking.store import RunStore, run_id_for

    transformers.logging.set_verbosity_error()
    try:
        if cfg.get("threads"):
            torch.set_num_threads(int(cfg.threads))
        pair = load_pair(cfg.pair)
        slim_cfg = to_dataclass(SlimConfig, OmegaConf.to_container(cfg.method.get("slim", {}), resolve=True))
        model, plan, desc = resolve_plan(pair, slim_cfg)
        if plan is None:
            raise ConfigError("experiments.kl measures routed slim verifiers; an independent model has no mask")
        texts = calibration_texts(list(cfg.search.calibration), int(cfg.search.n_calibration), int(cfg.seed))
        out = kl_geometry(pair, list(plan.layers), texts, int(cfg.search.seq_len), int(cfg.search.batch_size))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    out.update({"layers": list(plan.layers), "mask": desc, "method": "kl_geometry", "pair": pair.name,
                "task": "+".join(cfg.search.calibration)})
    print(json.dumps(out, indent=2))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["task"] = {"name": out["task"]}
    resolved["method"] = {"name": "kl_geometry", "slim": resolved["method"].get("slim")}
    run = RunStore(cfg.tracking.store_dir).open(run_id_for(resolved), resolved)
    run.finish(out)


if __name__ == "__main__":
    main()
