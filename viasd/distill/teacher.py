"""Teacher data: the target's greedy continuations, top-k log-probs and final hidden states.

This module owns what the draft learns from: :class:`TeacherSeq` (one prompt and the
target's continuation), batched greedy decoding that records it
(:func:`greedy_with_states`, :func:`teacher_continuations`), its cache in
``<drafts_root>/teacher-<hash>/`` (:func:`teacher_data`, manifest-verified like the draft,
so rebuilding a draft with other training knobs does not regenerate it), and the
teacher-forced batches that training and evaluation read (:func:`collate`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from viasd.distill.cache import target_fingerprint
from viasd.distill.config import TEACHER_FORMAT, DraftBuildConfig
from viasd.distill.data import Prompt, encode_prompt, prompt_key
from viasd.distill.runtime import progress_bar
from viasd.models.artifacts import (
    atomic_publish,
    remove_broken,
    say,
    verify_manifest,
    write_manifest,
)
from viasd.utils.fs import file_lock


@dataclass
class TeacherSeq:
    """One prompt and the target's greedy continuation.

    ``prompt``: ``[P]`` int64 ids; ``cont``: ``[C]`` int64 greedy tokens (ends with EOS if the
    target stopped); ``top_ids``: ``[C, k]`` int32 and ``top_lp``: ``[C, k]`` fp16 — the
    target's top-k log-probs (full-vocab log-softmax) at each continuation position
    (``top_ids[:, 0] == cont``); ``hidden``: ``[P + C - 1, H]`` fp16 — the target's final
    (normed) hidden state at every input position, i.e. what its LM head reads.
    """

    source: str
    prompt: torch.Tensor
    cont: torch.Tensor
    top_ids: torch.Tensor
    top_lp: torch.Tensor
    hidden: torch.Tensor


@torch.inference_mode()
def greedy_with_states(
    target: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, max_new: int, eos: int, topk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched greedy decoding that also returns what distillation needs.

    ``ids, mask``: ``[B, P]`` left-padded prompts and their attention mask. Returns
    ``new [B, T]`` greedy tokens (rows continue past their EOS; callers cut there),
    ``top_lp, top_ids [B, T, k]`` full-vocab log-probs of the top-k tokens at each step, and
    ``hidden [B, P + T - 1, H]`` the final normed hidden states at every input position.
    Same tokens as ``target.generate(do_sample=False)`` (one body call per step + LM head).
    """
    body, head = target.get_decoder(), target.get_output_embeddings()
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    out = body(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    cache, states = out.cache, [out.last_hidden_state]
    last = out.last_hidden_state[:, -1]
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    toks, lps, tids = [], [], []
    for step in range(max_new):
        top = torch.log_softmax(head(last).float(), dim=-1).topk(topk, dim=-1)
        nxt = top.indices[:, 0]
        toks.append(nxt)
        lps.append(top.values)
        tids.append(top.indices)
        done |= nxt == eos
        if bool(done.all()) or step == max_new - 1:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        pos = pos[:, -1:] + 1
        out = body(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        cache = out.cache
        states.append(out.last_hidden_state)
        last = out.last_hidden_state[:, -1]
    return torch.stack(toks, 1), torch.stack(lps, 1), torch.stack(tids, 1), torch.cat(states, 1)


def teacher_continuations(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    cfg: DraftBuildConfig,
    progress: bool = True,
    desc: str = "target greedy continuations",
) -> list[TeacherSeq]:
    """Greedy continuations of ``prompts`` by ``target``, one :class:`TeacherSeq` per prompt, in order.

    Prompts are chat-templated (:func:`~viasd.distill.data.encode_prompt`), sorted by length
    and decoded ``cfg.gen_batch`` at a time as left-padded ``[B, P_max]`` batches
    (:func:`greedy_with_states`, up to ``cfg.gen_tokens`` tokens, ``cfg.topk`` log-probs kept);
    each continuation is cut after its first EOS."""
    encoded = [encode_prompt(tokenizer, p.text, cfg.prompt_tokens) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (len(encoded[i]), i))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    results: dict[int, TeacherSeq] = {}
    bar = progress_bar(total=len(prompts), desc=desc, disable=not progress)
    for b in range(0, len(order), cfg.gen_batch):
        idx = order[b : b + cfg.gen_batch]
        width = max(len(encoded[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, width - len(encoded[i]) :] = torch.tensor(encoded[i])
            mask[row, width - len(encoded[i]) :] = 1
        new, top_lp, top_ids, hidden = greedy_with_states(target, ids, mask, cfg.gen_tokens, eos, cfg.topk)
        for row, i in enumerate(idx):
            hits = (new[row] == eos).nonzero()
            n = int(hits[0]) + 1 if len(hits) else new.shape[1]
            p = len(encoded[i])
            results[i] = TeacherSeq(
                source=prompts[i].source,
                prompt=torch.tensor(encoded[i], dtype=torch.long),
                cont=new[row, :n].clone(),
                top_ids=top_ids[row, :n].to(torch.int32).clone(),
                top_lp=top_lp[row, :n].to(torch.float16).clone(),
                hidden=hidden[row, width - p : width + n - 1].to(torch.float16).clone(),
            )
        bar.update(len(idx))
    bar.close()
    return [results[i] for i in range(len(prompts))]


def teacher_data(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: DraftBuildConfig,
    train_p: Sequence[Prompt],
    held_p: Sequence[Prompt],
    drafts_root: Path,
    progress: bool = True,
) -> tuple[list[TeacherSeq], list[TeacherSeq], bool]:
    """Teacher sequences for the training and held-out prompts, cached in
    ``<drafts_root>/teacher-<hash>/`` (same manifest rules as the draft) so that rebuilding a
    draft with other training knobs does not regenerate them. Returns ``(train, held, reused)``."""
    key = {
        "target": target_fingerprint(target),
        "prompts": [f"{p.source}:{p.ref}:{prompt_key(p.text)}" for p in (*train_p, *held_p)],
        "knobs": [cfg.prompt_tokens, cfg.gen_tokens, cfg.gen_batch, cfg.topk],
        "format": TEACHER_FORMAT,
    }
    folder = drafts_root / f"teacher-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]}"
    with file_lock(drafts_root / f".{folder.name}.lock"):
        reason = verify_manifest(folder)
        if reason is None:
            data = torch.load(folder / "teacher.pt", weights_only=True)
            say(progress, f"reusing cached teacher continuations {folder.name}")
            return [TeacherSeq(**d) for d in data["train"]], [TeacherSeq(**d) for d in data["held"]], True
        if reason != "missing":
            remove_broken(folder, reason, progress)
        was_training = target.training
        target.eval()
        try:
            train = teacher_continuations(target, tokenizer, train_p, cfg, progress)
            held = teacher_continuations(target, tokenizer, held_p, cfg, progress, desc="held-out continuations")
        finally:
            target.train(was_training)
        tmp = Path(tempfile.mkdtemp(dir=drafts_root, prefix=f".tmp-{folder.name}-"))
        try:
            torch.save({"train": [dataclasses.asdict(x) for x in train], "held": [dataclasses.asdict(x) for x in held]},
                       tmp / "teacher.pt")  # fmt: skip
            write_manifest(tmp, {"tokens": int(sum(len(x.cont) for x in train)), "created_unix": time.time()})
            atomic_publish(tmp, folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return train, held, False


def _window(s: TeacherSeq, seq_len: int) -> tuple[int, int]:
    """``(start, n_cont)``: the window ``full[start : P + n_cont]`` used for ``s`` (at most
    ``seq_len`` tokens; the prompt's head is dropped first; at least 16 continuation tokens)."""
    p = len(s.prompt)
    n_cont = min(len(s.cont), max(0, seq_len - p)) or min(len(s.cont), 16)
    return max(0, p + n_cont - seq_len), n_cont


@dataclass
class TeacherBatch:
    """Teacher sequences collated for one teacher-forced pass (see :func:`collate`)."""

    ids: torch.Tensor  # [B, T] right-padded
    hid_pos: torch.Tensor  # [M] flat positions (b*T + t) with a hidden-state target
    hid: torch.Tensor  # [M, H_t] target final states there
    cont_pos: torch.Tensor  # [N] flat positions whose output predicts a continuation token
    top_ids: torch.Tensor  # [N, k]
    top_lp: torch.Tensor  # [N, k]
    counts: list[int]  # continuation positions per sequence


def collate(seqs: Sequence[TeacherSeq], seq_len: int) -> TeacherBatch:
    """Right-padded ``ids [B, T]`` of each sequence's window (:func:`_window`, at most ``seq_len``
    tokens) with flat positions ``b*T + t`` of the hidden-state targets ``hid [M, H_t]`` (every
    input position) and of the outputs predicting continuation tokens, whose teacher top-k is
    ``top_ids, top_lp [N, k]``; ``counts[b]`` continuation positions per sequence."""
    rows, hid_pos, hid, cont_pos, tids, tlps, counts = [], [], [], [], [], [], []
    windows = [_window(s, seq_len) for s in seqs]
    width = max(len(s.prompt) + n - st for s, (st, n) in zip(seqs, windows, strict=True))
    for b, (s, (start, n_cont)) in enumerate(zip(seqs, windows, strict=True)):
        p = len(s.prompt)
        full = torch.cat([s.prompt, s.cont])[start : p + n_cont]
        rows.append(full)
        # outputs at window positions 0..len-2 predict the next token; hidden[j] is at input j
        n_in = len(full) - 1
        hid_pos.append(torch.arange(n_in) + b * width)
        hid.append(s.hidden[start : start + n_in])
        first = p - 1 - start  # output predicting the first continuation token
        cont_pos.append(torch.arange(first, first + n_cont) + b * width)
        tids.append(s.top_ids[:n_cont].long())
        tlps.append(s.top_lp[:n_cont].float())
        counts.append(n_cont)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
    return TeacherBatch(ids, torch.cat(hid_pos), torch.cat(hid).float(), torch.cat(cont_pos), torch.cat(tids),
                        torch.cat(tlps), counts)  # fmt: skip
