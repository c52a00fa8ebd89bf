"""Training an EAGLE head (:mod:`viasd.engine.eagle`) on a target: the loop and its held-out metrics.

This module owns the training behind ``python -m experiments.train_eagle`` (the recipe and its
cached target features: :mod:`viasd.distill.eagle_data`):

* **Training** — AdamW with linear warm-up and cosine decay (to 10%) over ``max_steps``; each step
  is a *training-time test* of ``ttt`` draft steps (EAGLE-3): step 1 reads the target's features,
  step ``s`` reads step ``s − 1``'s output of the previous slot, attending exactly as chain drafting
  does (:func:`ttt_mask`); loss = Σ_s 0.8^{s−1} · cross-entropy against the target's greedy token.
  A checkpoint (head, optimiser, scheduler, data RNG) every ``checkpoint_every`` steps lets a killed
  run resume where it stopped, to the same head.
* **Held-out acceptance** — per draft position ``j = 1..k``: the share of chains whose ``j``-th
  token equals the target's greedy token given that tokens ``1..j−1`` did (conditional acceptance
  ``α_j``), and the expected accepted tokens per draft of ``k`` (:func:`heldout_acceptance`).

The artifact is a head folder (:func:`viasd.engine.eagle_io.save_head`) plus ``train_info.json``
with the recipe, the times per stage, the metrics and the head's sha256
(:func:`viasd.engine.eagle_io.head_sha256`; ``weights_sha256`` is the hash a run id records).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.optim import lr_scheduler
from transformers import DynamicCache

from viasd.distill.eagle_data import EagleTrainConfig, Seq, feature_cache, frequent_tokens
from viasd.distill.runtime import progress_bar
from viasd.engine.eagle import EagleHead, target_fingerprint
from viasd.engine.eagle_io import head_sha256, new_head, save_head
from viasd.errors import ConfigError
from viasd.models.artifacts import sha256_file

# ---------------------------------------------------------------- the training-time test


def ttt_mask(n: int, s: int, device: torch.device) -> torch.Tensor:
    """``bool[1, 1, n, s·n]``: what step ``s`` (1-based) of slot ``i`` attends to over the keys of steps
    ``1..s`` (each ``n`` long, in order): step 1's keys of slots ``≤ i − s + 1`` (the true prefix), and
    step ``k``'s key of slot ``i − s + k`` for ``k = 2..s`` (the chain that led to it) — exactly what
    chain drafting's cache holds when it drafts that token."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    blocks = [j <= i - s + 1] + [j == i - s + k for k in range(2, s + 1)]
    if s == 1:
        blocks = [j <= i]
    return torch.cat(blocks, dim=1)[None, None]


def ttt_logits(head: EagleHead, feats: torch.Tensor, ids: torch.Tensor, greedy: torch.Tensor, steps: int,
               start: int = 0) -> list[torch.Tensor]:
    """Run ``steps`` draft steps over every slot of a window at once.

    Args:
        feats: ``[B, n, F·Ht]`` target features of positions ``start..start+n−1``.
        ids: ``LongTensor[B, n]`` the tokens one position later (step 1's inputs).
        greedy: ``LongTensor[B, n]`` the target's greedy token at each slot's token position (its
            prediction of ``ids``): step ``s ≥ 2`` of slot ``i`` is fed ``greedy[:, i]``, the token step
            ``s − 1`` of slot ``i − 1`` drafts when it is accepted.
        steps: draft steps (``s = 1..steps``).

    Returns:
        ``steps`` tensors ``[B, n, Vd]`` of draft-vocabulary logits; step ``s``'s slot ``i`` predicts the
        target's greedy token one position after ``ids[:, i]``, valid for ``i ≥ s − 1``.
    """
    B, n, _ = feats.shape
    cache = DynamicCache()
    positions = torch.arange(start, start + n, device=feats.device)[None]
    hidden = head.fuse(feats)
    tokens = ids
    out_all = []
    for s in range(1, steps + 1):
        out = head.layer(hidden, tokens, positions, ttt_mask(n, s, feats.device), cache)
        out_all.append(head.draft_logits(out))
        hidden = torch.cat([out[:, :1] * 0, out[:, :-1]], dim=1)  # slot i reads slot i − 1's output
        tokens = greedy
    return out_all


