"""DIMR: offline search for the slim verifier's routing mask.

Objective on teacher-forced calibration text (:mod:`viasd.dimr.calibration`; target and draft
run once per batch, statistics streamed): ``kl`` = ``KL(q ‖ q'_z)``, ``pythagorean`` =
``KL(p ‖ q'_z) + KL(q'_z ‖ q)``, or ``confident_top1`` = 1 − the share of positions where the
slim verifier's argmax is the target's among those where its max probability is ≥ ``tau_slim``
(what tier 2 relies on; a mask that is never confident scores 1), averaged over tokens. Every
mask's record carries all of them (the Pythagorean terms when the draft is loaded), the top-1
agreement, the confident share and the share of decoder parameters it reads.

Search space (``space``): ``layers`` — a mask keeps the first (``keep_first``) and last layer and
``budget(n, keep_ratio)`` layers in all, parametrized by one score per middle layer (the
top-scoring layers are kept); ``sublayers`` — one score per attention and MLP sub-layer of the
middle layers, kept by score while they fit the parameter budget of the same keep ratio
(:class:`~viasd.dimr.masks.Budget`: whole-layer and sub-layer masks read equally many weights).
``keep_first > 1`` keeps the first layers whole in every candidate: an escalation resumes the full
model at the first skipped sub-layer, so this bounds what an escalating round costs.

Search, in evaluations of the objective: (1) screening — drop each middle layer (sub-layer)
alone and seed the optimizer with the resulting ranking (sub-layers: harm per parameter read;
1 evaluation); these are reported
apart from the budget; (2) the budget: ``n_random`` uniformly random trials, then Bayesian
optimization (optuna's Gaussian-process sampler by default, ``sampler: tpe`` for TPE) up to
``n_trials`` budget trials, with no early stop unless ``patience`` is set. The result is compared
with the best of as many random masks as the search evaluated in all, ``first_k`` and
``every_other``; with ``held_out > 0`` all of them are also measured on held-out calibration
text (the numbers a table reports).

A search is resumable: given the trial records an interrupted attempt logged (``resume``), each mask
it evaluated is looked up instead of evaluated again. The samplers are seeded and the objective is
deterministic, so the resumed search proposes the same masks in the same order and continues where
the attempt stopped (the baselines and held-out numbers, evaluated after the trials, are recomputed).
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from viasd.dimr.calibration import CALIBRATION_SOURCES, Calibration, calibration_split, text_chunks
from viasd.dimr.masks import SPACES, Budget, ablation_plan, budget, mask_path
from viasd.engine.routing import RoutingPlan, num_layers
from viasd.errors import ConfigError, no_draft_model
from viasd.utils.fs import atomic_write_json

log = logging.getLogger(__name__)

OBJECTIVES = ("kl", "pythagorean", "confident_top1", "margin")
SAMPLERS = ("gp", "tpe", "random")


@dataclass
class SearchConfig:
    """DIMR search settings (``conf/search/default.yaml``)."""

    keep_ratio: float = 0.5
    objective: str = "kl"
    sampler: str = "gp"  # gp: optuna GPSampler | tpe: optuna TPESampler (multivariate) | random
    n_random: int = 20  # budget trials sampled uniformly at random before Bayesian optimization
    n_trials: int = 60  # budget trials in all (random + Bayesian optimization)
    patience: int | None = None  # stop after this many BO trials without improvement (None: never)
    time_budget_s: float = 1800.0
    seed: int = 0
    calibration: list[str] = field(default_factory=lambda: list(CALIBRATION_SOURCES))
    n_calibration: int = 16  # calibration chunks (texts), held-out ones included
    seq_len: int = 48
    batch_size: int = 8
    n_baseline_random: int | None = None  # None: as many random masks as the search evaluated
    out: str | None = None  # default: the mask cache path
    dtype: str = "float32"  # models run in this dtype during the search (bf16 GEMMs are slow on CPU)
    screen: bool = True  # score every single-layer drop first and seed the optimizer with the ranking
    space: str = "layers"  # layers | sublayers (attention and MLP sub-layers apart, parameter budget)
    calibration_runs: list[str] = field(default_factory=list)  # in-domain: run ids / folders / method:task
    held_out: float = 0.0  # share of the calibration chunks kept apart for the reported numbers
    tau_slim: float = 0.6  # confident_top1 counts positions where the slim verifier's max prob >= tau_slim
    memo_mib: float = 1024.0  # bound of the memo of hidden states after layer prefixes
    stat_mib: float = 64.0  # one [positions, vocab] float32 statistics tensor (the streamed chunk)
    keep_first: int = 1  # candidates keep the first keep_first layers whole (where an escalation resumes)
    margin_alpha: float = 0.5  # objective=margin: α of calibration.margin_rows (docs/method.md)
    margin_beta: float = 0.3  # objective=margin: β of calibration.margin_rows
    cache_mib: float = 0.0  # keep the target's log-probs while they fit (0: rebuild per mask, the streamed default)

    def validate(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"search.objective must be one of {OBJECTIVES} (got {self.objective!r})")
        if not 0 < self.keep_ratio <= 1:
            raise ConfigError(f"search.keep_ratio must be in (0, 1] (got {self.keep_ratio})")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"search.sampler must be one of {SAMPLERS} (got {self.sampler!r})")
        if self.space not in SPACES:
            raise ConfigError(f"search.space must be one of {SPACES} (got {self.space!r})")
        if not 0 <= self.held_out < 1:
            raise ConfigError(f"search.held_out must be in [0, 1) (got {self.held_out})")
        if not (0 < self.margin_alpha < 1 and 0 < self.margin_beta <= 1):
            raise ConfigError(f"search.margin_alpha must be in (0, 1) and search.margin_beta in (0, 1] (got "
                              f"{self.margin_alpha}, {self.margin_beta})")
        if int(self.keep_first) < 1:
            raise ConfigError(f"search.keep_first must be >= 1 (got {self.keep_first}); 1 keeps layer 0 only")


def mask_record(calib: Calibration, plan: RoutingPlan, cfg: SearchConfig, b: Budget) -> dict[str, Any]:
    """Every statistic of one mask and its ``objective`` value under ``cfg.objective``."""
    margin = (cfg.margin_alpha, cfg.margin_beta) if cfg.objective == "margin" else None
    s = calib.statistics(plan, cfg.tau_slim, margin=margin)
    if "kl_p_slim" in s:
        s["pythagorean"] = s["kl_p_slim"] + s["kl_slim_q"]
    elif cfg.objective == "pythagorean":
        raise no_draft_model("search.objective=pythagorean", calib.pair.name)
    s["objective"] = {"kl": s["kl_q_slim"], "pythagorean": s.get("pythagorean"),
                      "confident_top1": 1.0 - s["confident_top1"], "margin": s.get("margin")}[cfg.objective]
    return {**s, "param_fraction": b.fraction(plan)}


class Space:
    """The candidates of one search space: masks from scores, screening drops, baselines."""

    def __init__(self, target, cfg: SearchConfig):
        self.n, self.cfg = num_layers(target), cfg
        self.first = min(max(1, int(cfg.keep_first)), self.n - 1)
        self.b = Budget.of(target, cfg.keep_ratio, self.first)
        self.k = budget(self.n, cfg.keep_ratio)
        if cfg.space == "layers" and self.k < self.first + 1:
            raise ConfigError(f"search.keep_first={cfg.keep_first} keeps more layers than keep_ratio={cfg.keep_ratio} "
                              f"allows ({self.k} of {self.n}); lower search.keep_first")
        self.target = target
        self.free = list(range(self.first, self.n - 1)) if cfg.space == "layers" else list(self.b.free)
        self.tight = self.k < self.n if cfg.space == "layers" else self.b.limit < self.b.total

    def names(self) -> list[str]:
        """Optuna parameter names, one score per candidate (``s3``; sub-layers ``s3a``, ``s3m``)."""
        if self.cfg.space == "layers":
            return [f"s{i}" for i in self.free]
        return [f"s{i}{kind[0]}" for i, kind in self.free]

    def from_scores(self, scores: list[float]) -> RoutingPlan:
        order = [u for _, u in sorted(zip(scores, range(len(self.free))), key=lambda t: -t[0])]
        if self.cfg.space == "layers":
            top = [self.free[j] for j in order[: self.k - self.first - 1]]
            return RoutingPlan.of_layers({*range(self.first), self.n - 1, *top} if self.k < self.n else range(self.n))
        return self.b.fill([self.free[j] for j in order])

    def seed_scores(self, importance: list[float]) -> list[float]:
        """Scores in [0, 1] from the screening objectives: the harm of dropping each candidate alone,
        per parameter for sub-layers (an attention block reads ~⅛ of an MLP's weights, so the budget
        is best spent on what hurts most per weight read)."""
        lo, hi = min(importance), max(importance)
        if self.cfg.space == "layers":
            return [(v - lo) / ((hi - lo) or 1.0) for v in importance]
        density = [(v - lo) / self.b.costs[u] for v, u in zip(importance, self.free)]
        top = max(density) or 1.0
        return [d / top for d in density]

    def drop(self, j: int) -> RoutingPlan:
        """The full model without candidate ``j`` (not of the budget: never the result)."""
        x = self.free[j]
        full = RoutingPlan.full(self.n)
        if self.cfg.space == "layers":
            return RoutingPlan.of_layers(i for i in range(self.n) if i != x)
        i, kind = x
        return RoutingPlan(full.attn if kind == "mlp" else tuple(a for a in full.attn if a != i),
                           full.mlp if kind == "attn" else tuple(m for m in full.mlp if m != i))

    def ablation(self, name: str, seed: int = 0) -> RoutingPlan:
        return ablation_plan(self.target, name, self.cfg.keep_ratio, seed, self.cfg.space)


def _sampler(cfg: SearchConfig, n_startup: int):
    """The optuna sampler of the budget: ``n_startup`` random trials, then Bayesian optimization."""
    import optuna

    if cfg.sampler == "gp":
        with warnings.catch_warnings():  # deterministic_objective is flagged experimental; the objective is
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # deterministic
            return optuna.samplers.GPSampler(seed=cfg.seed, n_startup_trials=n_startup, deterministic_objective=True)
    if cfg.sampler == "tpe":
        return optuna.samplers.TPESampler(n_startup_trials=n_startup, seed=cfg.seed, multivariate=True)
    return optuna.samplers.RandomSampler(seed=cfg.seed)


def _mask_key(spec: Any) -> str:
    return json.dumps(spec, sort_keys=True)


def resumable(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The statistics of each mask an interrupted attempt evaluated, by mask, from its trial records
    (records without a mask and its objective are ignored)."""
    skip = ("number", "phase", "layers", "elapsed_s")
    return {_mask_key(r["layers"]): {k: v for k, v in r.items() if k not in skip}
            for r in records if isinstance(r, dict) and "layers" in r and "objective" in r}


