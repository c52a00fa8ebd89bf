"""``python -m experiments.run [pair=…] [method=…] [task=…] [+exp=NAME]`` — the main entry point.

Hydra composes ``conf/config.yaml``. With ``+exp=NAME`` the exp's grid is expanded, its
prerequisites are checked once, and every cell runs in turn (finished runs are skipped);
otherwise :func:`viasd.harness.runner.run` runs one configuration. ``dry_run=true`` prints what every
cell would load, read and need (:mod:`viasd.harness.dryrun`) and runs nothing. Every user-facing failure
is one line on stderr: configuration errors (exit status 2) and Ctrl-C (status 130, naming the
partial run folder, which stays unfinished and is redone by the next identical command).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from viasd.errors import ConfigError, RunInterrupted
from viasd.harness.dryrun import dry_run_main
from viasd.harness.grid import run_cell, run_exp


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        if cfg.get("dry_run"):
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
    except RunInterrupted as e:
        print(e, file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("interrupted before a run folder was opened; nothing was written", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C while Hydra composes the config
        print("interrupted before a run folder was opened; nothing was written", file=sys.stderr)
        sys.exit(130)
