"""Distillation training: the losses, the learning-rate schedule and the training loop.

This module owns how the draft learns: teacher-forced on prompt + continuation (right
padding, causal, no mask needed), ``hidden_weight`` × relative MSE between the draft's final
state and the target's projected final state at every position (cheap and dense: no LM
head) + ``kd_weight`` × ``[(1-h)·CE(top-k teacher ‖ draft) + h·CE(teacher argmax)]`` on
continuation positions; AdamW with linear warmup then cosine decay (torch's
``lr_scheduler``); fp32 (bf16 matmuls are ~80× slower on CPUs without AVX512-BF16, measured).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.optim import lr_scheduler

from viasd.distill.config import DraftBuildConfig
from viasd.distill.draft_model import SubsetHead, SubsetHeadLlamaForCausalLM
from viasd.distill.runtime import progress_bar
from viasd.distill.teacher import TeacherSeq, collate


def distill_loss(
    logits: torch.Tensor, top_ids: torch.Tensor, top_lp: torch.Tensor, hard_weight: float
) -> torch.Tensor:
    """``(1-h)·Σ_k p̂_k·(−log q_k) + h·(−log q_{top1})``.

    ``logits [N, V']`` draft logits over its own columns; ``top_ids [N, k]`` the teacher's
    top-k tokens as columns of ``logits`` (``-1``: a token the draft cannot score, left out),
    ``top_lp [N, k]`` their teacher log-probs; ``p̂`` = teacher probabilities of the scorable
    top-k tokens renormalized to sum to 1; the hard term counts rows whose top-1 is scorable.
    """
    logq = torch.log_softmax(logits.float(), dim=-1)
    valid = top_ids >= 0
    picked = logq.gather(1, top_ids.clamp_min(0))  # [N, k]
    w = torch.softmax(top_lp.masked_fill(~valid, float("-inf")), dim=-1).nan_to_num(0.0)
    soft = -(w * picked).sum(-1)
    hard = -(picked[:, 0] * valid[:, 0]).sum() / valid[:, 0].sum().clamp_min(1)
    return (1.0 - hard_weight) * soft.mean() + hard_weight * hard


def hidden_loss(states: torch.Tensor, target_states: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Relative squared error ``Σ‖s − Bᵀz‖² / Σ‖Bᵀz‖²``.

    ``states [M, hidden]`` the draft's final normed states, ``target_states [M, H_t]`` the
    target's, ``basis [H_t, hidden]`` the output basis.
    """
    goal = target_states @ basis
    return (states - goal).pow(2).sum() / goal.pow(2).sum().clamp_min(1e-6)


def _length_bucketed_batches(lengths: Sequence[int], batch: int, gen: torch.Generator) -> list[list[int]]:
    """One epoch of batches (seeded): shuffle, sort each window of 8 batches by length (less
    padding), cut into batches, shuffle the batch order."""
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    window = batch * 8
    batches: list[list[int]] = []
    for i in range(0, len(perm), window):
        chunk = sorted(perm[i : i + window], key=lambda j: lengths[j])
        batches += [chunk[k : k + batch] for k in range(0, len(chunk), batch)]
    order = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[k] for k in order]


def warmup_cosine(opt: torch.optim.Optimizer, steps: int, warmup: float) -> lr_scheduler.SequentialLR:
    """Linear warmup then cosine decay to a tenth of the peak, stepped once per optimizer step.

    With ``w = max(1, int(warmup · steps))`` and peak ``lr`` (the optimizer's lr, one for all
    groups), step ``s`` trains at ``lr · (s + 1) / w`` for ``s < w``, then at
    ``lr · (0.1 + 0.45 · (1 + cos(π (s − w) / max(1, steps − w))))``.
    """
    warm = max(1, int(warmup * steps))
    peak = opt.param_groups[0]["lr"]
    ramp = lr_scheduler.LinearLR(opt, start_factor=1 / warm, end_factor=1.0, total_iters=warm - 1)
    decay = lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps - warm), eta_min=0.1 * peak)
    return lr_scheduler.SequentialLR(opt, [ramp, decay], milestones=[warm])


def train_draft(
    draft: SubsetHeadLlamaForCausalLM,
    train: Sequence[TeacherSeq],
    cfg: DraftBuildConfig,
    out_basis: torch.Tensor,
    progress: bool = True,
    on_step=None,
) -> list[float]:
    """Distill ``draft`` on the teacher sequences in place; returns the loss per step.

    Each step reads ``cfg.batch`` sequences (:func:`viasd.distill.teacher.collate`: ids
    ``[B, T]``); loss = ``hidden_weight · hidden_loss`` (the draft's final states ``[M, hidden]``
    against the target's ``[M, H_t]`` projected on ``out_basis [H_t, hidden]``, all positions)
    ``+ kd_weight · distill_loss`` (continuation positions). AdamW (no decay on embeddings,
    head, norms and biases), gradient norm clipped at 1, learning rate from
    :func:`warmup_cosine`. ``on_step(step, draft)`` is called after each step (for learning
    curves).
    """
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    decay = [p for n, p in draft.named_parameters() if p.ndim >= 2 and "embed" not in n and "lm_head" not in n]
    other = [p for n, p in draft.named_parameters() if not (p.ndim >= 2 and "embed" not in n and "lm_head" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8,
    )  # fmt: skip
    schedule = warmup_cosine(opt, cfg.steps, cfg.warmup)
    draft.train()
    body, head = draft.get_decoder(), draft.get_output_embeddings()
    if isinstance(head, SubsetHead):  # teacher ids -> head columns (-1: not scored)
        column = torch.full((head.vocab,), -1, dtype=torch.long)
        column[head.ids] = torch.arange(len(head.id_list))
        scores = head.scores
    else:
        column, scores = None, head
    losses: list[float] = []
    queue: list[list[int]] = []
    bar = progress_bar(range(cfg.steps), desc="distilling draft", disable=not progress)
    for step in bar:
        if not queue:
            queue = _length_bucketed_batches([len(s.prompt) + len(s.cont) for s in train], cfg.batch, gen)
        bt = collate([train[i] for i in queue.pop()], cfg.seq_len)
        states = body(input_ids=bt.ids, use_cache=False).last_hidden_state
        flat = states.reshape(-1, states.shape[-1])
        loss = cfg.hidden_weight * hidden_loss(flat[bt.hid_pos], bt.hid, out_basis)
        if cfg.kd_weight > 0:
            ids = column[bt.top_ids] if column is not None else bt.top_ids
            loss = loss + cfg.kd_weight * distill_loss(scores(flat[bt.cont_pos]), ids, bt.top_lp, cfg.hard_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if step % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")
        if on_step is not None:
            on_step(step, draft)
            draft.train()
    draft.eval()
    return losses
