"""A finished run against an ``ar`` run on the examples they share: paired numbers with intervals.

Subsets chosen by example id nest, so one ``ar`` run of a workload serves as the baseline of
runs on any subset of its examples (:func:`find_ar`: same workload but the subset size, and a
superset of the examples). :func:`compare_to_ar` pairs the two per example:

* speed — the wall-clock speedup (tokens/s over ``ar``'s on the shared examples) with a bootstrap
  95% interval over examples, and the *predicted* (load-free) speedup of the cost model on the
  same examples (:func:`~viasd.analysis.cost.predict_example`), with its interval; and the
  CPU-time speedup (process CPU seconds per example, ``cpu_s``, recorded since runs started
  carrying it: a descheduled process or a paused VM stops that clock, not the wall clock) over the
  shared examples both runs timed (its own ``n``);
* quality — the paired difference of the primary score with McNemar's exact p (binary scores) or
  a paired bootstrap interval and Wilcoxon p (continuous ones); a corpus metric (BLEU, chrF) is
  the corpus score of the shared examples, its difference by paired bootstrap resampling
  (:mod:`viasd.analysis.corpus`);
* the lossless promise — how many examples have exactly ``ar``'s tokens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from viasd.analysis.corpus import CORPUS, corpus_delta
from viasd.analysis.cost import CostModel, find_cost, predict_example
from viasd.analysis.stats import Paired, quality_delta, speedup_ci
from viasd.engine.routing import default_self_layers
from viasd.errors import ConfigError
from viasd.tasks.base import Example, build_task
from viasd.tracking.baseline import PRIMARY, workload_key
from viasd.tracking.proof import UNFINISHED
from viasd.tracking.store import RunStore, RunStores, as_stores, store_roots


def load_run(store: RunStore | RunStores, run_id: str) -> dict[str, Any] | None:
    """``{run_id, config, summary, meta, examples, root}`` of a finished valid run in ``store`` (or in
    any root of a :class:`~viasd.tracking.store.RunStores`: the user's store, then the results store);
    None when no root has it finished."""
    found = as_stores(store).find(run_id)
    if found is None:
        return None
    meta = Path(found["path"]) / "meta.json"
    return {"run_id": run_id, "config": found["config"], "summary": found["summary"],
            "meta": json.loads(meta.read_text()) if meta.is_file() else {},
            "examples": RunStore(found["root"]).examples(run_id), "root": found["root"]}


def load_unfinished(store: RunStore, run_id: str) -> dict | None:
    """An unfinished run's complete examples so far, shaped like :func:`load_run`'s record (its summary
    holds what the cost model reads: pair, method, task, slim mask from meta.json); None otherwise."""
    v = store.verdict(run_id)
    if v is None or v.state != UNFINISHED or not v.config:
        return None
    meta = json.loads((v.path / "meta.json").read_text()) if (v.path / "meta.json").is_file() else {}
    cfg, mask = v.config, meta.get("slim_mask") or {}
    summary = {"pair": (cfg.get("pair") or {}).get("name"), "method": run_id.split("__")[1],  # the label: sd_ngram, …
               "task": (cfg.get("task") or {}).get("name"), "slim_mask/layers": mask.get("layers"),
               "slim_mask/source": mask.get("source", "")}
    return {"run_id": run_id, "config": cfg, "summary": summary, "meta": meta, "root": v.path.parent,
            "examples": interim_scores(cfg.get("task") or {}, store.partial_examples(run_id))}


def interim_scores(task_cfg: dict[str, Any], examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``examples`` (records of a run still being decoded) with the per-example ``score`` its task
    will give them when the run finishes, where the task scores from prediction and reference alone
    (ROUGE, BLEU, exact match; :attr:`~viasd.tasks.base.Task.scores_from_records`); code tasks' are left
    unscored (they run the programs). The records on disk are not touched."""
    if not examples or all(e.get("score") for e in examples) or not task_cfg.get("name"):
        return examples
    task = build_task(task_cfg)
    if not task.scores_from_records:
        return examples
    _, per_example = task.score([str(e.get("prediction") or "") for e in examples],
                                [Example(id=str(e["id"]), prompt="", reference=e.get("reference")) for e in examples])
    return [{**e, "score": e.get("score") or sc} for e, sc in zip(examples, per_example)]


def resolve_run_id(store: RunStore, spec: str) -> str:
    """A finished run's id from its id or a unique prefix of it (``smollm2__ar__prompts``)."""
    if store.is_finished(spec):
        return spec
    hits = [r["run_id"] for r in store.finished_runs() if r["run_id"].startswith(spec)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise ConfigError(f"run={spec} matches {len(hits)} finished runs ({', '.join(hits[:4])}…); name one")
    raise ConfigError(f"no finished run {spec!r} in {store.root} (an id or a unique prefix of one)")


def workload_without_subset(config: dict[str, Any]) -> dict[str, Any]:
    """The workload part of a run config (:func:`~viasd.tracking.baseline.workload_key`) without the subset size."""
    out = json.loads(workload_key(config))
    out["task"] = {k: v for k, v in (out.get("task") or {}).items() if k != "n_examples"}
    return out


def differences(a: Any, b: Any, at: str = "") -> list[str]:
    """Dotted keys where two nested configs differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted({*a, *b}) for d in differences(a.get(k), b.get(k), f"{at}.{k}" if at else k)]
    return [] if a == b else [at]


def find_ar(store: RunStore, run: dict[str, Any]) -> dict[str, Any] | None:
    """The finished ``ar`` run of ``run``'s workload whose examples include all of ``run``'s (largest first)."""
    want = workload_without_subset(run["config"])
    ids = {e["id"] for e in run["examples"]}
    best = None
    for r in store.finished_runs():
        if r["summary"].get("method") != "ar" or not isinstance(r["config"], dict):
            continue
        if differences(workload_without_subset(r["config"]), want):
            continue
        n = r["summary"].get("n_examples", 0)
        if best is None or n > best[0]:
            cand = load_run(store, r["run_id"])
            if ids <= {e["id"] for e in cand["examples"]}:
                best = (n, cand)
    return best[1] if best else None


def score(example: dict[str, Any], task: str) -> float:
    """An example's primary score (``PRIMARY[task]``, else its first score; NaN without one)."""
    sc = example.get("score") or {}
    key = PRIMARY.get(task)
    value = sc.get(key) if key in sc else next(iter(sc.values()), None)
    return math.nan if value is None else float(value)


def prompt_len(ar_example: dict[str, Any]) -> int:
    """Prompt tokens of an ``ar`` example from its counters (decoder-only: ``target_tokens − N + 1``;
    encoder-decoders, whose first call is the encoder's: ``target_tokens − N``)."""
    n, tokens, calls = ar_example["new_tokens"], ar_example["target_tokens"], ar_example["target_calls"]
    return int(tokens - n if calls == n + 1 else tokens - n + 1)


def streams_of(run: dict[str, Any], cost: CostModel) -> dict[str, tuple[str, int | None]]:
    """Each stream of a run → (cost model entry, routed layers): the slim verifier through its mask
    (or the intermediate model), the ``self`` drafter through its plan."""
    s, method = run["summary"], run["config"].get("method") or {}
    out: dict[str, tuple[str, int | None]] = {"target": ("target", None), "draft": ("draft", None)}
    layers = s.get("slim_mask/layers")
    if "independent" in str(s.get("slim_mask/source", "")):
        out["slim"] = ("intermediate" if "intermediate" in cost.models else "draft", None)
    elif layers:
        out["slim"] = ("target", len(layers))
    self_layers = (method.get("drafter") or {}).get("layers")
    n = cost.entry("target").n_layers
    if self_layers is None and n:
        self_layers = default_self_layers(n)
    if self_layers:
        out["self_draft"] = ("target", len(self_layers))
    return out


def predicted_seconds(cost: CostModel, run: dict[str, Any], ar: dict[str, Any], ids: list[str]) -> list[float]:
    """Predicted decode seconds of ``run``'s examples ``ids`` (prompt lengths from ``ar``'s examples)."""
    by_id, ar_by_id = {e["id"]: e for e in run["examples"]}, {e["id"]: e for e in ar["examples"]}
    streams = streams_of(run, cost)
    return [predict_example(cost, by_id[i], prompt_len(ar_by_id[i]), streams)["total"] for i in ids]


def run_cost(store: RunStore | RunStores, run: dict[str, Any]) -> CostModel | None:
    """The cost model pricing ``run`` (a :func:`load_run` dict): its pair's file in the run's own
    store first, then in ``store``'s roots and the results store (:func:`~viasd.tracking.store.store_roots`)."""
    roots = [Path(run.get("root") or store.root), *store_roots(store)]
    meta = run["meta"]
    return find_cost(roots, run["summary"].get("pair", ""), meta.get("runtime"), meta.get("threads"), meta.get("cpu"))


def compare_to_ar(store: RunStore, run: dict[str, Any], ar: dict[str, Any], cost: CostModel | None = None
                  ) -> dict[str, Any]:
    """Paired numbers of ``run`` against ``ar`` on their shared examples (see the module docstring):
    ``n``, ``speedup`` / ``predicted`` / ``quality`` (:class:`~viasd.analysis.stats.Paired`), ``cpu``
    (the CPU-time speedup, on the examples both runs timed) and ``predicted_cpu`` (the prediction on
    those same examples, what ``cpu`` validates),
    ``metric``, ``same_tokens``, ``ids``. ``cost``: default ``ar``'s cost file (:func:`run_cost`): both
    runs are priced on the machine of the baseline, whichever machine decoded ``run``."""
    ar_ids = {e["id"] for e in ar["examples"]}
    ids = [e["id"] for e in run["examples"] if e["id"] in ar_ids]
    by_id, ar_by_id = {e["id"]: e for e in run["examples"]}, {e["id"]: e for e in ar["examples"]}
    col = (lambda rows, key, over=ids: [float(rows[i].get(key) or 0.0) for i in over])
    speed = speedup_ci(col(by_id, "new_tokens"), col(by_id, "wall_s"), col(ar_by_id, "new_tokens"),
                       col(ar_by_id, "wall_s"))
    if cost is None:
        cost = run_cost(store, ar)
    timed = [i for i in ids if by_id[i].get("cpu_s") and ar_by_id[i].get("cpu_s")]
    cpu = Paired(0, math.nan, test="process CPU time")
    if timed:
        cpu = speedup_ci(col(by_id, "new_tokens", timed), col(by_id, "cpu_s", timed),
                         col(ar_by_id, "new_tokens", timed), col(ar_by_id, "cpu_s", timed))
    predicted = predicted_timed = Paired(len(ids), math.nan, test="cost model")
    if cost is not None and ids:
        pr, pa = predicted_seconds(cost, run, ar, ids), predicted_seconds(cost, ar, ar, ids)
        predicted = predicted_timed = speedup_ci(col(by_id, "new_tokens"), pr, col(ar_by_id, "new_tokens"), pa)
        if timed and len(timed) < len(ids):  # the prediction on the examples the CPU-time speedup is over
            at = {i: k for k, i in enumerate(ids)}
            predicted_timed = speedup_ci(col(by_id, "new_tokens", timed), [pr[at[i]] for i in timed],
                                         col(ar_by_id, "new_tokens", timed), [pa[at[i]] for i in timed])
    task = run["summary"].get("task", "")
    metric = PRIMARY.get(task) or next(iter((run["examples"][0].get("score") or {}) if run["examples"] else {}), "")
    quality, quality_mean, ar_quality_mean = _quality(metric, task, [by_id[i] for i in ids], [ar_by_id[i] for i in ids])
    same = sum(by_id[i]["token_ids"] == ar_by_id[i]["token_ids"] for i in ids)
    return {"n": len(ids), "ids": ids, "speedup": speed, "cpu": cpu, "predicted": predicted,
            "predicted_cpu": predicted_timed, "quality": quality,
            "metric": metric if quality.n else "", "same_tokens": same,
            "quality_mean": quality_mean, "ar_quality_mean": ar_quality_mean}


def _quality(metric: str, task: str, rows: list[dict[str, Any]], ar_rows: list[dict[str, Any]]
             ) -> tuple[Paired, float, float]:
    """``(paired difference, run's quality, ar's quality)`` on aligned scored examples. A corpus metric
    (BLEU, chrF: :data:`~viasd.analysis.corpus.CORPUS`) is the corpus score of the examples' predictions,
    compared by paired bootstrap (:func:`~viasd.analysis.corpus.corpus_delta`) — never the mean of its
    per-example sentence scores; any other metric is the mean of per-example scores."""
    scored = [(e, a, x, y) for e, a in zip(rows, ar_rows)
              if not (math.isnan(x := score(e, task)) or math.isnan(y := score(a, task)))]
    if not scored:
        return Paired(0, math.nan), math.nan, math.nan
    if metric in CORPUS:
        run_q, ar_q, d = corpus_delta(metric, [str(e.get("prediction") or "") for e, *_ in scored],
                                      [str(a.get("prediction") or "") for _, a, *_ in scored],
                                      [a.get("reference") for _, a, *_ in scored])
        return d, run_q, ar_q
    q, qa = [x for *_, x, _ in scored], [y for *_, y in scored]
    return quality_delta(q, qa), sum(q) / len(q), sum(qa) / len(qa)
