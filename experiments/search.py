"""``python -m experiments.search pair=… search.keep_ratio=0.5 [search.objective=kl|pythagorean]``

Runs the DIMR mask search for one pair and budget, writes the mask artifact to the cache (which
``method.slim.mask=auto`` picks up) and to the run store, and prints the searched mask next to
the baselines (first_k, every_other, random masks of the same budget).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from viasd.errors import one_line_errors
from viasd.harness.cli import check_argv
from viasd.harness.dimr_runs import run_search


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    with one_line_errors():
        run_search(cfg)


if __name__ == "__main__":
    check_argv()  # config typos and wrong types: one line, before Hydra
    main()
