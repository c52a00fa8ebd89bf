"""What the cells of a grid need before the first one starts, decided once from their configs.

* **The slim verifier's mask** of every cell that routes one (``via_sd`` runs, KL cells; each verifier of a
  ``method.verifiers`` hierarchy): :func:`cell_mask_sources` says where it comes from (searched artifact, shipped layer list,
  the pair's named fallback, an explicit ablation or layer list, a mask file) without loading
  anything. ``mask: auto`` with none of those is a *search to run*: the grid stops before its
  first cell with the command that searches the mask (at ``scale=paper``, that pair's
  ``table1`` cell) rather than decode with a slim verifier nobody asked for.
* **Every task's** ``preflight()`` (the code tasks' sandbox check), called once per distinct
  task config (:func:`task_preflights`).
* **What a decode would refuse once its pair is loaded**, decided from the config alone
  (:func:`decode_refusal`): ``method.gate=oracle`` (replay only), a learned gate file that does
  not load or was trained for another pair, ``+pair.compile=true`` with a routed stream (a slim
  verifier or a self drafter). The runner raises it before a run folder exists
  (:func:`require_decodable`); the dry run marks the cell and the grid stops on it before its
  first cell.

Why the grid stops instead of running the search as a first cell: a search is a job of its
own (paper scale: 18–68 min and the target's full memory per pair and budget), launchers
(joblib, SLURM) start a multirun's jobs in parallel with no order between them, and the search
already is a cached, logged, resumable grid (``+exp=table1``). The dry run prints the same
facts per cell; :func:`check_ready` raises them as one ConfigError line.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from viasd.config import to_dataclass
from viasd.dimr.masks import MaskSource, mask_source, no_mask_error
from viasd.errors import ConfigError
from viasd.methods.via_sd import SlimConfig
from viasd.methods.via_sd_verifiers import VerifierConfig
from viasd.models.pairs import store_name
from viasd.tasks import build_task

__all__ = ["Preflight", "cell_mask_sources", "cell_mask_source", "describe_masks", "require_mask", "missing_masks", "task_preflights", "not_ready",
           "check_ready", "decode_refusal", "require_decodable"]


def _slim_node(cfg: DictConfig) -> DictConfig | None:
    entry = OmegaConf.select(cfg, "exp.entry", default="run")
    if entry == "search":
        return None
    return OmegaConf.select(cfg, "method.slim", default=None)


def cell_mask_sources(cfg: DictConfig) -> list[tuple[str, SlimConfig, MaskSource]]:
    """``(config key, slim config, mask source)`` of every routed verifier of a composed cell, cheapest first:
    ``method.slim`` alone, or each entry ``method.verifiers[J]`` of a ``via_sd`` hierarchy (as
    :meth:`~viasd.methods.via_sd.VIASDConfig.slims` builds it); empty when the cell routes none."""
    node = _slim_node(cfg)
    if node is None:
        return []
    slim = to_dataclass(SlimConfig, OmegaConf.to_container(node, resolve=True), where="method.slim")
    slims = [("method.slim", slim)]
    verifiers = OmegaConf.select(cfg, "method.verifiers", default=None) or []
    if verifiers and OmegaConf.select(cfg, "exp.entry", default="run") == "run":  # a KL cell reads method.slim
        slims = [(f"method.verifiers[{j}]",
                  to_dataclass(VerifierConfig, OmegaConf.to_container(v, resolve=True), where=f"method.verifiers[{j}]")
                  .slim(float(slim.keep_ratio))) for j, v in enumerate(verifiers)]
    pair = OmegaConf.to_container(cfg.pair, resolve=True)
    name = store_name(pair)
    target_id = (pair.get("target") or {}).get("id")
    search_pair = f"hf pair.target.id={target_id}" if pair.get("name") == "hf" else name
    scale = OmegaConf.select(cfg, "exp.scale")
    return [(where, s, mask_source(name, pair.get("options"), s, scale, search_pair)) for where, s in slims]


def cell_mask_source(cfg: DictConfig) -> MaskSource | None:
    """Where a composed cell's slim-verifier mask comes from (None: the cell routes no slim verifier); of a
    hierarchy, the first verifier's mask that is still a search to run, else the cheapest verifier's
    (:func:`cell_mask_sources` has each)."""
    sources = [src for _, _, src in cell_mask_sources(cfg)]
    return next((s for s in sources if s.kind == "search"), sources[0] if sources else None)


def describe_masks(cfg: DictConfig) -> list[str]:
    """The dry run's "slim mask" lines of a cell: one (``method.slim``), or one per verifier of a hierarchy
    (``v1 (method.verifiers[0]): shipped layer list: ...``)."""
    sources = cell_mask_sources(cfg)
    if len(sources) == 1 and sources[0][0] == "method.slim":
        return [sources[0][2].describe()]
    return [f"v{j} ({where}): {src.describe()}" for j, (where, _, src) in enumerate(sources, 1)]


def require_mask(cfg: DictConfig) -> None:
    """Raise the one-line ConfigError naming the search command when a cell's ``mask: auto`` (any verifier's of a
    hierarchy) has nothing to read (called by the runner before any model is loaded)."""
    for where, slim, src in cell_mask_sources(cfg):
        if src.kind == "search":
            err = no_mask_error(store_name(OmegaConf.to_container(cfg.pair, resolve=True)), slim, src)
            raise err if where == "method.slim" else ConfigError(f"{where}: {err}")


def decode_refusal(cfg: DictConfig) -> str | None:
    """The one line a decoding cell would be refused with once its pair is loaded (None: none),
    decided without loading a model: ``method.gate=oracle`` (replay only), ``method.gate=learned``
    with a gate file that does not load (:func:`~viasd.engine.gate_file.load_gate`) or was
    trained for another pair (:meth:`~viasd.engine.gate_file.GateModel.check`; its slim layers
    are checked once the mask is read), ``+pair.compile=true`` with a stream the compiled forward
    cannot run (a slim verifier, a self drafter)."""
    if OmegaConf.select(cfg, "exp.entry", default="run") != "run":
        return None
    gate = OmegaConf.select(cfg, "method.gate", default=None)
    if gate == "oracle":
        return ("method.gate=oracle is replay-only (it reads the target's tokens from a trace): "
                "`python -m experiments.replay run=<ar run id> method=via_sd method.gate=oracle`")
    if gate == "learned":
        from viasd.engine.gate_file import load_gate

        try:
            model = load_gate(OmegaConf.select(cfg, "method.gate_path", default=None))
            model.check(str(cfg.pair.name), model.meta.get("layers"))  # the pair; the layers wait for the mask
        except ConfigError as e:
            return str(e)
    if OmegaConf.select(cfg, "pair.compile", default=False):
        routed = "a slim verifier" if _slim_node(cfg) is not None else \
            "a self drafter" if OmegaConf.select(cfg, "method.drafter.name", default=None) == "self" else None
        if routed:
            return (f"+pair.compile=true runs the model's own forward; method {cfg.method.name} routes it through "
                    f"{routed}: use ar, sd or cascade_sd, or set +pair.compile=false")
    return None


def require_decodable(cfg: DictConfig) -> None:
    """Raise :func:`decode_refusal` as one ConfigError line (the runner, before a run folder exists)."""
    why = decode_refusal(cfg)
    if why:
        raise ConfigError(why)


def missing_masks(cells: list[DictConfig]) -> dict[str, int]:
    """``{search command: cells waiting for it}`` of the cells whose ``mask: auto`` has nothing to read."""
    need: dict[str, int] = {}
    for cfg in cells:
        for src in {src.detail: src for _, _, src in cell_mask_sources(cfg) if src.kind == "search"}.values():
            need[src.detail] = need.get(src.detail, 0) + 1
    return need


@dataclass
class Preflight:
    """One distinct task config's preflight: the tasks it covers, what it checked, or why it refused."""

    tasks: list[str]
    result: str | None = None
    error: str | None = None


