"""The SLURM job size of a planned cell: GPUs of one node, host memory, and whether a node holds it.

One knob sizes both the dry run's per-pair summary and what ``hydra/launcher=viasd_slurm`` submits:
``hydra.launcher.gpu_gib`` (GiB of one GPU of the partition) with ``hydra.launcher.node_gpus`` (GPUs
of one node; a job never spans more) — :func:`slurm_node`. :func:`job_resources` turns a cell's
planned memory into ``gpus_per_node``/``mem_gb``, :func:`node_problem` says when no node holds it, and
:func:`pair_summary` closes a dry run with one line per pair. The plans come from
:mod:`viasd.harness.dryrun`.
"""

from __future__ import annotations

import math
from typing import Any

from viasd.errors import ConfigError

SLURM_GPU_GIB = 80.0  # GiB per GPU a SLURM job is sized for (hydra.launcher.gpu_gib of viasd_slurm)
NODE_GPUS = 8  # GPUs of one node: a job never spans more (hydra.launcher.node_gpus of viasd_slurm)


def slurm_node(launcher: Any = None) -> tuple[float, int]:
    """``(gpu_gib, node_gpus)`` the cells' SLURM jobs are sized for: ``hydra.launcher.gpu_gib`` and
    ``hydra.launcher.node_gpus`` of ``launcher`` (the composed ``hydra.launcher`` node; None: this
    process's Hydra config when it has one) where it sets them (``viasd_slurm``), else
    :data:`SLURM_GPU_GIB` and :data:`NODE_GPUS` — the same sizes the launcher submits, whatever GPUs
    are visible here. A value that is not a positive number is one ConfigError line naming its key."""
    if launcher is None:
        from hydra.core.hydra_config import HydraConfig

        launcher = HydraConfig.get().launcher if HydraConfig.initialized() else {}
    gpu_gib, node_gpus = launcher.get("gpu_gib", SLURM_GPU_GIB), launcher.get("node_gpus", NODE_GPUS)
    try:
        gpu_gib = float(gpu_gib)
    except (TypeError, ValueError):
        gpu_gib = math.nan
    if not (math.isfinite(gpu_gib) and gpu_gib > 0):
        raise ConfigError(f"hydra.launcher.gpu_gib={launcher.get('gpu_gib')!r}: give the GiB of one GPU of your "
                          "partition, a positive number (e.g. hydra.launcher.gpu_gib=80)")
    if isinstance(node_gpus, bool) or not isinstance(node_gpus, int) or node_gpus < 1:
        raise ConfigError(f"hydra.launcher.node_gpus={node_gpus!r}: give the GPUs of one node of your partition, "
                          "a whole number >= 1 (e.g. hydra.launcher.node_gpus=8)")
    return gpu_gib, node_gpus


def job_resources(need_gib: float, gpu_gib: float = SLURM_GPU_GIB) -> dict[str, int]:
    """The SLURM resources of a cell that needs ``need_gib`` GiB of GPU memory on GPUs of ``gpu_gib``:
    ``gpus_per_node`` (enough GPUs to hold it, at least 1; :func:`node_problem` says whether a node
    has that many) and ``mem_gb`` (host memory to stage the weights: the cell's size, at least 16
    GB) — the ``hydra.launcher.*`` keys of ``viasd_slurm``."""
    if not (math.isfinite(gpu_gib) and gpu_gib > 0):
        raise ConfigError(f"GPU memory must be a positive number of GiB, got {gpu_gib}; "
                          "set hydra.launcher.gpu_gib=80 (GiB per GPU)")
    return {"gpus_per_node": max(1, math.ceil(need_gib / gpu_gib)), "mem_gb": max(16, math.ceil(need_gib))}


def node_problem(need_gib: float, gpu_gib: float = SLURM_GPU_GIB, node_gpus: int = NODE_GPUS) -> str | None:
    """Why no node of ``node_gpus`` GPUs of ``gpu_gib`` GiB holds a cell needing ``need_gib`` GiB
    (None: one does)."""
    gpus = job_resources(need_gib, gpu_gib)["gpus_per_node"]
    if gpus <= node_gpus:
        return None
    return (f"needs ~{need_gib:.0f} GiB: {gpus} GPUs of {gpu_gib:g} GiB, more than a node's {node_gpus} "
            "(hydra.launcher.node_gpus); size for larger GPUs (hydra.launcher.gpu_gib) or larger nodes")


def pair_summary(plans: list[Any], gpu_gib: float = SLURM_GPU_GIB, node_gpus: int = NODE_GPUS) -> list[str]:
    """One line per pair (in plan order) of the dry run's plans (:class:`viasd.harness.dryrun.CellPlan`):
    how many of its cells fit and how many do not, the
    largest memory a cell of it needs, and the SLURM job that holds it (:func:`job_resources`), or
    that no node of ``node_gpus`` GPUs does (:func:`node_problem`)."""
    by_pair: dict[str, list[Any]] = {}
    for p in plans:
        by_pair.setdefault(p.label.split("/", 1)[0], []).append(p)
    lines = []
    for name, ps in by_pair.items():
        bad = [p for p in ps if p.misfit]
        peak = max(p.need_gib for p in ps)
        verdict = f"DOES NOT FIT ({len(bad)}/{len(ps)} cells)" if bad else f"fits ({len(ps)} cells)"
        res = " ".join(f"hydra.launcher.{k}={v}" for k, v in job_resources(peak, gpu_gib).items())
        over = node_problem(peak, gpu_gib, node_gpus)
        slurm = f"NO NODE HOLDS IT: {over}" if over else res
        lines.append(f"{name}: {verdict}; largest cell ~{peak:.1f} GiB; SLURM on {gpu_gib:g} GiB GPUs "
                     f"(hydra.launcher.gpu_gib): {slurm}")
    return lines
