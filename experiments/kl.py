"""``python -m experiments.kl pair=… method=viasd method.slim.mask=auto [search.calibration=[xsum]]``

Measures the KL geometry of a pair and its slim verifier on calibration text: KL(p‖q),
KL(p‖q'), KL(q'‖q), KL(q‖q'), the TV distances and the Pythagorean gap
``KL(p‖q) − (KL(p‖q') + KL(q'‖q))``; prints them and logs a run (feeds ``fig_kl``).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from viasd.errors import one_line_errors
from viasd.harness.cli import check_argv
from viasd.harness.dimr_runs import run_kl


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    with one_line_errors():
        run_kl(cfg)


if __name__ == "__main__":
    check_argv()  # config typos and wrong types: one line, before Hydra
    main()
