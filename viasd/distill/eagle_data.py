"""The data side of training an EAGLE head: the recipe, its text, and the target features stored once.

This module owns :class:`EagleTrainConfig` (the recipe ``python -m experiments.train_eagle`` takes),
the training text — prompts from the distillation split of :mod:`viasd.distill.data` (rows no
evaluation slice uses; the built-in chat prompts alone without the data folder), split train/held-out
by prompt, each followed by the target's own greedy continuation (``text=greedy``, ``max_new`` tokens,
transformers' greedy ``generate``) or alone (``text=prompt``) — and the feature cache: one
teacher-forced target forward per sequence stores the features the head reads (``[n, F·Ht]``, bf16)
and the target's greedy next token at every position, in a file keyed by the target and the data
settings (:func:`feature_cache`); a rerun reuses it. The reduced vocabulary's tokens are the most
frequent of the training text (:func:`frequent_tokens`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from viasd.distill.config import DraftBuildConfig
from viasd.distill.data import select_prompts
from viasd.distill.runtime import progress_bar
from viasd.engine.eagle import eagle3_layers, target_features, target_fingerprint
from viasd.errors import ConfigError
from viasd.paths import cache_dir, data_dir

FEATURE_FORMAT = 2  # 2: each sequence records its prompt length


@dataclass
class EagleTrainConfig:
    """The recipe of one head (every field enters the feature-cache key or ``train_info.json``)."""

    features: Any = "last"  # last | eagle3 | a list of hidden_states indices
    draft_vocab: int | None = None  # reduced vocabulary size (most frequent target tokens); None: full, shared head
    intermediate: int | None = None  # the head's MLP width (None: the target's)
    text: str = "greedy"  # greedy (the target's continuations) | prompt (the prompts alone)
    n_texts: int = 64
    n_heldout: int = 8
    max_prompt: int = 192  # prompt tokens kept
    max_new: int = 64  # greedy continuation tokens per prompt
    max_steps: int = 200
    batch: int = 4  # windows per step
    window: int = 128  # slots per window
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    ttt: int = 3  # training-time-test draft steps per window
    k: int = 5  # draft positions the held-out acceptance reports
    eval_every: int = 0  # steps between held-out evaluations in the log (0: only at the end)
    checkpoint_every: int = 50
    seed: int = 0
    data: str = "auto"  # auto (the data folder when present) | builtin

    def validate(self) -> None:
        """Range checks (one error line each)."""
        if self.text not in ("greedy", "prompt"):
            raise ConfigError(f"text must be greedy or prompt (got {self.text!r})")
        if self.data not in ("auto", "builtin"):
            raise ConfigError(f"data must be auto or builtin (got {self.data!r})")
        for name in ("n_texts", "max_steps", "batch", "window", "ttt", "k", "checkpoint_every"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.draft_vocab is not None and self.draft_vocab < 2:
            raise ConfigError(f"draft_vocab must be at least 2 or null (got {self.draft_vocab})")

    def layers(self, n_layers: int) -> list[int]:
        """The feature layers (``hidden_states`` indices) this recipe reads from an ``n_layers`` target."""
        if self.features == "last":
            return [-1]
        if self.features == "eagle3":
            return eagle3_layers(n_layers)
        if isinstance(self.features, (list, tuple)) and all(isinstance(i, int) for i in self.features):
            return [int(i) for i in self.features]
        raise ConfigError(f"features must be last, eagle3 or a list of layer indices (got {self.features!r})")


@dataclass
class Seq:
    """One cached training sequence: tokens ``[n]``, features ``[n, F·Ht]`` (bf16), greedy ``[n]``
    (the target's argmax next token after each position), and how many of its tokens are the prompt."""

    ids: torch.Tensor
    feats: torch.Tensor
    greedy: torch.Tensor
    source: str = ""
    prompt: int = 0


@dataclass
class FeatureSet:
    """The train and held-out sequences and how long each stage took."""

    train: list[Seq]
    held: list[Seq]
    source: str
    seconds: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- text and features


def _encode(tokenizer, text: str, max_prompt: int) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_prompt]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": tokenizer.decode(ids)}],
                                            add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    elif tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id] + ids
    return list(ids)