def task_preflights(cells: list[DictConfig]) -> list[Preflight]:
    """``preflight()`` of every distinct task config of the decoding cells, once each."""
    seen: dict[str, Preflight] = {}
    for cfg in cells:
        if OmegaConf.select(cfg, "exp.entry", default="run") != "run":
            continue
        key = OmegaConf.to_yaml(cfg.task)
        if key in seen:
            continue
        task = build_task(cfg.task)
        check = Preflight([task.name])
        try:
            check.result = task.preflight()
        except ConfigError as e:
            check.error = str(e)
        seen[key] = check
    merged: dict[tuple, Preflight] = {}  # one line per outcome, naming every task it covers
    for check in seen.values():
        got = merged.setdefault((check.result, check.error), Preflight([], check.result, check.error))
        got.tasks += [t for t in check.tasks if t not in got.tasks]
    return list(merged.values())


def not_ready(cells: list[DictConfig], preflights: list[Preflight] | None = None) -> str | None:
    """The one-line reason the grid would stop before its first cell, or None when it can start."""
    problems = []
    for check in preflights if preflights is not None else task_preflights(cells):
        if check.error:
            problems.append(f"{', '.join(check.tasks)}: {check.error}")
    refused: dict[str, int] = {}
    for cfg in cells:
        why = decode_refusal(cfg)
        if why:
            refused[why] = refused.get(why, 0) + 1
    problems += [f"{n} cell(s) would be refused: {why}" for why, n in refused.items()]
    need = missing_masks(cells)
    if need:
        n = sum(need.values())
        cmds = "; ".join(f"`{c}`" for c in need)
        problems.append(f"{n} cell(s) use method.slim.mask=auto (or a verifier's) but no DIMR mask was searched for their pair and "
                        f"budget; search first: {cmds} (or ask for an ablation, e.g. method.slim.mask=every_other)")
    return " | ".join(problems) or None


def check_ready(cells: list[DictConfig]) -> None:
    """Raise one ConfigError line when a cell could not start: a missing DIMR mask, a refused
    preflight or a decode that would be refused (:func:`decode_refusal`)."""
    why = not_ready(cells)
    if why:
        raise ConfigError(why)