def search_mask(pair, cfg: SearchConfig, progress: bool = True,
                on_trial: Callable[[dict[str, Any]], None] | None = None,
                store_dir: str | Path | None = None, resume: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run the DIMR search for one pair and budget; returns the mask artifact (and writes it).

    ``on_trial`` is called with each trial's record as soon as it is evaluated (e.g. a W&B logger);
    ``store_dir``: the run store that ``cfg.calibration_runs`` are looked up in; ``resume``: the trial
    records of an interrupted attempt at the same search (see the module docstring): their masks are
    not evaluated again, and ``elapsed_s`` / ``search_seconds`` continue from the attempt's.

    The artifact's ``n_trials`` counts the budget trials (random + BO); ``n_screen`` the
    screening evaluations (each single drop, then the seed); ``n_evaluations`` both;
    ``baselines.random`` holds ``n_evaluations`` random masks unless ``n_baseline_random`` is set;
    ``held_out`` the held-out statistics of the result and of the baselines.
    """
    import optuna

    cfg.validate()
    memo = resumable(resume or [])
    # a resumed search's clock continues from its attempt's last trial
    t0 = time.perf_counter() - max((float(r.get("elapsed_s") or 0.0) for r in resume or []), default=0.0)
    space = Space(pair.target, cfg)
    n, k = space.n, space.k
    chunks, held, calib_info = calibration_split(pair, cfg, store_dir)
    calib = Calibration(pair, chunks, cfg.batch_size, need_draft=pair.draft is not None,
                        memo_mib=cfg.memo_mib, stat_mib=cfg.stat_mib, cache_mib=cfg.cache_mib)
    seen: dict[RoutingPlan, dict[str, float]] = {}
    trials: list[dict[str, Any]] = []

    def record(plan: RoutingPlan, number: int, phase: str) -> dict[str, float]:
        if plan not in seen:
            hit = memo.get(_mask_key(plan.spec()))
            seen[plan] = dict(hit) if hit is not None else mask_record(calib, plan, cfg, space.b)
        trials.append({"number": number, "phase": phase, "layers": plan.spec(), **seen[plan],
                       "elapsed_s": time.perf_counter() - t0})
        if on_trial is not None:
            on_trial(trials[-1])
        return seen[plan]

    importance: list[float] = []
    if cfg.screen and space.tight:  # screening: the cost of dropping each candidate alone
        m = len(space.free)
        for j in tqdm(range(m), desc="DIMR screening", disable=not progress):
            importance.append(record(space.drop(j), j - m - 1, "screen")["objective"])
        seed_scores = space.seed_scores(importance)
        record(space.from_scores(seed_scores), -1, "seed")  # keep the candidates whose removal hurts most
    n_screen = len(trials)

    best = {"value": min((t["objective"] for t in trials if t["phase"] == "seed"), default=math.inf), "since": 0}
    bar = tqdm(total=cfg.n_trials, desc=f"DIMR {pair.name} keep={cfg.keep_ratio:.2f} {cfg.space} ({cfg.sampler})",
               disable=not progress)
    offset = 1 if importance else 0  # the seed is the study's trial 0; budget trials count from 0
    names = space.names()

    def objective(trial: optuna.Trial) -> float:
        scores = [trial.suggest_float(name, 0.0, 1.0) for name in names]
        number = trial.number - offset
        phase = "random" if number < cfg.n_random or cfg.sampler == "random" else "bo"
        return record(space.from_scores(scores), number, phase)["objective"]

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        bar.update(1)
        if trial.value is not None and trial.value < best["value"] - 1e-9:
            best["value"], best["since"] = trial.value, 0
        elif trial.number - offset >= cfg.n_random:
            best["since"] += 1
        bar.set_postfix(best=f"{best['value']:.4f}")
        if cfg.patience and best["since"] >= cfg.patience:
            study.stop()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=_sampler(cfg, cfg.n_random + offset))
    if importance:  # the seed is told to the optimizer (not a budget trial), so BO starts from it
        study.add_trial(optuna.trial.create_trial(
            params=dict(zip(names, seed_scores)),
            distributions={name: optuna.distributions.FloatDistribution(0.0, 1.0) for name in names},
            value=trials[-1]["objective"]))
    remaining = cfg.time_budget_s - (time.perf_counter() - t0)
    study.optimize(objective, n_trials=cfg.n_trials, timeout=max(1.0, remaining), callbacks=[callback])
    bar.close()
    search_s = time.perf_counter() - t0
    budget_trials = [t for t in trials if t["phase"] in ("random", "bo")]
    best_trial = min((t for t in trials if t["phase"] != "screen"), key=lambda t: t["objective"])
    n_evals = len(trials)
    n_rand = cfg.n_baseline_random if cfg.n_baseline_random is not None else n_evals
    rnd = [{"seed": s, "layers": (p := space.ablation("random", 1000 + s)).spec(), **mask_record(calib, p, cfg, space.b)}
           for s in tqdm(range(n_rand), desc="random baseline", disable=n_rand < 30 or not progress)]
    baselines: dict[str, Any] = {name: {"layers": (p := space.ablation(name)).spec(), **mask_record(calib, p, cfg, space.b)}
                                 for name in ("first_k", "every_other")}
    baselines["random"] = rnd
    held_out = _held_out(pair, cfg, held, space, best_trial, baselines, calib) if held else None
    phase_best = {ph: min((t["objective"] for t in trials if t["phase"] == ph), default=None)
                  for ph in ("screen", "seed", "random", "bo")}
    log.info("DIMR %s keep %.2f (%s): %d evaluations (screening %d incl. seed, budget %d) in %.0fs; best %s=%.4f "
             "(from %s); best of %d random masks %.4f", pair.name, cfg.keep_ratio, cfg.space, n_evals, n_screen,
             len(budget_trials), search_s, cfg.objective, best_trial["objective"], best_trial["phase"], len(rnd),
             min((r["objective"] for r in rnd), default=math.nan))
    art = {
        "pair": pair.name,
        "target": getattr(pair.target.config, "_name_or_path", ""),
        "target_revision": getattr(pair.target.config, "_commit_hash", None),
        "draft": getattr(pair.draft.config, "_name_or_path", "") if pair.draft is not None else None,
        "n_layers": n, "keep_ratio": cfg.keep_ratio, "budget": k, "objective": cfg.objective, "space": cfg.space,
        "layers": best_trial["layers"], "value": best_trial["objective"], "best_phase": best_trial["phase"],
        **{key: best_trial.get(key) for key in ("kl_q_slim", "top1_agreement", "confident_top1", "confident_share",
                                                "pythagorean", "param_fraction")},
        "search_seconds": search_s, "sampler": cfg.sampler, "n_trials": len(budget_trials), "n_screen": n_screen,
        "n_evaluations": n_evals, "n_unique_masks": len(seen), "best_per_phase": phase_best,
        "resumed_evaluations": sum(_mask_key(p.spec()) in memo for p in seen),
        "calibration": {**calib_info, "sources": cfg.calibration, "n_chunks": len(chunks), "tokens": calib.n_tokens,
                        "held_out_chunks": len(held)},
        "held_out": held_out,
        "config": asdict(cfg), "trials": trials, "baselines": baselines,
    }
    out = Path(cfg.out) if cfg.out else mask_path(pair.name, cfg.keep_ratio, cfg.objective, cfg.space)
    atomic_write_json(out, art)
    art["path"] = str(out)
    return art


def _held_out(pair, cfg: SearchConfig, held: list[list[int]], space: Space, best_trial: dict[str, Any],
              baselines: dict[str, Any], calib: Calibration) -> dict[str, Any]:
    """Statistics of the result, ``first_k``, ``every_other`` and the best random mask on held-out text."""
    calib.memo.clear()  # the search's memo and cached log-probs are not needed any more
    calib.cached.clear()
    calib.memo_bytes = 0
    hcal = Calibration(pair, held, cfg.batch_size, need_draft=pair.draft is not None, memo_mib=cfg.memo_mib,
                       stat_mib=cfg.stat_mib, cache_mib=cfg.cache_mib)
    best_random = min(baselines["random"], key=lambda r: r["objective"]) if baselines["random"] else None
    masks = {"searched": best_trial["layers"], "first_k": baselines["first_k"]["layers"],
             "every_other": baselines["every_other"]["layers"]}
    if best_random is not None:
        masks["random_best"] = best_random["layers"]
    out = {name: {"layers": m, **mask_record(hcal, RoutingPlan.build(m, space.n), cfg, space.b)}
           for name, m in masks.items()}
    out["tokens"] = hcal.n_tokens
    return out


def kl_geometry(pair, layers, texts: list[str], seq_len: int = 96, batch_size: int = 8,
                memo_mib: float = 1024.0, stat_mib: float = 64.0) -> dict[str, Any]:
    """KL(p‖q), KL(p‖q'), KL(q'‖q), KL(q‖q') and the TV distances, averaged over calibration tokens;
    ``per_text``: the three KL terms of the inequality per calibration row (``[n_rows]`` lists), for
    intervals over texts.

    ``layers``: the slim verifier's mask (a layer list or ``{attn, mlp}``; None: the full
    target). The Pythagorean gap ``KL(p‖q) − (KL(p‖q') + KL(q'‖q))`` is positive when routing
    through ``q'`` is cheaper. Statistics are streamed as in the search (:class:`Calibration`).
    """
    if pair.draft is None:
        raise no_draft_model("the KL geometry (experiments.kl)", getattr(pair, "name", "?"))
    chunks = text_chunks(pair.tokenizer, texts, seq_len)
    if not chunks:
        raise ConfigError("no calibration text of at least 8 tokens; set search.calibration")
    calib = Calibration(pair, chunks, batch_size, need_draft=True, memo_mib=memo_mib, stat_mib=stat_mib)
    n = num_layers(pair.target)
    plan = RoutingPlan.build(layers if layers is not None else range(n), n)
    s = calib.statistics(plan, tv_terms=True, per_text=True)
    out: dict[str, Any] = {key: s[key] for key in ("kl_p_q", "kl_p_slim", "kl_slim_q", "kl_q_slim", "tv_p_q",
                                                   "tv_p_slim", "tv_slim_q")}
    out["pythagorean_gap"] = out["kl_p_q"] - (out["kl_p_slim"] + out["kl_slim_q"])
    out["n_tokens"] = calib.n_tokens
    out["per_text"] = {k: [round(v, 6) for v in vals] for k, vals in s["per_text"].items()}
    return out
