"""DIMR: offline search for the slim verifier's routing mask.

Objective on teacher-forced calibration text (one forward per model per batch, target and
draft log-probs computed once): ``kl`` = ``KL(q ‖ q'_z)`` or ``pythagorean`` =
``KL(p ‖ q'_z) + KL(q'_z ‖ q)``, averaged over tokens. Calibration text is spread over the
built-in prompts and every offline task present, cut into equal-length chunks. Candidates keep
the first and last layer and ``budget(n, keep_ratio)`` layers in all; a mask is parametrized
by one score per middle layer, the top-scoring layers are kept.

Search, in evaluations of the objective: (1) layer screening — drop each middle layer alone
(``n − 2`` evaluations) and seed the optimizer with the resulting ranking (1 evaluation); these
are reported apart from the budget; (2) the budget: ``n_random`` uniformly random trials, then
Bayesian optimization (optuna's Gaussian-process sampler by default, ``sampler: tpe`` for TPE)
up to ``n_trials`` budget trials, with no early stop unless ``patience`` is set. The result is
compared with the best of as many random masks as the search evaluated in all.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, EncoderDecoderCache

from viasd.dimr.masks import budget, every_other_mask, first_k_mask, mask_path, random_mask
from viasd.engine.routing import CausalPath, RoutingPlan, num_layers, routed_forward
from viasd.errors import ConfigError, no_draft_model
from viasd.utils.fs import atomic_write_json

log = logging.getLogger(__name__)

OBJECTIVES = ("kl", "pythagorean")
SAMPLERS = ("gp", "tpe", "random")
# Calibration sources by default: the built-in prompts and the offline tasks (those present).
CALIBRATION_SOURCES = ("builtin", "xsum", "cnndm", "wmt14_deen", "gsm8k", "squad", "nq_open", "humaneval", "mbpp")
MEMO_ENTRIES = 256  # memoized (batch, layer prefix) hidden states


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
    n_calibration: int = 16  # calibration chunks (texts)
    seq_len: int = 48
    batch_size: int = 8
    n_baseline_random: int | None = None  # None: as many random masks as the search evaluated
    out: str | None = None  # default: the mask cache path
    dtype: str = "float32"  # models run in this dtype during the search (bf16 GEMMs are slow on CPU)
    screen: bool = True  # score every single-layer drop first and seed the optimizer with the ranking

    def validate(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"search.objective must be one of {OBJECTIVES} (got {self.objective!r})")
        if not 0 < self.keep_ratio <= 1:
            raise ConfigError(f"search.keep_ratio must be in (0, 1] (got {self.keep_ratio})")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"search.sampler must be one of {SAMPLERS} (got {self.sampler!r})")


def _fresh_cache(model):
    if getattr(model.config, "is_encoder_decoder", False):
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    return DynamicCache()


@torch.inference_mode()
def logprobs(model, batch: torch.Tensor, plan: RoutingPlan | None = None) -> torch.Tensor:
    """Teacher-forced next-token log-probs ``[B, L, V]`` (float32) for token ids ``[B, L]``.

    With a plan, runs the routed model (the slim verifier). Encoder-decoder models encode
    ``batch`` and teacher-force the decoder on ``[start] + batch[:, :-1]``.
    """
    if plan is None:
        plan = RoutingPlan(tuple(range(num_layers(model))))
    enc = None
    if getattr(model.config, "is_encoder_decoder", False):
        enc = model.get_encoder()(input_ids=batch)
        start = torch.full_like(batch[:, :1], model.config.decoder_start_token_id)
        batch = torch.cat([start, batch[:, :-1]], 1)
    logits = routed_forward(model, batch, _fresh_cache(model), plan, last=batch.shape[1], encoder_outputs=enc)
    return torch.log_softmax(logits.float(), -1)


def kl(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Mean ``KL(a ‖ b)`` over all positions; inputs ``[..., V]`` log-probs → scalar."""
    return (logp_a.exp() * (logp_a - logp_b)).sum(-1).mean()


