"""``python -m experiments.report [--scale local|paper|smoke] [--only table2 fig_tiers] [--out paper_figures]``

Rebuilds every table (Markdown + LaTeX) and figure (PNG + PDF) from the local run store
(``VIASD_RUNS_DIR``, default ``./runs``) into ``paper_figures/``. With ``--wandb ENTITY/PROJECT``
it first pulls finished runs' summaries from W&B into the store.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="local", choices=["local", "paper", "smoke"])
    ap.add_argument("--only", nargs="*", default=None, help="report names (default: all)")
    ap.add_argument("--out", default="paper_figures")
    ap.add_argument("--runs", default=None, help="run store folder (default: $VIASD_RUNS_DIR or ./runs)")
    ap.add_argument("--override", nargs="*", default=[], help="Hydra overrides the exps were run with")
    args = ap.parse_args(argv)

    from viasd.errors import ConfigError
    from viasd.paths import runs_dir
    from viasd.report.build import build_all
    from viasd.tracking.store import RunStore

    store = RunStore(args.runs or runs_dir())
    try:
        res = build_all(Path(args.out), store, args.scale, args.only, args.override)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, paths in res.items():
        print(f"{name:<16} {paths if isinstance(paths, str) else ', '.join(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
