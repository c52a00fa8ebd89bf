"""DIMR: offline search for the slim verifier's routing mask (DESIGN §3).

Objective on teacher-forced calibration text (one forward per model per batch, target and
draft log-probs computed once): ``kl`` = ``KL(q ‖ q'_z)`` or ``pythagorean`` =
``KL(p ‖ q'_z) + KL(q'_z ‖ q)``, averaged over tokens. Candidates keep the first and last
layer and ``budget(n, keep_ratio)`` layers in all. Search = ``n_random`` random masks, then
Bayesian optimization (optuna TPE, whose start-up phase *is* the random phase, so the model is
seeded with those trials), with early stopping after ``patience`` trials without improvement
and a time budget. A mask is parametrized by one score per middle layer; the top-scoring
layers are kept.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, EncoderDecoderCache

from viasd.dimr.masks import budget, every_other_mask, first_k_mask, mask_path, random_mask
from viasd.errors import ConfigError, no_draft_model
from viasd.models.routing import CausalPath, RoutingPlan, num_layers, routed_forward
from viasd.tracking.store import atomic_write_json

log = logging.getLogger(__name__)

OBJECTIVES = ("kl", "pythagorean")
MEMO_ENTRIES = 256  # memoized (batch, layer prefix) hidden states


@dataclass
class SearchConfig:
    """DIMR search settings (``conf/search/default.yaml``)."""

    keep_ratio: float = 0.5
    objective: str = "kl"
    n_random: int = 20
    n_trials: int = 150
    patience: int = 40
    time_budget_s: float = 300.0
    seed: int = 0
    calibration: list[str] = field(default_factory=lambda: ["builtin"])
    n_calibration: int = 8
    seq_len: int = 48
    batch_size: int = 8
    n_baseline_random: int = 20
    out: str | None = None  # default: the mask cache path
    dtype: str = "float32"  # models run in this dtype during the search (bf16 GEMMs are slow on CPU)
    screen: bool = True  # score every single-layer drop first and seed the optimizer with the ranking

    def validate(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"search.objective must be one of {OBJECTIVES} (got {self.objective!r})")
        if not 0 < self.keep_ratio <= 1:
            raise ConfigError(f"search.keep_ratio must be in (0, 1] (got {self.keep_ratio})")


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
        ids = []
        for t in texts:
            x = tok(t, add_special_tokens=True).input_ids[:seq_len]
            if len(x) >= 8:
                ids.append(x)
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
    """Calibration text: task inputs (offline files) or the built-in prompts."""
    from viasd.tasks import build_task

    texts: list[str] = []
    per = max(1, math.ceil(n / max(1, len(sources))))
    for src in sources:
        if src == "builtin":
            task = build_task({"name": "prompts", "path": None})
        else:
            task = build_task({"name": src, "n_examples": per, "seed": seed})
        texts += [e.prompt for e in task.examples()][:per]
    return texts[:n] if len(texts) >= n else texts


def search_mask(pair, cfg: SearchConfig, progress: bool = True) -> dict[str, Any]:
    """Run the DIMR search for one pair and budget; returns the mask artifact (and writes it)."""
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

    def to_mask(scores: list[float]) -> list[int]:
        top = sorted(middle, key=lambda i: -scores[i - 1])[: k - 2]
        return sorted({0, n - 1, *top})

    importance: dict[int, float] = {}
    if cfg.screen and k < n:  # layer screening: the cost of dropping each middle layer alone
        for i in tqdm(middle, desc="DIMR screening", disable=not progress):
            mask = tuple(j for j in range(n) if j != i)
            seen[mask] = calib.evaluate(list(mask), cfg.objective)
            importance[i] = seen[mask]["objective"]
            trials.append({"number": -len(middle) + len(importance) - 1, "phase": "screen", "layers": list(mask),
                           **seen[mask], "elapsed_s": time.perf_counter() - t0})

    def objective(trial: optuna.Trial) -> float:
        scores = [trial.suggest_float(f"s{i}", 0.0, 1.0) for i in middle]
        mask = tuple(to_mask(scores)) if k < n else tuple(range(n))
        if mask not in seen:
            seen[mask] = calib.evaluate(list(mask), cfg.objective)
        res = seen[mask]
        phase = "seed" if importance and trial.number == 0 else "random" if trial.number < cfg.n_random else "bo"
        trials.append({"number": trial.number, "phase": phase, "layers": list(mask), **res,
                       "elapsed_s": time.perf_counter() - t0})
        return res["objective"]

    best = {"value": math.inf, "since": 0}
    bar = tqdm(total=cfg.n_trials, desc=f"DIMR {pair.name} keep={cfg.keep_ratio:.2f}", disable=not progress)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        bar.update(1)
        if trial.value is not None and trial.value < best["value"] - 1e-9:
            best["value"], best["since"] = trial.value, 0
        else:
            best["since"] += 1
        bar.set_postfix(best=f"{best['value']:.4f}")
        if trial.number >= cfg.n_random and best["since"] >= cfg.patience:
            study.stop()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(n_startup_trials=cfg.n_random, seed=cfg.seed, multivariate=True)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if importance:  # seed: keep the layers whose removal hurts most
        lo, hi = min(importance.values()), max(importance.values())
        study.enqueue_trial({f"s{i}": (importance[i] - lo) / ((hi - lo) or 1.0) for i in middle})
    remaining = cfg.time_budget_s - (time.perf_counter() - t0)
    study.optimize(objective, n_trials=cfg.n_trials, timeout=max(1.0, remaining), callbacks=[callback])
    bar.close()
    search_s = time.perf_counter() - t0
    best_trial = min((t for t in trials if t["phase"] != "screen"), key=lambda t: t["objective"])
    baselines = {
        "first_k": {"layers": first_k_mask(n, cfg.keep_ratio), **calib.evaluate(first_k_mask(n, cfg.keep_ratio),
                                                                                 cfg.objective)},
        "every_other": {"layers": every_other_mask(n, cfg.keep_ratio),
                        **calib.evaluate(every_other_mask(n, cfg.keep_ratio), cfg.objective)},
        "random": [{"seed": s, "layers": random_mask(n, cfg.keep_ratio, 1000 + s),
                    **calib.evaluate(random_mask(n, cfg.keep_ratio, 1000 + s), cfg.objective)}
                   for s in range(cfg.n_baseline_random)],
    }
    art = {
        "pair": pair.name,
        "target": getattr(pair.target.config, "_name_or_path", ""),
        "target_revision": getattr(pair.target.config, "_commit_hash", None),
        "draft": getattr(pair.draft.config, "_name_or_path", "") if pair.draft is not None else None,
        "n_layers": n, "keep_ratio": cfg.keep_ratio, "budget": k, "objective": cfg.objective,
        "layers": best_trial["layers"], "value": best_trial["objective"],
        "kl_q_slim": best_trial["kl_q_slim"], "top1_agreement": best_trial["top1_agreement"],
        "search_seconds": search_s, "n_trials": len(trials), "n_unique_masks": len(seen),
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