def tv(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Mean total-variation distance over positions → scalar."""
    return 0.5 * (logp_a.exp() - logp_b.exp()).abs().sum(-1).mean()


class Calibration:
    """Calibration batches with the target's (and draft's) log-probs computed once."""

    def __init__(self, pair, texts: list[str], seq_len: int, batch_size: int, need_draft: bool):
        tok = pair.tokenizer
        ids, pool = [], []  # texts of seq_len tokens or more give one chunk; shorter ones are joined
        for t in texts:
            x = tok(t, add_special_tokens=True).input_ids
            if len(x) >= seq_len:
                ids.append(x[:seq_len])
            else:
                pool += x
        ids += [pool[i:i + seq_len] for i in range(0, len(pool) - seq_len + 1, seq_len)]
        ids = [x for x in ids if len(x) >= 8]
        if not ids:
            raise ConfigError("no calibration text of at least 8 tokens; set search.calibration")
        L = min(seq_len, min(len(x) for x in ids))
        self.batches = [torch.tensor([x[:L] for x in ids[i:i + batch_size]], device=pair.device)
                        for i in range(0, len(ids), batch_size)]
        self.n_tokens = sum(b.numel() for b in self.batches)
        self.pair = pair
        self.target = [logprobs(pair.target, b) for b in self.batches]
        self.draft = [logprobs(pair.draft, b) for b in self.batches] if need_draft and pair.draft is not None else None
        # Decoder-only models: hidden states after each evaluated layer prefix are memoized, so
        # candidates sharing a prefix of kept layers (all share layer 0) skip that compute.
        self.enc_dec = bool(getattr(pair.target.config, "is_encoder_decoder", False))
        self.paths = None
        self.memo: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    @torch.inference_mode()
    def slim_logprobs(self, i: int, plan: RoutingPlan) -> torch.Tensor:
        """Log-probs ``[B, L, V]`` of the slim verifier ``plan`` on calibration batch ``i``."""
        if self.enc_dec:
            return logprobs(self.pair.target, self.batches[i], plan)
        if self.paths is None:
            self.paths = [CausalPath(self.pair.target, b) for b in self.batches]
        path, layers = self.paths[i], plan.layers
        hidden, start = path.embeds, 0
        for j in range(len(layers), 0, -1):
            if (i, layers[:j]) in self.memo:
                hidden, start = self.memo[(i, layers[:j])], j
                self.memo.move_to_end((i, layers[:j]))
                break
        for j in range(start, len(layers)):
            hidden = path.layer(layers[j], hidden)
            self.memo[(i, layers[: j + 1])] = hidden
        while len(self.memo) > MEMO_ENTRIES:
            self.memo.popitem(last=False)
        return torch.log_softmax(path.head(hidden, hidden.shape[1]).float(), -1)

    def evaluate(self, layers: list[int], objective: str = "kl") -> dict[str, float]:
        """Objective, KL terms and top-1 agreement with the target for one mask."""
        n = num_layers(self.pair.target)
        plan = RoutingPlan.build(layers, n)
        tot = {"kl_q_slim": 0.0, "top1_agreement": 0.0, "kl_p_slim": 0.0, "kl_slim_q": 0.0}
        for i, b in enumerate(self.batches):
            w = b.numel() / self.n_tokens
            s = self.slim_logprobs(i, plan)
            tot["kl_q_slim"] += w * float(kl(self.target[i], s))
            tot["top1_agreement"] += w * float((s.argmax(-1) == self.target[i].argmax(-1)).float().mean())
            if objective == "pythagorean":
                tot["kl_p_slim"] += w * float(kl(self.draft[i], s))
                tot["kl_slim_q"] += w * float(kl(s, self.target[i]))
        tot["objective"] = tot["kl_q_slim"] if objective == "kl" else tot["kl_p_slim"] + tot["kl_slim_q"]
        return tot


def calibration_texts(sources: list[str], n: int, seed: int) -> list[str]:
    """About ``n`` calibration texts spread evenly over ``sources`` (interleaved).

    ``builtin`` is the built-in prompt set; other names are offline tasks, skipped with a
    warning when their data is missing (the built-in prompts are then used alone).
    """
    from viasd.tasks import build_task

    per = max(1, math.ceil(n / max(1, len(sources))))
    groups: list[list[str]] = []
    for src in sources:
        try:
            if src == "builtin":
                task = build_task({"name": "prompts", "path": None})
            else:
                task = build_task({"name": src, "n_examples": per, "seed": seed})
            groups.append([e.prompt for e in task.examples()][:per])
        except ConfigError as e:
            if src == "builtin" or len(sources) == 1:
                raise
            log.warning("DIMR calibration: skipping %s (%s)", src, e)
    texts = [t for row in itertools.zip_longest(*groups) for t in row if t is not None]
    return texts[:n]


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


def _random_baseline(calib: Calibration, n: int, cfg: SearchConfig, count: int) -> list[dict[str, Any]]:
    """``count`` seeded random masks of the budget, evaluated (distinct seeds; masks may repeat)."""
    out = []
    for s in tqdm(range(count), desc="random baseline", disable=count < 30):
        layers = random_mask(n, cfg.keep_ratio, 1000 + s)
        out.append({"seed": s, "layers": layers, **calib.evaluate(layers, cfg.objective)})
    return out


def search_mask(pair, cfg: SearchConfig, progress: bool = True,
                on_trial: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the DIMR search for one pair and budget; returns the mask artifact (and writes it).

    ``on_trial`` is called with each trial's record as soon as it is evaluated (e.g. a W&B logger).

    The artifact's ``n_trials`` counts the budget trials (random + BO); ``n_screen`` the
    screening evaluations (each single-layer drop, then the seed); ``n_evaluations`` both;
    ``baselines.random`` holds ``n_evaluations`` random masks unless ``n_baseline_random`` is set.
    """
    import optuna

    cfg.validate()
    t0 = time.perf_counter()
    n = num_layers(pair.target)
    k = budget(n, cfg.keep_ratio)
    texts = calibration_texts(cfg.calibration, cfg.n_calibration, cfg.seed)
    calib = Calibration(pair, texts, cfg.seq_len, cfg.batch_size, need_draft=cfg.objective == "pythagorean")
    middle = list(range(1, n - 1))
    seen: dict[tuple[int, ...], dict[str, float]] = {}
    trials: list[dict[str, Any]] = []

    def to_mask(scores: list[float]) -> tuple[int, ...]:
        top = sorted(middle, key=lambda i: -scores[i - 1])[: k - 2]
        return tuple(sorted({0, n - 1, *top})) if k < n else tuple(range(n))

    def record(mask: tuple[int, ...], number: int, phase: str) -> dict[str, float]:
        if mask not in seen:
            seen[mask] = calib.evaluate(list(mask), cfg.objective)
        trials.append({"number": number, "phase": phase, "layers": list(mask), **seen[mask],
                       "elapsed_s": time.perf_counter() - t0})
        if on_trial is not None:
            on_trial(trials[-1])
        return seen[mask]

    importance: dict[int, float] = {}
    if cfg.screen and k < n:  # layer screening: the cost of dropping each middle layer alone
        for j, i in enumerate(tqdm(middle, desc="DIMR screening", disable=not progress)):
            drop = tuple(x for x in range(n) if x != i)  # not of the budget: never the result
            importance[i] = record(drop, j - len(middle) - 1, "screen")["objective"]
        lo, hi = min(importance.values()), max(importance.values())
        seed_scores = [(importance[i] - lo) / ((hi - lo) or 1.0) for i in middle]
        record(to_mask(seed_scores), -1, "seed")  # keep the layers whose removal hurts most
    n_screen = len(trials)

    best = {"value": min((t["objective"] for t in trials if t["phase"] == "seed"), default=math.inf), "since": 0}
    bar = tqdm(total=cfg.n_trials, desc=f"DIMR {pair.name} keep={cfg.keep_ratio:.2f} ({cfg.sampler})",
               disable=not progress)

    offset = 1 if importance else 0  # the seed is the study's trial 0; budget trials count from 0

    def objective(trial: optuna.Trial) -> float:
        scores = [trial.suggest_float(f"s{i}", 0.0, 1.0) for i in middle]
        number = trial.number - offset
        phase = "random" if number < cfg.n_random or cfg.sampler == "random" else "bo"
        return record(to_mask(scores), number, phase)["objective"]

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
            params={f"s{i}": v for i, v in zip(middle, seed_scores)},
            distributions={f"s{i}": optuna.distributions.FloatDistribution(0.0, 1.0) for i in middle},
            value=trials[-1]["objective"]))
    remaining = cfg.time_budget_s - (time.perf_counter() - t0)
    study.optimize(objective, n_trials=cfg.n_trials, timeout=max(1.0, remaining), callbacks=[callback])
    bar.close()
    search_s = time.perf_counter() - t0
    budget_trials = [t for t in trials if t["phase"] in ("random", "bo")]
    best_trial = min((t for t in trials if t["phase"] != "screen"), key=lambda t: t["objective"])
    n_evals = len(trials)
    n_rand = cfg.n_baseline_random if cfg.n_baseline_random is not None else n_evals
    rnd = _random_baseline(calib, n, cfg, n_rand)
    baselines = {
        "first_k": {"layers": first_k_mask(n, cfg.keep_ratio), **calib.evaluate(first_k_mask(n, cfg.keep_ratio),
                                                                                 cfg.objective)},
        "every_other": {"layers": every_other_mask(n, cfg.keep_ratio),
                        **calib.evaluate(every_other_mask(n, cfg.keep_ratio), cfg.objective)},
        "random": rnd,
    }
    phase_best = {ph: min((t["objective"] for t in trials if t["phase"] == ph), default=None)
                  for ph in ("screen", "seed", "random", "bo")}
    log.info("DIMR %s keep %d/%d: %d evaluations (screening %d incl. seed, budget %d: random %d + BO %d) in %.0fs; "
             "best %s=%.4f (from %s; best per phase %s); best of %d random masks %.4f", pair.name, k, n, n_evals,
             n_screen, len(budget_trials), sum(t["phase"] == "random" for t in trials),
             sum(t["phase"] == "bo" for t in trials), search_s, cfg.objective, best_trial["objective"],
             best_trial["phase"], {p: round(v, 4) for p, v in phase_best.items() if v is not None}, len(rnd),
             min((r["objective"] for r in rnd), default=math.nan))
    art = {
        "pair": pair.name,
        "target": getattr(pair.target.config, "_name_or_path", ""),
        "target_revision": getattr(pair.target.config, "_commit_hash", None),
        "draft": getattr(pair.draft.config, "_name_or_path", "") if pair.draft is not None else None,
        "n_layers": n, "keep_ratio": cfg.keep_ratio, "budget": k, "objective": cfg.objective,
        "layers": best_trial["layers"], "value": best_trial["objective"], "best_phase": best_trial["phase"],
        "kl_q_slim": best_trial["kl_q_slim"], "top1_agreement": best_trial["top1_agreement"],
        "search_seconds": search_s, "sampler": cfg.sampler, "n_trials": len(budget_trials), "n_screen": n_screen,
        "n_evaluations": n_evals, "n_unique_masks": len(seen), "best_per_phase": phase_best,
        "calibration": {"sources": cfg.calibration, "n_texts": len(texts), "tokens": calib.n_tokens},
        "config": asdict(cfg), "trials": trials, "baselines": baselines,
    }
    out = Path(cfg.out) if cfg.out else mask_path(pair.name, cfg.keep_ratio, cfg.objective)
    atomic_write_json(out, art)
    art["path"] = str(out)
    return art


