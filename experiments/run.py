"""``python -m experiments.run [pair=…] [method=…] [task=…] [+exp=NAME [scale=…]]`` — the main entry point.

Hydra composes ``conf/config.yaml``. An exp (``+exp=NAME``) is a Hydra multirun: its
``hydra.sweeper.params`` and its scale's expand into cells, each one job of this function; the
grid callback (:mod:`viasd.harness.grid`) checks prerequisites once first and sums up at the
end (finished runs are skipped). Otherwise :func:`viasd.harness.runner.run` runs one
configuration. ``dry_run=true`` prints what every cell would load, read and need
(:mod:`viasd.harness.dryrun`) and runs nothing. Every user-facing failure is one line on stderr:
the command line itself, checked before Hydra composes it (:mod:`viasd.harness.cli`: a config
group typo gets "Did you mean", a value of the wrong type names its key), configuration errors
(exit status 2; in a grid the cell is reported and the others still run) and Ctrl-C (status
130, naming the partial run folder, which stays unfinished and is redone by the next identical
command). ``exp.scale=S`` is accepted as the old spelling of ``scale=S``.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from viasd.errors import ConfigError, RunInterrupted
from viasd.harness.cli import check_argv
from viasd.harness.dryrun import dry_run_main
from viasd.harness.grid import cell_label, run_cell


def _cell(cfg: DictConfig) -> dict[str, Any]:
    """One job of a multirun: a failure is reported and returned, so the other cells still run."""
    try:
        return run_cell(cfg)
    except ConfigError as e:
        print(f"error in {cell_label(cfg)}: {e}", file=sys.stderr)
    except Exception:  # one failing cell never stops the grid
        traceback.print_exc()
    return {"failed": cell_label(cfg)}


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    try:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            return _cell(cfg)
        if cfg.get("dry_run"):
            dry_run_main(cfg)
            return None
        return run_cell(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except RunInterrupted as e:
        print(f"\n{e}", file=sys.stderr)  # on a line of its own, after a progress bar the interrupt cut short
        sys.exit(130)
    except KeyboardInterrupt:
        print("interrupted before a run folder was opened; nothing was written", file=sys.stderr)
        sys.exit(130)


def old_spelling(argv: list[str]) -> list[str]:
    """``exp.scale=S`` (the spelling before scales became a config group) as ``scale=S``."""
    return [("scale=" + a.split("=", 1)[1]) if a.startswith("exp.scale=") else a for a in argv]


if __name__ == "__main__":
    sys.argv = old_spelling(sys.argv)
    check_argv()  # config typos and wrong types: one line, before Hydra composes anything
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C while Hydra composes the config, or a grid's launcher waits for its cells
        print("interrupted: finished runs are kept; an unfinished one is resumed by the next identical command",
              file=sys.stderr)
        sys.exit(130)
