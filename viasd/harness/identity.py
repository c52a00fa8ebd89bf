"""What names a run: its identity config (resolved config plus the SHA-256 of every input file it
reads), the input files themselves, the slim mask a method resolves to, and the per-process
pair cache. :func:`identity` is what :func:`~viasd.tracking.ids.run_id_for` hashes into a run id
(``viasd.harness.runner`` runs it; reports, dry runs and the store recompute it without decoding).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from viasd.dimr.calibration import calibration_inputs
from viasd.dimr.masks import find_mask, resolve_plan
from viasd.distill.pair import DRAFT_PROMPTS, draft_prompts_identity
from viasd.harness.config import drop_unset, unpin_local_hub
from viasd.models.pairs import MASK_OPTIONS, store_name
from viasd.paths import data_dir
from viasd.tasks.loading import resolve_source
from viasd.tracking.store import file_sha256, run_id_for

_PAIRS: dict[str, Any] = {}


def cached_pair(pair_cfg: DictConfig):
    """Load a pair once per process (grids reuse it across cells)."""
    from viasd.models.pairs import load_pair

    key = json.dumps(OmegaConf.to_container(pair_cfg, resolve=True), sort_keys=True)
    if key not in _PAIRS:
        _PAIRS.clear()  # keep one pair in memory
        _PAIRS[key] = load_pair(pair_cfg)
    return _PAIRS[key]


_HASHES: dict[tuple[str, int, int], str] = {}


def _sha(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _HASHES:
        _HASHES[key] = file_sha256(path)
    return _HASHES[key]


def input_files(cfg: DictConfig) -> dict[str, Path]:
    """Every existing input file a run of ``cfg`` reads: ``{config key: path}``.

    The task's prompt file (``task.path``) or offline data file (``task.offline_file``, relative
    to the data folder), and the DIMR mask artifact a ``method.slim.mask`` of ``auto`` (published or
    cached: :func:`~viasd.dimr.masks.find_mask`) or a ``.json`` path resolves to, and a learned gate
    file (``method.gate_path``), and an EAGLE head's weights (``method.drafter.path``). Missing files are
    left out (the task/mask loader reports them).
    """
    files: dict[str, Path] = {}
    task = cfg.get("task") or {}
    if task.get("path"):
        files["task.path"] = Path(str(task.path)).expanduser().resolve()
    if task.get("offline_file") and task.get("source", "offline") != "hub":
        p = Path(str(task.offline_file))
        base = None if p.is_absolute() else data_dir(required=False)
        if p.is_absolute() or base is not None:
            files["task.offline_file"] = p if p.is_absolute() else base / p
    slim = (cfg.get("method") or {}).get("slim") if isinstance(cfg.get("method"), DictConfig) else None
    if slim is not None and isinstance(slim.get("mask"), str):
        mask = slim.mask
        if mask == "auto":
            name = store_name(OmegaConf.to_container(cfg.pair, resolve=True))  # pair=hf: hf-<checkpoint>
            found = find_mask(name, float(slim.get("keep_ratio", 0.5)), str(slim.get("objective", "kl")),
                              str(slim.get("space", "layers")))  # the published mask, else the cached one
            if found is not None:
                files["method.slim.mask"] = found[1]
        elif mask.endswith(".json"):
            files["method.slim.mask"] = Path(mask).expanduser().resolve()
    for j, v in enumerate(OmegaConf.select(cfg, "method.verifiers", default=None) or []):  # a hierarchy's masks
        mask, _, keep = str(v.get("mask")).partition("@")
        keep = v.get("keep_ratio") or keep or (slim or {}).get("keep_ratio", 0.8)
        found = find_mask(store_name(OmegaConf.to_container(cfg.pair, resolve=True)), float(keep),
                          str(v.get("objective", "kl")), str(v.get("space", "layers"))) \
            if mask == "auto" and str(keep).replace(".", "", 1).isdigit() else None  # a bad KEEP: validate() says so
        if found is not None or mask.endswith(".json"):
            files[f"method.verifiers.{j}.mask"] = found[1] if found is not None else Path(mask).expanduser().resolve()
    method = cfg.get("method")
    if isinstance(method, DictConfig) and method.get("gate_path"):  # a learned VIA-SD gate (method.gate=learned)
        files["method.gate_path"] = Path(str(method.gate_path)).expanduser().resolve()
    head = OmegaConf.select(cfg, "method.drafter.path", default=None)
    if head:  # drafter=eagle: the head's weights (viasd.engine.eagle; safetensors, else the .bin)
        folder = Path(str(head)).expanduser().resolve()
        files["method.drafter.path"] = next((folder / n for n in ("model.safetensors", "pytorch_model.bin")
                                             if (folder / n).is_file()), folder / "model.safetensors")
    return {k: p for k, p in files.items() if p.is_file()}


def layers_sha256(layers: list[int] | None) -> str:
    """The hash a slim mask given as a layer list (not a file) is recorded under."""
    return hashlib.sha256(json.dumps(layers).encode()).hexdigest()


def shipped_mask_input(cfg: DictConfig, inputs: dict[str, str]) -> dict[str, str]:
    """``{"method.slim.mask": sha256}`` of the pair-shipped layer list a ``method.slim.mask: auto``
    resolves to when no mask artifact is cached (empty otherwise), and ``{"method.verifiers.J.mask": sha256}``
    for each verifier ``J`` of a hierarchy (``method.verifiers``) whose ``auto`` mask does: the hash
    :func:`slim_mask_used` records, so a run's id follows the mask it reads, and runs that never
    read one keep their id when a pair config ships a new mask."""
    shipped = OmegaConf.select(cfg, "pair.options.slim_layers", default=None) or {}
    slim = OmegaConf.select(cfg, "method.slim", default=None)
    wanted: dict[str, tuple[Any, Any]] = {}  # config key -> (mask spec, keep ratio) of each routed verifier
    if slim is not None:
        wanted["method.slim.mask"] = (slim, slim.get("keep_ratio", 0.5))
    for j, v in enumerate(OmegaConf.select(cfg, "method.verifiers", default=None) or []):
        _, _, at = str(v.get("mask")).partition("@")  # NAME@KEEP, as VerifierConfig.slim reads it
        wanted[f"method.verifiers.{j}.mask"] = (v, v.get("keep_ratio") or at or (slim or {}).get("keep_ratio", 0.8))
    out: dict[str, str] = {}
    for key, (spec, keep) in wanted.items():
        if key in inputs or str(spec.get("mask")).partition("@")[0] != "auto" or \
                (key == "method.slim.mask" and "@" in str(spec.get("mask"))) or \
                str(spec.get("space", "layers")) != "layers" or str(spec.get("objective", "kl")) != "kl":
            continue  # pairs ship whole-layer masks of the KL objective only (viasd.dimr.masks.mask_source)
        try:
            layers = shipped.get(f"{float(keep):.2f}")
        except (TypeError, ValueError):  # a bad KEEP: VerifierConfig/validate() say so
            continue
        if layers is not None:
            out[key] = layers_sha256([int(i) for i in layers])
    return out


def identity(cfg: DictConfig, entry: str | None = None) -> dict[str, Any]:
    """The resolved config that names a run (``run_id_for`` of it), per entry (run/search/kl).

    Includes ``inputs``: ``{config key: sha256}`` of every file of :func:`input_files` and of a
    pair-shipped slim mask (:func:`shipped_mask_input`), so an edited prompt/data/mask gives a new
    run id (KL runs: the mask only); the pair's slim-verifier options themselves
    (``pair.options.slim_layers`` / ``slim_fallback``) are left out; leaves out the keys the config
    schemas add at their unset value (:func:`~viasd.harness.config.drop_unset`), and a run that reads
    its task's offline file records a hub revision pinned after it as ``main``
    (:func:`~viasd.harness.config.unpin_local_hub`), so older run ids stay valid.
    """
    resolved = drop_unset(OmegaConf.to_container(cfg, resolve=True))
    entry = entry or OmegaConf.select(cfg, "exp.entry", default="run")
    options = (resolved.get("pair") or {}).get("options")
    if isinstance(options, dict):  # shipped masks are inputs of the methods that read them, not the pair's
        for key in MASK_OPTIONS:
            options.pop(key, None)
        if resolved["pair"].get("loader") == "smollm2":  # a trained draft distilled on other prompts names them
            options.update(draft_prompts_identity(options))
    task = cfg.get("task")
    if task is not None and task.get("hub") and \
            resolve_source(task.get("source", "auto"), task.get("offline_file"), task.hub, str(task.name)) == "local":
        unpin_local_hub(resolved)
    if entry in ("run", "kl"):
        inputs = {k: _sha(p) for k, p in input_files(cfg).items()}
        inputs.update(shipped_mask_input(cfg, inputs))
        resolved["inputs"] = inputs if entry == "run" else {k: v for k, v in inputs.items() if k.startswith("method.")}
    if entry == "search":
        resolved.update(calibration_inputs(cfg))  # in-domain calibration: the stored runs it reads
        resolved["method"] = {"name": "dimr_search"}
        resolved["task"] = {"name": "calibration"}
    elif entry == "kl":
        resolved["method"] = {"name": "kl_geometry", "slim": resolved.get("method", {}).get("slim", {})}
        resolved["task"] = {"name": "+".join(cfg.search.calibration)}
    return resolved


def _prepare(cfg: DictConfig) -> None:
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    import transformers

    transformers.logging.set_verbosity_error()


def slim_mask_used(pair, mcfg: Any, inputs: dict[str, str]) -> dict[str, Any] | None:
    """``{"layers", "source", "sha256"}`` of the slim verifier a method config resolves to (None: no slim).

    ``sha256`` is the mask artifact's file hash when one is read, else the hash of the layer list.
    """
    slim, key = getattr(mcfg, "slim", None), "method.slim.mask"
    if slim is None:
        return None
    if getattr(mcfg, "verifiers", None):  # a hierarchy: its cheapest verifier (every one's file is among the inputs)
        slim, key = mcfg.slims()[0], "method.verifiers.0.mask"
    _, plan, desc = resolve_plan(pair, slim)
    layers = plan.spec() if plan is not None else None
    sha = inputs.get(key) if ("dimr" in desc or "file" in desc) else None
    return {"layers": layers, "source": desc,
            "sha256": sha or layers_sha256(layers)}


def identity_as_recorded(cfg: DictConfig, ident: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any] | None:
    """The identity a run of ``cfg`` had where the offline data folder was present: its task's file with the
    hash ``recorded`` (a stored run's ``config.yaml``) holds, and a SmolLM2 trained draft distilled on the
    recipe's prompts (no ``pair.options.draft_prompts``) when ``recorded`` names none; None when nothing
    differs. Run ids never change: a report on a machine without the data folder (the task would come from
    the hub, the draft from the built-in prompts) finds the committed runs by recomputing their id from this."""
    task = cfg.get("task")
    out = json.loads(json.dumps(ident))
    sha = (recorded.get("inputs") or {}).get("task.offline_file")
    if task is not None and sha and task.get("offline_file") and "task.offline_file" not in (ident.get("inputs") or {}) \
            and str(task.get("source", "auto")) != "hub":
        out.setdefault("inputs", {})["task.offline_file"] = sha
        out = unpin_local_hub(out) if task.get("hub") else out
    mine, theirs = ((d.get("pair") or {}).get("options") or {} for d in (out, recorded))
    if DRAFT_PROMPTS in mine and DRAFT_PROMPTS not in theirs:  # its draft: the recipe's, distilled on the data folder
        mine.pop(DRAFT_PROMPTS)
    return None if out == ident else out


def find_as_recorded(stores: Any, cfg: DictConfig, ident: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(found run, its identity)``: the finished run of ``stores`` (:class:`~viasd.tracking.store.RunStores`)
    a cell of ``cfg`` names once its offline data file's recorded hash stands in for the absent file
    (:func:`identity_as_recorded`), else None."""
    prefix = run_id_for(ident).rsplit("__", 1)[0] + "__"
    for s in getattr(stores, "stores", [stores]):
        for folder in sorted(Path(s.root).glob(prefix + "*")) if Path(s.root).is_dir() else []:
            found = s.find(folder.name)
            alt = identity_as_recorded(cfg, ident, found["config"]) if found and isinstance(found["config"], dict) else None
            if alt is not None and run_id_for(alt) == folder.name:
                return found, alt
    return None
