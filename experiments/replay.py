"""``python -m experiments.replay run=<run id> [method=… method.KEY=V …] [grid=FILE.yaml] [out=FILE.json]
[examples=N] [cost=auto|none|PATH [cost_pair=NAME] [cost.allow_other_pair=true]] [oracle=true] [held_out=GATE]
[figure=frontier|gates] [runs_dir=…]``

Replays decoding policies over a finished run's traces (``python -m experiments.trace`` first):
each policy is a method config composed exactly as ``experiments.run`` composes it (``method=sd_ngram``,
``method=via_sd method.tau_accept=0.9``, ``drafter@method.drafter=hybrid``), and a value list
``method.tau_accept=0.5,0.8,1.1`` sweeps like Hydra's multirun (the cartesian product of every
swept key). ``grid=FILE.yaml`` adds ``policies:`` — a list of ``{key: value or [values]}`` entries,
each expanded the same way (``conf/replay/``; ``grid=A.yaml,B.yaml`` replays both, a shared policy once). Without a policy the run's own is replayed and
checked against its counters. Per policy it prints tier shares, calls per model, tier-1/2
precision with Wilson 95% intervals, divergences from the trajectory and the cost model's
predicted speedup over ``ar`` on the same trajectory; ``out=FILE.json`` writes one object per
policy with a run's ``summary.json`` counter keys; ``report=DIR/NAME [scale=S]`` writes the frontier as a
Markdown/LaTeX table and a figure (``figure=gates``: every gate reading with its quality as bounds from the
run's per-example scores, :mod:`viasd.report.gates`); ``oracle=true`` adds the oracle bound (``method.gate=oracle``) of each
via_sd policy's slim mask, drafter and γ beside the frontier; ``held_out=GATE`` replays only the problems
the learned gate file ``GATE`` was not trained on. Greedy runs are replayed exactly, sampled ones as expected
counters of ``sd`` (``docs/replay.md``). Each ``out=`` row and the ``report=`` sources record the cost file that
priced the frontier by hash (``docs/replay.md`` §9: ``report --check`` calls the frontier stale when it changes).
A malformed cost file is one error line (``docs/cost_file.md``); one measured for another pair than the run's is
refused unless ``cost.allow_other_pair=true``, and then the printed note names both pairs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from tqdm.auto import tqdm

import viasd.harness  # noqa: F401  (registers the config schemas the method YAMLs extend)
from experiments.trace import argv_or_help
from viasd.analysis.cost import CostModel, find_cost
from viasd.analysis.paired import load_run, resolve_run_id
from viasd.analysis.replay import Policy, TraceSet, replay
from viasd.analysis.trace import slim_key, trace_dir
from viasd.engine.gate_file import load_gate
from viasd.errors import ConfigError, one_line_errors
from viasd.methods.api import method_config
from viasd.methods.ar import ARConfig
from viasd.paths import PROJECT_ROOT, runs_dir
from viasd.report.gates import write_gates
from viasd.report.replayed import write_frontier
from viasd.tracking.baseline import quality
from viasd.tracking.store import RunStore, RunStores, method_label, store_roots
from viasd.utils.fs import atomic_write_json

CONTROL = ("run", "grid", "out", "report", "scale", "examples", "cost", "cost_pair", "cost.allow_other_pair", "runs_dir",
           "oracle", "held_out", "figure")
#: Counters a replay of a run's own policy must reproduce (greedy: exactly).
CHECKED = ("new_tokens", "target_calls", "target_tokens", "slim_calls", "slim_tokens", "draft_calls",
           "draft_tokens", "self_draft_calls", "self_draft_tokens", "rounds", "drafted", "accepted", "rejected",
           "tier1_accepted", "tier2_regenerated", "tier2_kept", "slim_bonus", "escalations", "tier3_accepted",
           "tier3_rejected")


def expand(overrides: list[str]) -> list[list[str]]:
    """Hydra sweep syntax → the override lists of every combination (``k=a,b`` sweeps ``k``)."""
    choices = []
    for o in OverridesParser.create().parse_overrides(overrides):
        prefix = {"ADD": "+", "FORCE_ADD": "++", "DEL": "~"}.get(o.type.name, "")
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices.append([f"{prefix}{o.get_key_element()}={v}" for v in values])
    return [list(c) for c in itertools.product(*choices)]


def grid_overrides(path: str) -> list[list[str]]:
    """The policies of a grid file: each ``{key: value | [values]}`` entry expanded."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"grid file not found: {p}")
    entries = (yaml.safe_load(p.read_text()) or {}).get("policies")
    if not isinstance(entries, list):
        raise ConfigError(f"{p} needs a `policies:` list of {{key: value or [values]}} entries")
    out = []
    for e in entries:
        items = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in e.items()]
        out += expand(items)
    return out