def kl_geometry(pair, layers: list[int] | None, texts: list[str], seq_len: int = 96,
                batch_size: int = 8) -> dict[str, float]:
    """KL(p‖q), KL(p‖q'), KL(q'‖q) and the TV distances, averaged over calibration tokens.

    ``layers``: the slim verifier's kept layers (None: the full target). The Pythagorean gap
    ``KL(p‖q) − (KL(p‖q') + KL(q'‖q))`` is positive when routing through ``q'`` is cheaper.
    """
    if pair.draft is None:
        raise no_draft_model("the KL geometry (experiments.kl)", getattr(pair, "name", "?"))
    calib = Calibration(pair, texts, seq_len, batch_size, need_draft=True)
    n = num_layers(pair.target)
    plan = RoutingPlan.build(layers if layers is not None else range(n), n)
    out = dict.fromkeys(("kl_p_q", "kl_p_slim", "kl_slim_q", "kl_q_slim", "tv_p_q", "tv_p_slim", "tv_slim_q"), 0.0)
    for i, b in enumerate(calib.batches):
        w = b.numel() / calib.n_tokens
        p, q = calib.draft[i], calib.target[i]
        s = calib.slim_logprobs(i, plan)
        for key, val in (("kl_p_q", kl(p, q)), ("kl_p_slim", kl(p, s)), ("kl_slim_q", kl(s, q)), ("kl_q_slim", kl(q, s)),
                         ("tv_p_q", tv(p, q)), ("tv_p_slim", tv(p, s)), ("tv_slim_q", tv(s, q))):
            out[key] += w * float(val)
    out["pythagorean_gap"] = out["kl_p_q"] - (out["kl_p_slim"] + out["kl_slim_q"])
    out["n_tokens"] = calib.n_tokens
    return out
