"""Experiment grids: ``+exp=NAME`` expands an exp file into runs and executes them.

An exp file (``conf/exp/NAME.yaml``, ``# @package _global_``) holds only an ``exp`` node::

    exp:
      name: table2
      entry: run            # run | search | kl  (what each cell executes)
      scale: local          # local | paper | smoke
      grid: {method: [ar, sd], task: [xsum, gsm8k]}
      scales:
        local: {pair: [smollm2], task.n_examples: [20]}
        paper: {pair: [gemma2-2b-9b], task.n_examples: [null]}
        smoke: {pair: [tiny-llama], task.n_examples: [2]}

Cells are the Cartesian product of ``grid``, ``scales[scale]`` and the exp's ``seeds`` (or
``repeats: N`` = seeds 0…N−1, the axis ``seed``; a scale row's own ``seed`` list wins); each
cell is composed by Hydra from the command line's overrides plus the cell's, and run through
the same code as a single run. A command-line override of a key the exp also sets (e.g.
``generation.max_new_tokens=32`` or ``seed=3``) replaces that axis in every cell. Finished runs (same resolved config) are skipped, so a killed grid resumes where it
stopped; a failing cell is reported and the others still run.
"""

from __future__ import annotations

import itertools
import sys
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT

CONF_DIR = PROJECT_ROOT / "conf"


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def override_keys(overrides: list[str]) -> set[str]:
    """Config keys set by a list of Hydra overrides (``+``/``++``/``~`` prefixes stripped)."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}


def exp_axes(exp: dict, fixed: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """``{key: values}`` of an exp at its scale: grid, scale row and seeds, minus the ``fixed`` keys."""
    scale = exp.get("scale", "local")
    scales = exp.get("scales") or {}
    if scales and scale not in scales:
        raise ConfigError(f"exp {exp.get('name')!r} has no scale {scale!r}; choose one of {', '.join(scales)}")
    axes = {**(exp.get("grid") or {}), **(scales.get(scale) or {})}
    seeds = exp.get("seeds")
    if seeds is None and exp.get("repeats"):
        seeds = list(range(int(exp["repeats"])))
    if seeds is not None and "seed" not in axes:
        axes["seed"] = list(seeds)
    return {k: v for k, v in axes.items() if k not in fixed}


def cell_overrides(exp: DictConfig | dict, fixed: set[str] | frozenset[str] = frozenset()) -> list[list[str]]:
    """The override lists of every cell of an exp node (group choices before their fields).

    ``fixed``: keys set on the command line; their axes are dropped so the command line wins.
    """
    exp = OmegaConf.to_container(exp, resolve=True) if isinstance(exp, DictConfig) else exp
    axes = exp_axes(exp, fixed)
    keys = sorted(axes, key=lambda k: (k.count("."), list(axes).index(k)))
    values = [axes[k] if isinstance(axes[k], list) else [axes[k]] for k in keys]
    return [[f"{k}={_fmt(v)}" for k, v in zip(keys, combo)] for combo in itertools.product(*values)]


def compose_cells(base_overrides: list[str], exp_name: str | None = None, scale: str | None = None) -> list[DictConfig]:
    """Compose every cell of an exp with Hydra (inside or outside a Hydra app)."""
    return [cfg for _, cfg in compose_cells_with_overrides(base_overrides, exp_name, scale)]


def compose_cells_with_overrides(base_overrides: list[str], exp_name: str | None = None,
                                 scale: str | None = None) -> list[tuple[list[str], DictConfig]]:
    """``(cell overrides, composed config)`` of every cell of an exp (the overrides exclude the base)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    base = list(base_overrides)
    if exp_name is not None and not any(o.lstrip("+").startswith("exp=") for o in base):
        base.append(f"+exp={exp_name}")
    if scale is not None:
        base.append(f"exp.scale={scale}")

    def _do() -> list[tuple[list[str], DictConfig]]:
        top = compose(config_name="config", overrides=base)
        if "exp" not in top:
            raise ConfigError("no exp selected; use +exp=NAME")
        fixed = override_keys(base_overrides)
        return [(cell, compose(config_name="config", overrides=base + cell)) for cell in cell_overrides(top.exp, fixed)]

    if GlobalHydra.instance().is_initialized():
        return _do()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return _do()