@torch.no_grad()
def _sequence(target, ids: list[int], cfg: EagleTrainConfig) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long, device=target.device)
    if cfg.text == "greedy" and cfg.max_new > 0:
        x = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=cfg.max_new, do_sample=False,
                            pad_token_id=target.config.pad_token_id or 0)
    return x


def feature_key(target, cfg: EagleTrainConfig, layers: list[int], source: str) -> str:
    """Hash naming the feature cache of ``target`` under ``cfg``'s data settings."""
    data = {k: getattr(cfg, k) for k in ("text", "n_texts", "n_heldout", "max_prompt", "max_new", "seed")}
    blob = json.dumps({"target": target_fingerprint(target), "layers": layers, "data": data, "source": source,
                       "format": FEATURE_FORMAT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def feature_cache(target, tokenizer, cfg: EagleTrainConfig, cache_root: Path | None = None,
                  progress: bool = True) -> FeatureSet:
    """The recipe's sequences with their target features, computed once and cached on disk
    (``<cache>/eagle/features-<key>.pt``, written atomically, read with ``weights_only=True``)."""
    root = data_dir(required=False) if cfg.data == "auto" else None
    train_p, held_p, source = select_prompts(DraftBuildConfig(n_texts=cfg.n_texts, n_heldout=cfg.n_heldout,
                                                              seed=cfg.seed), root)
    n_layers = int(target.config.num_hidden_layers)
    layers = feature_layers_of_cfg(cfg, n_layers)
    folder = (Path(cache_root) if cache_root is not None else cache_dir()) / "eagle"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"features-{feature_key(target, cfg, layers, source)}.pt"
    if path.is_file():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            return FeatureSet([Seq(**s) for s in blob["train"]], [Seq(**s) for s in blob["held"]], source,
                              {"text": 0.0, "features": 0.0, "cached": 1.0})
        except Exception:  # noqa: BLE001  (a truncated cache is rebuilt)
            path.unlink(missing_ok=True)
    seconds = {"text": 0.0, "features": 0.0}
    out: dict[str, list[dict]] = {"train": [], "held": []}
    jobs = [("train", p) for p in train_p] + [("held", p) for p in held_p]
    for split, prompt in progress_bar(jobs, desc="eagle features", disable=not progress):
        t0 = time.perf_counter()
        enc = _encode(tokenizer, prompt.text, cfg.max_prompt)
        x = _sequence(target, enc, cfg)
        t1 = time.perf_counter()
        feats, logits = target_features(target, x, layers)
        seconds["text"] += t1 - t0
        seconds["features"] += time.perf_counter() - t1
        out[split].append({"ids": x[0].cpu(), "feats": feats[0].to(torch.bfloat16).cpu(),
                           "greedy": logits[0].argmax(-1).cpu(), "source": prompt.source, "prompt": len(enc)})
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(out, tmp)
    os.replace(tmp, path)
    return FeatureSet([Seq(**s) for s in out["train"]], [Seq(**s) for s in out["held"]], source, seconds)


def feature_layers_of_cfg(cfg: EagleTrainConfig, n_layers: int) -> list[int]:
    """The concrete ``hidden_states`` indices of ``cfg.features`` for an ``n_layers`` target."""
    return [n_layers if i == -1 else i for i in cfg.layers(n_layers)]


def frequent_tokens(seqs: list[Seq], vocab: int, n: int, always: list[int]) -> torch.Tensor:
    """The ``n`` most frequent target tokens of ``seqs`` (``always`` first, e.g. EOS), sorted ``LongTensor[n]``."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s.ids, minlength=vocab)[:vocab] + torch.bincount(s.greedy, minlength=vocab)[:vocab]
    counts[torch.tensor(always, dtype=torch.long)] = counts.max() + 1
    top = torch.topk(counts.float() + torch.linspace(1e-3, 0, vocab), min(n, vocab)).indices  # ties: lower id
    return torch.sort(top).values