def policies_for(groups: list[list[str]]) -> list[Policy]:
    """Compose each override list as ``experiments.run`` would and type its method config."""
    out = []
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        for ov in groups:
            try:
                node = compose(config_name="config", overrides=ov).method
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(f"policy {' '.join(ov)}: {str(e).splitlines()[0]}") from None
            label = " ".join(o.removeprefix("method=").removeprefix("method.") for o in ov)
            out.append(Policy(str(node.name), method_config(str(node.name), node), label, ov))
    return out


def oracle_policies(policies: list[Policy]) -> list[Policy]:
    """The oracle gate of each distinct (slim mask, drafter, γ) among the ``via_sd`` policies (one error line
    without any: the oracle needs a mask to bound)."""
    out: dict[tuple, Policy] = {}
    for p in policies:
        if p.method == "via_sd" and p.cfg.gate != "oracle":
            key = (">".join(slim_key(s) for s in p.cfg.slims()), p.cfg.drafter.name, p.cfg.gamma)  # a hierarchy: all
            out.setdefault(key, Policy("via_sd", dataclasses.replace(p.cfg, gate="oracle"),
                                       f"via_sd oracle slim={key[0]} drafter={key[1]} gamma={key[2]}"))
    if not out:
        raise ConfigError("oracle=true bounds the via_sd policies' masks; add one, e.g. method=via_sd "
                          "method.slim.mask=<mask>")
    return list(out.values())


def untrained_examples(gate, run_id: str, idx: list[int]) -> list[int]:
    """The examples of ``idx`` a learned gate was not trained on (all of them for another run's gate)."""
    if gate.meta.get("trace", {}).get("run_id") != run_id:
        return idx
    keep = [i for i in idx if i not in set(gate.meta.get("train_problems", []))]
    if not keep:
        raise ConfigError(f"every replayed example trained the gate {gate.meta.get('path')}; drop examples=")
    return keep


def _cell(v: Any, fmt: str = "{:.2f}") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def call_models(r: dict[str, Any]) -> list[str]:
    """The models whose ``<model>_calls`` the "forward calls" column shows, in order: the target, every routed
    verifier of a ``via_sd`` hierarchy (``slim``, ``slim2``, ``slim3``, …: cheapest first), the drafters."""
    deeper = sorted(int(m.group(1)) for k in r if (m := re.fullmatch(r"slim(\d+)_calls", k)))
    return ["target", "slim", *(f"slim{n}" for n in deeper), "draft", "self_draft"]


def table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        prec = {t: (f"{_cell(r.get(f'precision/tier{t}'))} [{_cell(r.get(f'precision/tier{t}_lo'))}, "
                    f"{_cell(r.get(f'precision/tier{t}_hi'))}] n={r.get(f'precision/tier{t}_n', 0)}")
                for t in (1, 2)}
        calls = " / ".join(f"{m} {_cell(r.get(f'{m}_calls'), '{:.0f}')}" for m in call_models(r) if r.get(f"{m}_calls"))
        rows.append([r["method"], calls, _cell(r.get("target_calls_per_token")), _cell(r.get("rejection_rate")),
                     " / ".join(_cell(r.get(f"tier_share/tier{t}"), "{:.0%}") for t in (1, 2, 3)),
                     prec[1], prec[2], _cell(r.get("divergences_per_100")),
                     _cell(r.get("tokens_to_first_divergence"), "{:.0f}"), _cell(r.get("predicted_speedup"), "{:.2f}x"),
                     "expected (sampled run)" if r.get("expected") else "yes" if r["exact"] else "estimate"])
    return pd.DataFrame(rows, columns=["policy", "forward calls", "target calls/token", "rejection", "tier 1/2/3", "tier-1 precision",
                                       "tier-2 precision", "div./100 tok", "tokens to 1st div.", "predicted speedup",
                                       "exact"]).to_markdown(index=False)


