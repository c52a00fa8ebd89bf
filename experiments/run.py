"""``python -m experiments.run [pair=…] [method=…] [task=…] [+exp=NAME]`` — the main entry point.

Hydra composes ``conf/config.yaml``. With ``+exp=NAME`` the exp's grid is expanded and every
cell runs in turn (finished runs are skipped); otherwise :func:`viasd.runner.run` runs one
configuration. ``dry_run=true`` prints what every cell would load, read and need
(:mod:`viasd.dryrun`) and runs nothing. Configuration errors print one line naming the fix and exit with status 2.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from viasd.errors import ConfigError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from viasd.experiments import run_cell, run_exp

    try:
        if cfg.get("dry_run"):
            from viasd.dryrun import dry_run_main

            dry_run_main(cfg, list(HydraConfig.get().overrides.task))
        elif cfg.get("exp") is not None:
            failures = run_exp(list(HydraConfig.get().overrides.task))
            if failures:
                sys.exit(1)
        else:
            run_cell(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
