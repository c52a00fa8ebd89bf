"""Evaluation of a draft: agreement with the target, vocabulary coverage, forward cost.

This module owns the numbers a build reports: top-1 agreement with the target on held-out
prompts, teacher-forced on the target's greedy continuations (:func:`agreement`), the same
with prompt lookup first (:func:`lookup_agreement`, the ``hybrid`` drafter's rule), the share
of target tokens the draft's head can score (:func:`vocab_coverage`), and the micro-benchmark
of one cached forward (:func:`forward_cost_ms`, the ``c`` of the speedup formula).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from viasd.distill.runtime import torch_threads
from viasd.distill.teacher import TeacherSeq, collate
from viasd.engine.drafters import NgramDrafter


@torch.inference_mode()
def agreement(draft: PreTrainedModel, seqs: Sequence[TeacherSeq], seq_len: int = 4096, batch: int = 8) -> dict:
    """Top-1 agreement of ``draft`` with the target, teacher-forced on the target's continuations.

    ``seqs`` are read in batches of ``batch`` (:func:`viasd.distill.teacher.collate`, windows
    of at most ``seq_len`` tokens); the draft's logits ``[N, V]`` at the ``N`` continuation
    positions are compared with the target's greedy tokens ``[N]``.

    Returns ``{"agreement": float, "tokens": int, "by_source": {source: float}}``: the fraction
    of continuation positions where ``argmax draft == target greedy token``.
    """
    hits: dict[str, list[int]] = {}
    for i in range(0, len(seqs), batch):
        chunk = seqs[i : i + batch]
        bt = collate(chunk, seq_len)
        states = draft.get_decoder()(input_ids=bt.ids, use_cache=False).last_hidden_state
        pred = draft.get_output_embeddings()(states.reshape(-1, states.shape[-1])[bt.cont_pos]).argmax(-1)
        ok = (pred == bt.top_ids[:, 0]).long()
        j = 0
        for s, n in zip(chunk, bt.counts, strict=True):
            h = hits.setdefault(s.source, [0, 0])
            h[0] += int(ok[j : j + n].sum())
            h[1] += n
            j += n
    total = sum(v[1] for v in hits.values())
    good = sum(v[0] for v in hits.values())
    return {
        "agreement": good / max(total, 1),
        "tokens": total,
        "by_source": {k: v[0] / max(v[1], 1) for k, v in sorted(hits.items())},
    }


def vocab_coverage(seqs: Sequence[TeacherSeq], subset: list[int] | None) -> float:
    """Fraction of the continuation tokens (``s.cont [C]`` of every sequence) inside the head's
    token ids ``subset`` (1.0 for a full head, ``None``)."""
    if not subset:
        return 1.0
    cont = torch.cat([s.cont for s in seqs])
    return float(torch.isin(cont, torch.tensor(subset)).float().mean())


@torch.inference_mode()
def lookup_agreement(draft: PreTrainedModel, seqs: Sequence[TeacherSeq], min_match: int = 2) -> float:
    """Top-1 agreement of the ``hybrid`` drafter's rule (teacher-forced, per position): the
    prompt-lookup token when the last ``min_match``..3 tokens recur earlier in the context,
    else the draft's argmax (one forward of ``[1, P + C - 1]`` tokens per sequence, logits
    ``[1, P + C - 1, V]``). See :class:`viasd.engine.drafters.HybridDrafter`."""
    lookup = NgramDrafter(draft.config.vocab_size, ngram_max=3, ngram_min=min_match)
    good = total = 0
    for s in seqs:
        full = torch.cat([s.prompt, s.cont])
        p = len(s.prompt)
        pred = draft(full[None, :-1]).logits[0, p - 1 :].argmax(-1)
        for j in range(len(s.cont)):
            found, _ = lookup.propose(full[None, : p + j], 1, None, None)
            guess = int(found[0]) if len(found) else int(pred[j])
            good += guess == int(s.cont[j])
            total += 1
    return good / max(total, 1)


@torch.inference_mode()
def forward_cost_ms(
    model: PreTrainedModel,
    new_tokens: int = 1,
    context: int = 128,
    reps: int = 50,
    threads: int = 1,
    seed: int = 0,
) -> float:
    """Median wall time (ms) of one cached forward of ``new_tokens`` tokens after ``context``.

    Measures ``model(input_ids[1, new_tokens], cache=…)`` on a cache already holding
    ``context`` tokens (cropped back after every call), with ``threads`` torch threads, in the
    model's own dtype. The draft/target ratio of this number is the ``c`` of the speedup
    formula ``E / (γ·c + 1)``.
    """
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ctx = torch.randint(100, vocab - 1, (1, context + new_tokens), generator=gen)
    with torch_threads(threads):
        cache = model(ctx[:, :context], use_cache=True).cache
        x = ctx[:, context:]
        times = []
        for i in range(reps + 3):
            t = time.perf_counter()
            model(x, cache=cache, use_cache=True)
            if i >= 3:
                times.append(time.perf_counter() - t)
            cache.crop(-new_tokens)
    times.sort()
    return 1000.0 * times[len(times) // 2]