def main(argv: list[str] | None = None) -> int:
    argv = argv_or_help(argv, __doc__)
    if argv is None:
        return 0
    with one_line_errors():
        ctl = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] in CONTROL}
        rest = [a for a in argv if a.split("=", 1)[0] not in CONTROL]
        if "run" not in ctl:
            raise ConfigError("name the traced run: run=<run id>")
        store = RunStores.default(ctl.get("runs_dir") or runs_dir())  # the user's store, then the results store
        ctl["run"] = resolve_run_id(store, ctl["run"])
        folder = trace_dir(store.root, ctl["run"])
        if not (folder / "index.json").is_file():
            raise ConfigError(f"run {ctl['run']} has no traces; run `python -m experiments.trace run={ctl['run']}`")
        traces = TraceSet(folder)
        groups = (expand(rest) if rest else []) + [g for p in ctl.get("grid", "").split(",") if p
                                                   for g in grid_overrides(p)]
        groups = [list(g) for g in dict.fromkeys(map(tuple, groups))]  # a policy two grids share: replayed once
        own = not groups
        path = store.path(ctl["run"])
        cfg = yaml.safe_load((path / "config.yaml").read_text())
        summary = json.loads((path / "summary.json").read_text())
        if own:
            m = cfg["method"]
            policies = [Policy(m["name"], method_config(m["name"], m), f"{method_label(m)} (the run's own)")]
        else:
            policies = policies_for(groups)
        if ctl.get("oracle", "false").lower() in ("true", "1", "yes"):
            policies += oracle_policies(policies)
        if ctl.get("figure", "frontier") not in ("frontier", "gates"):
            raise ConfigError(f"figure={ctl['figure']!r}: use figure=frontier (default) or figure=gates")
        scored = _ar_scores(store, ctl["run"], summary) if ctl.get("figure") == "gates" else None
        cost = _cost(ctl.get("cost", "auto"), store, summary, json.loads((path / "meta.json").read_text()),
                     ctl.get("cost_pair"), _allow_other_pair(ctl))
        n = int(ctl["examples"]) if "examples" in ctl else None
        idx = list(range(min(n, traces.n_examples))) if n else None
        if "held_out" in ctl:  # only the problems a learned gate was not trained on
            idx = untrained_examples(load_gate(ctl["held_out"]), ctl["run"], idx or list(range(traces.n_examples)))
        if float(traces.meta.get("temperature", 0.0)) > 0:
            cost = None  # expected counters: no per-call trace to price
        ar_s = replay(traces, Policy("ar", ARConfig()), cost, idx)["wall_s"] if cost else None
        t0, results = time.perf_counter(), []
        for p in tqdm(policies, desc=f"replay {ctl['run']}", unit="policy", disable=len(policies) < 2):
            results.append(replay(traces, p, cost, idx, ar_s))
        record = cost.record() if cost is not None else None  # which measurements priced each predicted speedup
        for r in results:
            r["cost_file"], r["cost_sha256"], r["cost_pair"] = ((record["path"], record["sha256"], record["pair"])
                                                                if record else (None, None, None))
        dt = time.perf_counter() - t0
    print(table(results))
    print(f"\n{len(results)} policies over {results[0]['n_examples']} examples of {ctl['run']} in {dt:.1f} s"
          + ("" if cost else "; no cost file for this pair (predicted speedup –): "
             "`python -m experiments.bench --cost-curve pair=<pair>` measures one")
          + (f"; predicted speedups priced by the cost file {cost.path}" if cost and cost.path else "")
          + (f" (measured for pair {cost.pair}, not this run's pair {summary.get('pair')}: cost.allow_other_pair=true)"
             if cost and cost.pair != summary.get("pair") else ""))
    if own:
        diff = {k: (summary.get(k), results[0].get(k)) for k in CHECKED
                if k in summary and summary.get(k) != results[0].get(k, 0)}
        print("replay of the run's own policy reproduces its counters" if not diff else
              f"replay differs from the run's counters (run, replay): {diff}")
    if "out" in ctl:
        atomic_write_json(Path(ctl["out"]), results)
        print(f"wrote {ctl['out']}")
    if "report" in ctl:  # DIR/NAME: the frontier as a table and a figure
        target = Path(ctl["report"])
        if record and cost.pair != summary.get("pair"):  # allowed by cost.allow_other_pair=true: the note says so
            record = {**record, "trace_pair": summary.get("pair")}
        replayed = {"run": ctl["run"], "command": replay_command(argv, ctl["run"]), "cost": record}
        if scored:  # figure=gates: every gate reading with quality as bounds
            paths = write_gates(results, scored[1], scored[0], target.parent, target.name, ctl["run"],
                                ctl.get("scale", ""), replayed)
        else:
            paths = write_frontier(results, target.parent, target.name, ctl["run"], ctl.get("scale", ""), replayed)
        for p in paths:
            print(f"wrote {p}")
    return 0