def _labels(head: EagleHead, greedy: torch.Tensor) -> torch.Tensor:
    """Target greedy ids ``[..]`` → draft-vocabulary rows (−100 outside the reduced vocabulary)."""
    if head.lm_head is None:
        return greedy
    rows = torch.full((head.spec.vocab,), -100, dtype=torch.long, device=greedy.device)
    rows[head.target_ids] = torch.arange(head.target_ids.numel(), device=greedy.device)
    return rows[greedy]


def ttt_loss(head: EagleHead, feats, ids, greedy, steps: int, start: int = 0) -> torch.Tensor:
    """Σ_s 0.8^{s−1} · CE(step ``s`` logits, the target's greedy token) over valid slots (scalar)."""
    logits = ttt_logits(head, feats, ids, greedy, steps, start)
    labels = _labels(head, greedy[:, 1:])
    total = feats.new_zeros(())
    for s, lg in enumerate(logits, start=1):
        lab = labels.clone()
        lab[:, : s - 1] = -100
        total = total + 0.8 ** (s - 1) * torch.nn.functional.cross_entropy(
            lg[:, :-1].reshape(-1, lg.shape[-1]), lab.reshape(-1), ignore_index=-100)
    return total


@torch.no_grad()
def heldout_acceptance(head: EagleHead, seqs: list[Seq], k: int, continuation: bool = True) -> dict[str, Any]:
    """Conditional acceptance ``α_j`` per draft position ``j = 1..k`` (greedy verification: the drafted
    token equals the target's greedy token) over the chains of ``seqs`` — with ``continuation``, only
    those that draft the part after the prompt (what decoding drafts; every chain of a sequence without
    one) — and ``accepted_per_draft`` = E[accepted tokens of a ``k``-token draft]."""
    was = head.training
    head.eval()
    hit = torch.zeros(k)
    tried = torch.zeros(k)
    chains = 0
    dev = head.fc.weight.device
    for s in seqs:
        n = s.ids.numel() - 1
        if n < 2:
            continue
        logits = ttt_logits(head, s.feats[:n][None].to(dev).float(), s.ids[1:][None].to(dev),
                            s.greedy[:n][None].to(dev), k)
        label = s.greedy[1:n + 1].to(dev)  # slot i's label: the target's greedy token after ids[i]
        skip = max(0, s.prompt - 2) if continuation and s.prompt < n else 0  # slot P − 2 drafts token P
        ok = torch.arange(n, device=dev) >= skip  # chain c starts with step 1 at slot c
        chains += int(ok.sum())
        for j, lg in enumerate(logits):  # draft j + 1 of chain c is step j + 1 at slot c + j
            drafted = head.target_ids[lg[0].argmax(-1)] if head.lm_head is not None else lg[0].argmax(-1)
            reach = torch.zeros(n, dtype=torch.bool, device=dev)
            reach[: n - j] = True
            correct = torch.zeros(n, dtype=torch.bool, device=dev)
            correct[: n - j] = (drafted == label)[j:]
            ok = ok & reach
            tried[j] += int(ok.sum())
            ok = ok & correct
            hit[j] += int(ok.sum())
    head.train(was)
    alpha = [float(h / t) if t else 0.0 for h, t in zip(hit, tried)]
    cum = [float(h / max(chains, 1)) for h in hit]
    return {"alpha": alpha, "p_reach": cum, "accepted_per_draft": sum(cum), "chains": chains}


# ---------------------------------------------------------------- the loop


def _windows(seqs: list[Seq], cfg: EagleTrainConfig, gen: torch.Generator, device) -> tuple:
    """A batch of ``cfg.batch`` equal-length windows (features, tokens, greedy, start)."""
    pick = torch.randint(len(seqs), (cfg.batch,), generator=gen).tolist()
    n = min(cfg.window, min(seqs[i].ids.numel() - 1 for i in pick))
    feats, ids, greedy = [], [], []
    start = 0
    for i in pick:
        s = seqs[i]
        hi = s.ids.numel() - 1 - n
        start = int(torch.randint(hi + 1, (1,), generator=gen)) if hi > 0 else 0
        feats.append(s.feats[start:start + n])
        ids.append(s.ids[start + 1:start + 1 + n])
        greedy.append(s.greedy[start:start + n])
    return (torch.stack(feats).to(device).float(), torch.stack(ids).to(device), torch.stack(greedy).to(device))


def _schedule(cfg: EagleTrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / max(cfg.warmup, 1)
        done = (step - cfg.warmup) / max(cfg.max_steps - cfg.warmup, 1)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))
    return f


