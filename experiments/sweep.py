"""``python -m experiments.sweep table2 [--scale paper] [--slurm]`` — print an exp as a ``-m`` sweep.

``+exp=NAME`` runs a grid in one process; on a cluster, the same grid runs as one job per cell
through Hydra's multirun and the SLURM launcher (``hydra-submitit-launcher``). This prints that
command (finished cells are still skipped: every job checks the run store first).
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    from viasd.harness.grid import exp_names, sweep_command

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("exp", choices=exp_names())
    ap.add_argument("--scale", default="local", choices=["local", "paper", "smoke"])
    ap.add_argument("--slurm", action="store_true", help="use the viasd_slurm launcher")
    ap.add_argument("--launcher", default=None, help="any hydra/launcher config name")
    args = ap.parse_args(argv)
    print(sweep_command(args.exp, args.scale, args.launcher or ("viasd_slurm" if args.slurm else None)))


if __name__ == "__main__":
    main()