def _ar_scores(store: RunStores, run_id: str, summary: dict[str, Any]) -> tuple[str, list[float]]:
    """The traced run's primary metric and its per-example scores in trajectory order (one error line
    when the run has no scores: the gate figure bounds quality by them)."""
    metric, _ = quality(summary)
    examples = load_run(store, run_id)["examples"]
    scores = [(e.get("score") or {}).get(metric) for e in examples]
    if not metric or any(v is None for v in scores):
        raise ConfigError(f"figure=gates bounds quality by the per-example scores of {run_id}'s task metric and "
                          "this run has none; drop figure=gates for the plain frontier")
    return metric, [float(v) for v in scores]


def replay_command(argv: list[str], run_id: str) -> str:
    """The command line that made a frontier, to make it again (``report --check`` prints it as the fix): the
    run id in full and paths inside the repository relative to its root (the command runs from there)."""
    def portable(arg: str) -> str:
        key, _, value = arg.partition("=")
        if key == "run":
            return f"run={run_id}"
        if key in ("grid", "out", "report", "cost", "held_out"):
            value = ",".join(str(Path(v).resolve().relative_to(PROJECT_ROOT)) if Path(v).is_absolute()
                             and Path(v).resolve().is_relative_to(PROJECT_ROOT) else v for v in value.split(","))
        return f"{key}={value}"

    return "python -m experiments.replay " + " ".join(shlex.quote(portable(a)) for a in argv)


def _allow_other_pair(ctl: dict[str, str]) -> bool:
    """``cost.allow_other_pair=true|false`` (default false); anything else is one error line."""
    value = ctl.get("cost.allow_other_pair", "false").lower()
    if value not in ("true", "false"):
        raise ConfigError(f"cost.allow_other_pair={ctl['cost.allow_other_pair']!r}: use true (price this run with "
                          "another pair's costs) or false")
    return value == "true"


def _cost(spec: str, store: RunStore, summary: dict[str, Any], meta: dict[str, Any],
          pair: str | None = None, allow_other_pair: bool = False) -> CostModel | None:
    """The cost model of ``cost=``: none, a file (a ``viasd.cost/v1`` file is read for ``pair``, default the
    run's pair), or the store's file for the run's pair and machine (auto). A file measured for another pair
    than the run's (or naming none) is one error line unless ``allow_other_pair``."""
    if spec == "none":
        return None
    run_pair = summary.get("pair")
    if spec == "auto":
        return find_cost(store_roots(store), run_pair or "", meta.get("runtime"), meta.get("threads"),
                         meta.get("cpu"))
    cost = CostModel.load(spec, pair or run_pair)
    if cost.pair != run_pair and not allow_other_pair:
        measured = f"measured for pair {cost.pair!r}" if cost.pair else "naming no pair (meta.pair)"
        raise ConfigError(f"cost file {spec} is {measured}, not this run's pair {run_pair!r}: its prices are not "
                          f"this pair's; measure one (`python -m experiments.bench --cost-curve pair={run_pair}`) "
                          "or pass cost.allow_other_pair=true to price it with these costs anyway")
    return cost


if __name__ == "__main__":
    sys.exit(main())
