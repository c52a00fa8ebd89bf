"""``python -m experiments.run [pair=…] [method=…] [task=…] [+exp=…]`` — the main entry point.

Hydra composes ``conf/config.yaml``; :func:`viasd.runner.run` does the work. Configuration
errors print one line naming the fix and exit with status 2.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from viasd.errors import ConfigError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from viasd.runner import run

    try:
        run(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
