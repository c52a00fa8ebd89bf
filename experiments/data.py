"""``python -m experiments.data fetch [task …]`` — write the tasks' offline files from the hub.

For air-gapped machines: run ``fetch`` where the Hugging Face hub is reachable, then copy the
folder. Each task's pinned hub dataset (``conf/task/<name>.yaml``, ``hub``) is read through the
same code path as ``task.source=hub``, its rows are mapped to the offline schema, and the file
is written to ``<out>/<offline_file>`` (default ``out``: ``VIASD_DATA_DIR``, else
``../shared/data``), where ``task.source=auto`` then finds it. ``fetch`` alone writes every task
(the paper's five task kinds and more); ``fetch --exp NAME [--scale S]`` the tasks an exp grid reads
(``+exp=NAME scale=S``). ``--hub-root DIR`` reads a local mirror of the hub layout instead of ``hf://``. ``python -m experiments.data list`` prints each
task's source, dataset and file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from viasd.errors import ConfigError
from viasd.paths import default_data_dir
from viasd.tasks import build_task
from viasd.tasks.families import HUB
from viasd.utils.fs import atomic_write_text

__all__ = ["fetch", "main"]


def fetch(task_name: str, out: Path, hub_root: str | None = None) -> Path:
    """Write ``task_name``'s hub rows (offline schema, one JSON object a line) under ``out``; returns the file."""
    if task_name not in HUB:
        raise ConfigError(f"task {task_name!r} has no hub dataset to fetch; fetchable: {', '.join(HUB)}")
    task = build_task({"name": task_name, "source": "hub", "hub_root": hub_root})
    rows = [task.offline_row(i, r) for i, r in enumerate(task.load_rows())]
    dest = out / str(task.cfg["offline_file"])
    atomic_write_text(dest, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows))
    return dest


def exp_tasks(exp: str, scale: str | None = None) -> list[str]:
    """The fetchable tasks the cells of ``+exp=<exp> [scale=<scale>]`` read, in first-use order."""
    from viasd.harness.grid import exp_cells

    cells = exp_cells([f"+exp={exp}", *([f"scale={scale}"] if scale else [])])
    names = [str(OmegaConf.select(cfg, "task.name")) for _, cfg in cells]
    return [n for n in dict.fromkeys(names) if n in HUB]


def main(argv: list[str] | None = None) -> int:
    """Command line entry; returns the exit status (2 on a configuration error)."""
    ap = argparse.ArgumentParser(prog="python -m experiments.data", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="write the offline files of TASKs (default: all) from the hub")
    f.add_argument("tasks", nargs="*", help=f"tasks to fetch (default: all of {', '.join(HUB)})")
    f.add_argument("--out", type=Path, default=None, help="data folder (default: VIASD_DATA_DIR or ../shared/data)")
    f.add_argument("--exp", default=None, help="fetch the tasks this exp grid reads (conf/exp/NAME.yaml)")
    f.add_argument("--scale", default=None, help="with --exp: the grid's scale (default: the exp's)")
    f.add_argument("--hub-root", default=None, help="a local mirror of the hub layout instead of hf://")
    sub.add_parser("list", help="each task's hub dataset, revision and offline file")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            for name, h in HUB.items():
                task = build_task({"name": name})
                print(f"{name:<11} {h['path']}@{h['revision']} [{h['name']}/{h['split']}] "
                      f"-> {task.cfg['offline_file']} (reads: {task.source()})")
            return 0
        out = (args.out or default_data_dir()).expanduser()
        if args.exp and args.tasks:
            raise ConfigError("name tasks or --exp NAME, not both")
        names = exp_tasks(args.exp, args.scale) if args.exp else (args.tasks or list(HUB))
        if args.exp:
            print(f"exp {args.exp}: tasks {', '.join(names) or 'none to fetch'}")
        for name in names:
            dest = fetch(name, out, args.hub_root)
            n = sum(1 for _ in dest.open(encoding="utf-8"))
            print(f"{name}: {n} rows -> {dest}")
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
