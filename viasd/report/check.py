"""``python -m experiments.report --check``: which committed outputs the current code would not make.

An *output* is every file of one name in a folder (``paper_figures/local/table2.md``, ``.tex``,
``.png``, ``.pdf``, ``.sources.json``, ``.rows.json``); its ``<name>.sources.json`` names the runs
it was built from. Nothing is decoded and no model is loaded: run ids are recomputed from the
configs (:func:`viasd.harness.runner.identity` + :func:`~viasd.tracking.store.run_id_for`, as
the runner and the dry run do). Each output is

* **stale** when it has no sources file; or, for an exp's report (``<scale>/<exp>.*``), when a
  source run is not a run the exp's cells at that scale make now (the cells composed as the grid
  composes them), a speedup's ``ar`` run is not the matched ``ar`` run of its cell's workload, a
  current cell is neither among its runs nor among its missing cells, or the exp has no such
  scale; for any other output (``experiments.compare``'s, e.g. ``verdict_mbpp.*``: not an
  exp, the run ids it compared), when a named run's folder is found in a run store and its
  recorded ``config.yaml``, laid over the current composition of its pair, method, drafter and
  task, no longer hashes to its id (a key the current code adds, a key it dropped, an input file
  that changed), or the folder is not a finished run of that id; a replayed frontier
  (``experiments.replay … report=``) also when it is not priced by the cost file it names, as that
  file is now — none named, outside the repository, missing, other bytes
  (:mod:`viasd.report.frontier_cost`); a compared table with predicted speedups likewise when a cost
  file its sources record (``costs``) is missing or changed, or it records none;
* **not checked** when that cannot be decided here: a cell reads an input file absent on this
  machine (an offline data file without ``VIASD_DATA_DIR``, a prompt file, a DIMR mask neither
  searched here nor published), so its run id is unknown; a ``mask: auto`` cell reads a mask only
  this machine's cache holds (not published in the results store: a fresh clone reads another);
  or a compared run is in no run store read;
* **fresh** otherwise.

Outputs under ``bench_results/`` without a sources file are benchmark tables measured in one
process (``experiments.bench``), not built from runs: listed as skipped. Without the data folder
the cells that read offline data are *not checked* and never counted stale; the exit status is
1 when an output is stale (with ``strict``: also when one is not checked — for CI, which has
the data), else 0.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from viasd.errors import ConfigError
from viasd.harness.grid import CONF_DIR, exp_jobs
from viasd.harness.interleave import expand
from viasd.harness.prereq import cell_mask_source
from viasd.harness.runner import identity, input_files
from viasd.paths import PROJECT_ROOT, data_dir
from viasd.report.build import REPORTS, scales
from viasd.report.frontier_cost import compared_problem, frontier_problem, is_frontier
from viasd.tracking.store import RENAMED_METHODS, run_id_for

__all__ = ["FRESH", "STALE", "UNCHECKED", "Verdict", "Cell", "composed_cells", "expected_cells", "check_tree",
           "check_main", "default_stores"]

FRESH, STALE, UNCHECKED = "fresh", "stale", "not checked"


@dataclass
class Verdict:
    """One output: ``path`` (folder/name, no suffix), its ``files``, ``state``, why, and the fix."""

    path: Path
    files: list[str]
    state: str
    reason: str = ""
    fix: str = ""

    def line(self) -> str:
        suffixes = sorted(f[len(self.path.name):] for f in self.files)
        what = f"{self.path}{suffixes[0]}" if len(suffixes) == 1 else f"{self.path}.{{{','.join(s[1:] for s in suffixes)}}}"
        return f"{self.state.upper() if self.state == STALE else self.state:<11} {what}" + (
            f": {self.reason}" if self.reason else "")


@dataclass
class Cell:
    """A cell of an exp at a scale: its run id's ``pair__method__task`` prefix, the run id it makes
    here (None: an input it reads is absent, so its id is unknown), ``unsure``: why another machine
    may make another id (absent inputs; a ``mask: auto`` reading a mask only this cache holds), and the
    run ids its matched ``ar`` run may have."""

    prefix: str
    run_id: str | None
    unsure: list[str] = field(default_factory=list)
    ar_ids: set[str] = field(default_factory=set)


class _Groups:
    """Whether an override key names a config group (``pair``, ``scale/table2``), as Hydra decides;
    one ``list_groups`` per parent group asked about."""

    def __init__(self) -> None:
        self.loader, self.children = GlobalHydra.instance().config_loader(), {}

    def __contains__(self, key: str) -> bool:
        parent, _, leaf = key.rpartition("/")
        if parent not in self.children:
            self.children[parent] = set(self.loader.list_groups(parent))
        return leaf in self.children[parent]


def composed_cells(overrides: list[str]) -> list[tuple[list[str], DictConfig]]:
    """:func:`viasd.harness.grid.exp_cells`, each distinct set of config-group choices composed once.

    Hydra composes a job in two steps: the defaults list from the group overrides (``method=sd``),
    then the other overrides applied to the result (``method.gamma=4``; a group override is one
    naming an existing group with a non-dict value, as Hydra decides). This runs the same two
    steps, the first once per distinct group part (table5: 16 cells, 4 compositions). Call with
    Hydra initialized.
    """
    groups, parser = _Groups(), OverridesParser.create()
    bases: dict[tuple[str, ...], DictConfig] = {}
    out = []
    for job in exp_jobs(overrides):
        parsed = parser.parse_overrides(job)
        picks = [o.key_or_group in groups and not isinstance(o.value(), dict) for o in parsed]
        values = [o for o, pick in zip(parsed, picks) if not pick]
        if any(o.key_or_group.startswith("hydra.") for o in values):  # the node compose() leaves out
            out += expand(job, compose(config_name="config", overrides=job))
            continue
        key = tuple(o.input_line for o, pick in zip(parsed, picks) if pick)
        if key not in bases:
            bases[key] = compose(config_name="config", overrides=list(key))
        cfg = copy.deepcopy(bases[key])
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        out += expand(job, cfg)  # an interleave job: its variants
    return out


def _inputs_here(cfg: DictConfig) -> tuple[list[str], bool]:
    """``(why the cell's run id may differ elsewhere, whether it can be computed here)``.

    An input file absent here (offline data, prompt file, a DIMR mask still to search): its hash is
    part of the run id, so the id is unknown. A ``mask: auto`` reads the published DIMR mask (the
    results store's), else the pair's shipped layer list or fallback — what a fresh clone reads, so
    the id here is a fresh clone's — unless this machine's cache holds a mask nobody published: the
    id here is then this cache's, and a cell not matched by a source is *not checked*, never stale.
    """
    entry = OmegaConf.select(cfg, "exp.entry", default="run")
    why, known = [], True
    if entry == "run":
        have, task = input_files(cfg), cfg.task
        if task.get("path") and "task.path" not in have:
            why.append(f"prompt file {task.path} absent")
        if task.get("offline_file") and str(task.get("source", "auto")) != "hub" and "task.offline_file" not in have:
            base = data_dir(required=False)
            why.append(f"offline data file {task.offline_file} absent ("
                       + ("no data folder: set VIASD_DATA_DIR" if base is None else f"not in {base}") + ")")
        known = not why
    if entry in ("run", "kl"):
        try:
            src = cell_mask_source(cfg)
        except ConfigError as e:
            return [*why, str(e)], False
        if src is not None and src.kind == "search":
            return [*why, f"DIMR mask not searched here ({src.detail})"], False
        if src is not None and src.kind == "artifact":
            why.append(f"mask: auto reads the DIMR mask searched here ({src.detail}), which a fresh clone lacks: "
                       "checked against it (publish it: `python -m experiments.store publish <its search run "
                       "id>`; VIASD_CACHE_DIR=<empty folder> checks as a fresh clone)")
    return why, known


def _ar_ids(ident: dict[str, Any], ar_method: dict[str, Any]) -> set[str]:
    """Run ids of the ``ar`` run of ``ident``'s workload (:func:`~viasd.tracking.baseline.workload_key`:
    the method and its own inputs left out; the pair's ``intermediate`` with or without)."""
    if (ident.get("method") or {}).get("name") == "ar":
        return {run_id_for(ident)}
    ar = {**copy.deepcopy(ident), "method": ar_method}
    ar["inputs"] = {k: v for k, v in (ar.get("inputs") or {}).items() if not k.startswith("method.")}
    ids = {run_id_for(ar)}
    if isinstance(ar.get("pair"), dict) and "intermediate" in ar["pair"]:
        ar["pair"] = {k: v for k, v in ar["pair"].items() if k != "intermediate"}
        ids.add(run_id_for(ar))
    return ids


def _ar_method() -> dict[str, Any]:
    """The ``method`` node of an ``ar`` run's identity (call with Hydra initialized)."""
    return OmegaConf.to_container(compose(config_name="config", overrides=["method=ar"]).method, resolve=True)


def expected_cells(exp: str, scale: str, ar_method: dict[str, Any] | None = None) -> list[Cell]:
    """Every cell of ``exp`` at ``scale`` as the current configs make it (call with Hydra initialized)."""
    ar_method = ar_method or _ar_method()
    cells = []
    for _, cfg in composed_cells([f"+exp={exp}", f"scale={scale}"]):
        ident = identity(cfg)
        rid = run_id_for(ident)
        unsure, known = _inputs_here(cfg)
        timed = OmegaConf.select(cfg, "exp.entry", default="run") == "run"
        cells.append(Cell(rid.rsplit("__", 1)[0], rid if known else None, unsure,
                          _ar_ids(ident, ar_method) if timed and known else set()))
    return cells


def _prefix(run_id: str) -> str:
    return run_id.rsplit("__", 1)[0]


def _check_exp(path: Path, files: list[str], exp: str, scale: str, src: dict[str, Any], cells: list[Cell]) -> Verdict:
    fix = (f"python -m experiments.run +exp={exp} scale={scale}, then python -m experiments.report --scale {scale} "
           f"--only {exp} --publish; or delete {path}.*")
    made = {c.run_id for c in cells if c.run_id}
    unsure = {c.prefix for c in cells if c.unsure}
    runs = list(src.get("runs", []))
    problems = []
    if src.get("scale") not in (None, scale):
        problems.append(f"built at scale {src['scale']!r}, in the {scale} folder")
    not_made = [r for r in runs if r not in made and _prefix(r) not in unsure]
    if not_made:
        first = not_made[0]
        now = [c.run_id for c in cells if c.run_id and c.prefix == _prefix(first) and c.run_id not in runs]
        problems.append(f"{len(runs)} sources, {len(not_made)} not made by the current configs (first: {first} → "
                        + (f"now {now[0]})" if now else f"no current cell makes {_prefix(first)} runs)"))
    ar_ok = {c.run_id: c.ar_ids for c in cells if c.run_id}
    bad_ar = [(r, a) for r, a in (src.get("baselines") or {}).items() if a and r in ar_ok and a not in ar_ok[r]]
    if bad_ar:
        problems.append(f"{len(bad_ar)} speedups against an ar run that is not their workload's now "
                        f"(first: {bad_ar[0][1]} → now {sorted(ar_ok[bad_ar[0][0]])[0]})")
    covered = set(runs) | set(src.get("missing", []))
    lacking = [c.run_id for c in cells if c.run_id and not c.unsure and c.run_id not in covered]
    if lacking:
        problems.append(f"{len(lacking)} of the exp's {len(cells)} current cells are neither among its runs nor "
                        f"among its missing cells (first: {lacking[0]})")
    if problems:
        return Verdict(path, files, STALE, "; ".join(problems), fix)
    undecided = [c for c in cells if c.unsure and c.run_id not in covered]
    if undecided:
        why = list(dict.fromkeys(w for c in undecided for w in c.unsure))
        return Verdict(path, files, UNCHECKED, f"{len(undecided)} of {len(cells)} cells not matched, and their run "
                       f"ids here may not be the ones made elsewhere: " + "; ".join(why[:2])
                       + (f" (+{len(why) - 2} more)" if len(why) > 2 else ""))
    return Verdict(path, files, FRESH, f"{len(runs)} runs, all made by the current configs")


def _recomposed(config: dict[str, Any]) -> DictConfig | str:
    """A run's recorded config laid over the current composition of its pair, method, drafter and
    task (the reason as a string when that does not compose). Call with Hydra initialized."""
    method = config.get("method") or {}
    name = RENAMED_METHODS.get(method.get("name"), method.get("name"))
    choices = {"pair": (config.get("pair") or {}).get("name"), "method": name,
               "task": (config.get("task") or {}).get("name")}
    drafter = (method.get("drafter") or {}).get("name") if isinstance(method.get("drafter"), dict) else None
    for group, choice in choices.items():
        if not (CONF_DIR / group / f"{choice}.yaml").is_file():
            return f"no {group} config {choice!r} now (conf/{group}/{choice}.yaml)"
    picks = [f"{g}={c}" for g, c in choices.items()]
    if drafter and (CONF_DIR / "drafter" / f"{drafter}.yaml").is_file():
        picks.append(f"drafter@method.drafter={drafter}")
    try:
        return OmegaConf.merge(compose(config_name="config", overrides=picks),
                               {k: v for k, v in config.items() if k != "inputs"})
    except (HydraException, OmegaConfBaseException) as e:
        return f"its config does not compose now ({type(e).__name__}: {str(e).splitlines()[0]})"


def _check_compared(path: Path, files: list[str], src: dict[str, Any], stores: list[Path]) -> Verdict:
    fix = (f"re-make its runs with the current code and rerun python -m experiments.compare --ar … --out "
           f"{path.parent} --name {path.name}; or delete {path}.*")
    ids = list(dict.fromkeys([*src.get("runs", []), *(v for v in (src.get("baselines") or {}).values() if v)]))
    problems, unfound, absent = [], [], []
    for rid in ids:
        folder = next((s / rid for s in stores if (s / rid / "config.yaml").is_file()), None)
        if folder is None:
            unfound.append(rid)
            continue
        config = yaml.safe_load((folder / "config.yaml").read_text())
        if run_id_for(config) != rid or not (folder / "summary.json").is_file():
            problems.append(f"{folder} is not a finished run of that id")
            continue
        cfg = _recomposed(config)
        if isinstance(cfg, str):
            problems.append(f"{rid}: {cfg}")
            continue
        unsure, known = _inputs_here(cfg)
        now = run_id_for(identity(cfg)) if known else None
        if now != rid and unsure:
            absent.append(f"{rid}: {unsure[0]}")
        elif now != rid:
            problems.append(f"{rid} → now {now} (its config under the current code)")
    if problems:
        return Verdict(path, files, STALE, f"{len(ids)} compared runs, {len(problems)} not valid under the current "
                       f"code (first: {problems[0]})", fix)
    if unfound or absent:
        why = [f"{len(unfound)} of {len(ids)} runs in no run store read ({', '.join(map(str, stores))}; "
               f"first: {unfound[0]})"] if unfound else []
        return Verdict(path, files, UNCHECKED, "; ".join(why + absent[:1]))
    return Verdict(path, files, FRESH, f"{len(ids)} compared runs, all valid under the current code")


#: Suffixes of two parts an output's files have (``table2.sources.json``); others have one (``.md``).
DOUBLE_SUFFIXES = (".sources.json", ".rows.json")


def _outputs(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """``(folder/name, file names)`` of every output under ``root``, in path order."""
    by_stem: dict[Path, list[str]] = {}
    for f in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        double = next((s for s in DOUBLE_SUFFIXES if f.name.endswith(s)), None)
        by_stem.setdefault(f.parent / (f.name[:-len(double)] if double else f.stem), []).append(f.name)
    yield from by_stem.items()


def default_stores(runs: str | Path) -> list[Path]:
    """The run stores a compared run is looked up in: ``runs`` and the repository's results store."""
    results = PROJECT_ROOT / "results" / "runs"
    return [Path(runs)] + ([results] if results.is_dir() else [])


def check_tree(roots: list[Path], stores: list[Path], repo: Path = PROJECT_ROOT) -> tuple[list[Verdict], list[Path]]:
    """Verdicts of every output under ``roots`` and the benchmark outputs skipped (no sources); ``repo``:
    the repository a frontier's cost file must lie in."""

    def _do() -> tuple[list[Verdict], list[Path]]:
        verdicts, skipped, cache = [], [], {}
        for root in roots:
            for path, files in _outputs(root):
                sources = path.parent / f"{path.name}.sources.json"
                name, scale = path.name, path.parent.name
                is_exp = name in REPORTS.names()
                if not sources.is_file():
                    if root.name == "bench_results":
                        skipped.append(path)
                        continue
                    fix = (f"python -m experiments.report --scale {scale} --only {name} --publish" if is_exp and
                           scale in scales() else "regenerate it with a tool that writes its sources") + \
                          f"; or delete {path}.*"
                    verdicts.append(Verdict(path, files, STALE, f"no sources file ({sources.name}): nothing "
                                            "names the runs it was built from", fix))
                elif not is_exp:
                    src = json.loads(sources.read_text())
                    unpriced = (frontier_problem(path, src, repo) if is_frontier(path, src)
                                else compared_problem(path, src, repo))
                    verdicts.append(Verdict(path, files, STALE, *unpriced) if unpriced
                                    else _check_compared(path, files, src, stores))
                elif not (CONF_DIR / "scale" / name / f"{scale}.yaml").is_file():
                    verdicts.append(Verdict(path, files, STALE, f"exp {name} has no {scale} scale "
                                            f"(conf/scale/{name}/{scale}.yaml)", f"delete {path}.*"))
                else:
                    if (name, scale) not in cache:
                        cache["ar"] = cache.get("ar") or _ar_method()
                        cache[name, scale] = expected_cells(name, scale, cache["ar"])
                    verdicts.append(_check_exp(path, files, name, scale, json.loads(sources.read_text()),
                                               cache[name, scale]))
        return verdicts, skipped

    if GlobalHydra.instance().is_initialized():
        return _do()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return _do()


def check_main(roots: list[Path], stores: list[Path], strict: bool = False) -> int:
    """Print one line per output (and the fix under each stale one) and a summary; returns the exit
    status: 1 when an output is stale (``strict``: or not checked), else 0."""
    verdicts, skipped = check_tree([r for r in roots if r.is_dir()], stores)
    for v in verdicts:
        print(v.line())
        if v.fix:
            print(f"{'':<12}fix: {v.fix}")
    if skipped:
        print(f"skipped     {len(skipped)} benchmark outputs without sources (experiments.bench tables, not built "
              f"from runs): {', '.join(str(p) for p in skipped)}")
    count = {s: sum(v.state == s for v in verdicts) for s in (STALE, UNCHECKED, FRESH)}
    print(f"[viasd] check of {len(verdicts)} outputs under {', '.join(str(r) for r in roots)}: {count[STALE]} stale, "
          f"{count[UNCHECKED]} not checked, {count[FRESH]} fresh"
          + ("" if data_dir(required=False) else " (no data folder: cells reading offline data are not checked; "
             "set VIASD_DATA_DIR)"))
    return 1 if count[STALE] or (strict and count[UNCHECKED]) else 0