def run_cell(cfg: DictConfig) -> dict[str, Any]:
    """Execute one composed cell according to ``exp.entry``."""
    entry = OmegaConf.select(cfg, "exp.entry", default="run")
    if entry == "run":
        from viasd.harness.runner import run

        return run(cfg)
    if entry == "search":
        from viasd.harness.runner import run_search

        return run_search(cfg)
    if entry == "kl":
        from viasd.harness.runner import run_kl

        return run_kl(cfg)
    raise ConfigError(f"unknown exp.entry {entry!r}; use run, search or kl")


def check_prerequisites(cells: list[DictConfig]) -> None:
    """Raise the first ConfigError any cell would hit before decoding: its method config (type
    and range checks) and its task's data (each distinct task config is loaded once)."""
    from viasd.methods.api import method_config
    from viasd.tasks import build_task

    seen: set[str] = set()
    for cfg in cells:
        if OmegaConf.select(cfg, "exp.entry", default="run") == "run":
            method_config(cfg.method.name, cfg.method)
        key = OmegaConf.to_yaml(cfg.task)
        if key not in seen:
            seen.add(key)
            build_task(cfg.task).examples()


def run_exp(base_overrides: list[str]) -> int:
    """Run every cell of the exp selected by ``base_overrides``; returns the number of failures.

    A missing prerequisite shared by the cells (see :func:`check_prerequisites`) raises one
    ConfigError before the first cell runs.
    """
    cells = compose_cells(base_overrides)
    name = cells[0].exp.name if cells else "?"
    check_prerequisites(cells)
    print(f"[viasd] exp {name}: {len(cells)} runs")
    if cells:
        exp = OmegaConf.to_container(cells[0].exp, resolve=True)
        for key in sorted(set(exp_axes(exp)) & override_keys(base_overrides)):
            print(f"[viasd] command line sets {key}; the exp's values for it are not used")
    failures = []
    for i, cfg in enumerate(cells):
        label = f"{cfg.pair.name}/{cfg.method.name}/{cfg.task.name}"
        print(f"[viasd] ({i + 1}/{len(cells)}) {label}")
        try:
            run_cell(cfg)
        except ConfigError as e:
            print(f"error in {label}: {e}", file=sys.stderr)
            failures.append(label)
        except Exception:  # one failing cell never stops the grid
            traceback.print_exc()
            failures.append(label)
    if failures:
        print(f"[viasd] exp {name}: {len(failures)} failed: {', '.join(failures)}", file=sys.stderr)
    else:
        print(f"[viasd] exp {name}: all {len(cells)} runs finished; build reports with `python -m experiments.report`")
    return len(failures)


def exp_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "exp").glob("*.yaml"))


def exp_file(name: str) -> Path:
    return CONF_DIR / "exp" / f"{name}.yaml"


def sweep_command(exp_name: str, scale: str = "local", launcher: str | None = None) -> str:
    """The equivalent ``python -m experiments.run -m …`` command of an exp grid.

    Each cell becomes one Hydra multirun job, so a launcher (e.g. ``viasd_slurm``) can send
    every cell to the cluster.
    """
    from omegaconf import OmegaConf

    exp = OmegaConf.load(exp_file(exp_name)).exp
    exp = OmegaConf.to_container(exp, resolve=True)
    exp["scale"] = scale
    axes = exp_axes(exp)
    keys = sorted(axes, key=lambda k: (k.count("."), list(axes).index(k)))
    parts = []
    for k in keys:
        vals = axes[k] if isinstance(axes[k], list) else [axes[k]]
        parts.append(f"'{k}=" + ",".join(_fmt(v) for v in vals) + "'")
    if launcher:
        parts.insert(0, f"hydra/launcher={launcher}")
    return "python -m experiments.run -m " + " ".join(parts)