def train_head(target, tokenizer, cfg: EagleTrainConfig, out: str | Path, cache_root: Path | None = None,
               progress: bool = True, log=print) -> dict[str, Any]:
    """Train (or resume) a head for ``target`` under ``cfg`` and write it to ``out``; returns ``train_info``.

    A checkpoint ``<out>.partial/checkpoint.pt`` is written every ``cfg.checkpoint_every`` steps and read
    back by a rerun with the same recipe (a different recipe: one error line naming the fix).
    """
    cfg.validate()
    out = Path(out)
    t0 = time.perf_counter()
    data = feature_cache(target, tokenizer, cfg, cache_root, progress)
    if not data.train:
        raise ConfigError("no training text: check data= and n_texts=")
    t_feat = time.perf_counter() - t0
    n_layers = int(target.config.num_hidden_layers)
    V = target.get_input_embeddings().weight.shape[0]
    draft_ids = None
    if cfg.draft_vocab is not None and cfg.draft_vocab < V:
        eos = target.config.eos_token_id
        always = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        draft_ids = frequent_tokens(data.train, V, cfg.draft_vocab, always)
    head = new_head(target, cfg.layers(n_layers), draft_ids, cfg.intermediate, cfg.seed)
    for p in target.parameters():
        p.requires_grad_(False)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = lr_scheduler.LambdaLR(opt, _schedule(cfg))
    gen = torch.Generator().manual_seed(cfg.seed)
    recipe = dataclasses.asdict(cfg)
    partial = out.with_name(out.name + ".partial")
    ckpt = partial / "checkpoint.pt"
    step, losses = 0, []
    if ckpt.is_file():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        if json.loads(state["recipe"]) != json.loads(json.dumps(recipe)):
            raise ConfigError(f"{ckpt} is a checkpoint of another recipe; delete {partial} or rerun with its arguments")
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        gen.set_state(state["gen"])
        step, losses = int(state["step"]), list(state["losses"])
        log(f"resumed from {ckpt} at step {step}")
    at_init = heldout_acceptance(head, data.held, cfg.k) if step == 0 and data.held else None
    head.train()
    t1 = time.perf_counter()
    bar = progress_bar(total=cfg.max_steps, initial=step, desc="eagle head", disable=not progress)
    while step < cfg.max_steps:
        feats, ids, greedy = _windows(data.train, cfg, gen, head.fc.weight.device)
        loss = ttt_loss(head, feats, ids, greedy, cfg.ttt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        step += 1
        losses.append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if cfg.eval_every and step % cfg.eval_every == 0 and data.held:
            acc = heldout_acceptance(head, data.held, cfg.k)
            log(f"step {step}: loss {losses[-1]:.3f}, held-out α per position "
                f"{' '.join(f'{a:.2f}' for a in acc['alpha'])}, {acc['accepted_per_draft']:.2f} tokens per draft")
        if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
            partial.mkdir(parents=True, exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "gen": gen.get_state(), "step": step, "losses": losses, "recipe": json.dumps(recipe)}, tmp)
            os.replace(tmp, ckpt)
    bar.close()
    t_train = time.perf_counter() - t1
    head.eval()
    final = heldout_acceptance(head, data.held, cfg.k) if data.held else None
    save_head(head, out)
    info = {"recipe": recipe, "target": target_fingerprint(target),
            "target_name": str(getattr(target.config, "_name_or_path", "")), "data_source": data.source,
            "train_sequences": len(data.train), "heldout_sequences": len(data.held),
            "train_tokens": sum(s.ids.numel() for s in data.train),
            "draft_vocab": int(head.spec.draft_vocab), "feature_layers": head.spec.feature_layers,
            "steps": step, "final_loss": losses[-1] if losses else None,
            "heldout_at_init": at_init, "heldout": final, "threads": torch.get_num_threads(),
            "seconds": {"text": round(data.seconds.get("text", 0.0), 2),
                        "features": round(data.seconds.get("features", 0.0), 2),
                        "feature_stage_total": round(t_feat, 2), "train": round(t_train, 2)},
            "features_cached": bool(data.seconds.get("cached")), "sha256": head_sha256(out),
            "weights_sha256": sha256_file(out / "model.safetensors")}
    (out / "train_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    if ckpt.is_file():
        ckpt.unlink()
        partial.rmdir()
    return info
