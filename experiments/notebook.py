"""``python -m experiments.notebook [NOTEBOOK] [--scale local|smoke|cpu-large|paper] [--out DIR] [--timeout S]``
— execute a notebook of ``notebooks/`` headless (default ``notebooks/ablations.ipynb``; ``make notebook``).

The notebook reads your run store and the committed results store (``results/runs/``), so in a fresh
clone it plots the committed runs; its figures and the executed copy (``<name>.ipynb``, outputs inline)
go to ``--out`` (default ``<your run store>/_notebooks/<scale>/``, never a tracked file). Runs the
kernel of this interpreter (``nbclient``, a dev dependency: ``pip install -e '.[dev]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from viasd.paths import PROJECT_ROOT, runs_dir

__all__ = ["execute", "main"]

DEFAULT = PROJECT_ROOT / "notebooks" / "ablations.ipynb"


def execute(path: Path, scale: str, out: Path, timeout: int = 600) -> tuple[Path, list[str], int]:
    """Execute ``path`` with ``VIASD_NOTEBOOK_SCALE=scale`` / ``VIASD_NOTEBOOK_OUT=out`` and write the executed
    copy to ``out/<name>``; returns ``(that copy, the PNG figures under out, inline images)``."""
    import nbformat
    from nbclient import NotebookClient

    os.environ["VIASD_NOTEBOOK_SCALE"] = scale
    os.environ["VIASD_NOTEBOOK_OUT"] = str(out)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(PROJECT_ROOT)}}).execute()
    out.mkdir(parents=True, exist_ok=True)
    copy = out / path.name
    nbformat.write(nb, copy)
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    return copy, sorted(p.name for p in out.glob("*.png")), images


def main(argv: list[str] | None = None) -> int:
    """Command line entry; returns the exit status (2 on bad input, 1 when a cell fails)."""
    ap = argparse.ArgumentParser(prog="python -m experiments.notebook", description=__doc__.split("\n")[2].lstrip("— "))
    ap.add_argument("notebook", nargs="?", type=Path, default=DEFAULT, help="the notebook (default: %(default)s)")
    ap.add_argument("--scale", default=os.environ.get("VIASD_NOTEBOOK_SCALE", "local"),
                    choices=["local", "smoke", "cpu-large", "paper"], help="the grids' scale (default: local)")
    ap.add_argument("--out", type=Path, default=None, help="figures and the executed copy "
                                                          "(default: <run store>/_notebooks/<scale>/)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell (default: 600)")
    args = ap.parse_args(argv)
    if not args.notebook.is_file():
        print(f"error: no notebook {args.notebook}; the shipped ones: "
              f"{', '.join(p.name for p in sorted((PROJECT_ROOT / 'notebooks').glob('*.ipynb')))}", file=sys.stderr)
        return 2
    try:
        import nbclient  # noqa: F401
    except ImportError:
        print("error: nbclient is not installed; install the dev extras: pip install -e '.[dev]' (or `make notebook`)",
              file=sys.stderr)
        return 2
    out = args.out or runs_dir() / "_notebooks" / args.scale
    t0 = time.perf_counter()
    try:
        copy, figures, images = execute(args.notebook.resolve(), args.scale, out.resolve(), args.timeout)
    except Exception as e:  # nbclient's CellExecutionError: the cell's traceback is long; its last line says it
        last = next((ln for ln in reversed(str(e).strip().splitlines()) if ln.strip()), type(e).__name__)
        print(f"error: {args.notebook.name} failed in a cell: {last}", file=sys.stderr)
        return 1
    print(f"{args.notebook.name}: executed in {time.perf_counter() - t0:.0f} s, {images} inline plots; figures: "
          f"{', '.join(figures) or 'none (no finished runs at this scale)'}\nexecuted copy: {copy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
