"""Build (distill) and cache the draft model of the embedded default pair.

This module owns the project-built draft for SmolLM2-135M-Instruct: a small
``LlamaForCausalLM`` that shares the target's tokenizer (vocab 49152), distilled on CPU in
minutes against the target's own greedy continuations of task-like chat prompts.

Recipe (every knob is a :class:`DraftBuildConfig` field):

1. **Prompts** — task-like prompts (summarization, translation, math, QA, code, open
   writing) built from the offline data folder, from rows that the evaluation slices are
   unlikely to use (e.g. XSum rows 500+, WMT16 rather than WMT14, MBPP train/validation,
   NQ EfficientQA), de-duplicated by a normalized-text fingerprint and split train/held-out
   by a hash of that fingerprint, so held-out prompts share no text with training prompts.
   Without the data folder: the built-in prompts of :data:`BUILTIN_PROMPTS`.
2. **Teacher data** — the target greedily continues each chat-templated prompt (batched,
   left-padded, one body call per step); kept per sequence: the top-k target log-probs
   (full-vocab log-softmax) at each continuation position (sparse: int32 ids + fp16 values)
   and the target's final normed hidden state at every position (fp16).
3. **Draft** — ``layers`` × ``hidden`` Llama, untied: input embedding = the target's
   embedding matrix projected on its top ``hidden`` principal directions; LM head = the
   target's embedding projected on the top ``hidden`` principal directions of the target's
   *final hidden states* (that subspace keeps the target's greedy token 69% of the time at
   k=256, the embedding's own subspace 13%), restricted to the ``draft_vocab`` most frequent
   tokens of the teacher data (:mod:`viasd.models.draft_model`: the head dominates a small
   draft's cost on CPU).
4. **Distillation** — teacher-forced on prompt + continuation (right padding, causal, no
   mask needed): ``hidden_weight`` × relative MSE between the draft's final state and the
   target's projected final state at every position (cheap and dense: no LM head) +
   ``kd_weight`` × ``[(1-h)·CE(top-k teacher ‖ draft) + h·CE(teacher argmax)]`` on
   continuation positions; AdamW, warmup + cosine; fp32 (bf16 matmuls are ~80× slower on
   CPUs without AVX512-BF16, measured).
5. **Report** — top-1 agreement with the target on held-out prompts, teacher-forced on the
   target's greedy continuations.

The result is cached in ``<cache_root>/drafts/<name>-<hash>/`` (hash of the config, the
target's identity and the data source), written atomically with a verified manifest exactly
like the converted target (see :mod:`viasd.models.smollm2`): a truncated or altered
checkpoint is detected, deleted and rebuilt, never loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase

from viasd.models.draft_model import SubsetHead, SubsetHeadLlamaForCausalLM, make_config
from viasd.models.smollm2 import (
    atomic_publish,
    file_lock,
    hf_progress_bars,
    remove_broken,
    verify_manifest,
    write_manifest,
)
from viasd.paths import cache_dir, data_dir

BUILD_FORMAT = 3  # the draft artifact (3: vocabulary-subset head)
TEACHER_FORMAT = 2  # the cached teacher sequences (2: + final hidden states)


@dataclass(frozen=True)
class DraftBuildConfig:
    """How to build the draft. Every field except ``threads`` enters the cache key.

    Architecture: ``layers`` decoder layers of width ``hidden`` with ``heads`` query heads,
    ``kv_heads`` key/value heads and MLP width ``intermediate``; untied embeddings; the LM head
    scores the ``draft_vocab`` most frequent tokens of the teacher data (0: all tokens; see
    :mod:`viasd.models.draft_model`).
    Data: ``n_texts`` training prompts and ``n_heldout`` held-out prompts, each truncated to
    ``prompt_tokens`` tokens of user content and greedily continued by the target for up to
    ``gen_tokens`` tokens (in batches of ``gen_batch``); ``topk`` teacher log-probs are kept
    per continuation position. Training: ``steps`` AdamW steps of ``batch`` sequences (at most
    ``seq_len`` tokens each) at peak learning rate ``lr``; loss = ``hidden_weight`` × hidden
    state regression + ``kd_weight`` × top-k distillation, where ``hard_weight`` mixes the
    teacher-argmax CE into the soft top-k CE. ``seed`` fixes prompt selection, init and
    batch order. ``threads``: torch threads for the build (0 = :func:`auto_threads`).
    """

    name: str = "smollm2-draft"
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 768
    draft_vocab: int = 8192
    steps: int = 300
    lr: float = 2e-3
    seq_len: int = 320
    batch: int = 16
    seed: int = 0
    n_texts: int = 384
    n_heldout: int = 48
    prompt_tokens: int = 128
    gen_tokens: int = 80
    gen_batch: int = 32
    topk: int = 16
    hard_weight: float = 0.5
    hidden_weight: float = 1.0
    kd_weight: float = 1.0
    warmup: float = 0.05
    weight_decay: float = 0.01
    init_from_target: bool = True
    threads: int = 0

    def key(self) -> dict:
        """The fields that define the built artifact (everything but ``threads``)."""
        d = dataclasses.asdict(self)
        d.pop("threads")
        return d


# --------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------

#: Built-in prompts (used when the offline data folder is absent, and always as open-ended
#: "chat" prompts). Each is a (category, text) pair.
BUILTIN_PROMPTS: tuple[tuple[str, str], ...] = (
    ("writing", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    ("writing", "Compose a friendly email inviting your colleagues to a team lunch on Friday."),
    ("writing", "Write a haiku about autumn leaves and explain its imagery."),
    ("writing", "Write a product description for a reusable water bottle."),
    ("writing", "Draft a short speech for a high-school graduation ceremony."),
    ("writing", "Write a limerick about a cat who loves to code."),
    ("roleplay", "Pretend you are a tour guide in Rome. Describe the Colosseum to a group of visitors."),
    ("roleplay", "You are a chef. Explain to a beginner how to make a simple tomato pasta sauce."),
    ("roleplay", "Act as a job interviewer and ask me three questions for a software engineer role."),
    ("stem", "Explain how photosynthesis works in simple terms."),
    ("stem", "What is the difference between a virus and a bacterium?"),
    ("stem", "Explain Newton's three laws of motion with everyday examples."),
    ("stem", "Why is the sky blue? Give a short scientific explanation."),
    ("stem", "What causes the seasons on Earth?"),
    ("stem", "Describe the water cycle step by step."),
    ("humanities", "Summarize the main causes of the First World War."),
    ("humanities", "What were the main achievements of the Roman Empire?"),
    ("humanities", "Explain what democracy means and name two kinds of democracy."),
    ("humanities", "Who was Leonardo da Vinci and why is he famous?"),
    ("reasoning", "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain."),
    ("reasoning", "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost?"),
    ("math", "Tom has 12 apples. He gives 5 to his friend and buys 8 more. How many apples does he have now?"),
    ("math", "A train travels 60 miles per hour for 3 hours. How far does it travel?"),
    ("math", "What is 15% of 240? Show your work."),
    ("math", "Sara reads 20 pages a day. How many days does she need to finish a 340-page book?"),
    ("math", "A rectangle is 8 cm long and 5 cm wide. What are its area and perimeter?"),
    ("coding", "Write a Python function that returns the factorial of a number."),
    ("coding", "Write a Python function to check whether a string is a palindrome."),
    ("coding", "Write a Python function that returns the n-th Fibonacci number."),
    ("coding", "Write a Python function that removes duplicates from a list while keeping the order."),
    ("coding", "Explain what a Python list comprehension is and give an example."),
    ("coding", "Write a Python function that counts the vowels in a string."),
    ("qa", "What is the capital of Australia?"),
    ("qa", "Who wrote the novel Pride and Prejudice?"),
    ("qa", "How many planets are there in the solar system?"),
    ("qa", "What is the largest ocean on Earth?"),
    ("qa", "When did the first person land on the Moon?"),
    ("translation", "Translate the following German text to English.\n\nDer Zug kommt heute später an, weil es auf der Strecke einen Unfall gab."),
    ("translation", "Translate the following German text to English.\n\nIch habe gestern ein sehr interessantes Buch über die Geschichte Berlins gelesen."),
    ("translation", "Translate the following German text to English.\n\nDie Regierung plant, im nächsten Jahr mehr Geld in Schulen zu investieren."),
    ("summarization", "Summarize the following article in one sentence.\n\nThe city council voted on Tuesday to expand the bicycle lane network by 40 kilometres over the next three years. Supporters said the plan would reduce traffic and pollution, while some shop owners worried about losing parking spaces. The first new lanes are expected to open in the spring."),
    ("summarization", "Summarize the following article in one sentence.\n\nScientists have discovered a new species of frog in the rainforests of Peru. The tiny amphibian, which is less than two centimetres long, was found during a survey of a remote mountain area. Researchers say the discovery shows how much remains unknown about the region's wildlife."),
    ("summarization", "Summarize the following article in one sentence.\n\nA local bakery has won a national award for its sourdough bread. The owners, who opened the shop five years ago, said they were surprised and delighted by the prize. They plan to use the prize money to train two new apprentices."),
    ("extraction", "Extract the names of all the people mentioned in this sentence: Alice met Bob and Carol at the station, while Dave waited in the car."),
    ("extraction", "List the dates mentioned in this text: The project started on 3 March 2021, paused on 15 June 2021 and finished on 1 February 2022."),
    ("writing", "Give me five tips for staying productive while working from home."),
    ("stem", "Explain what machine learning is to a ten-year-old."),
    ("humanities", "Describe the main features of Gothic architecture."),
)


@dataclass(frozen=True)
class Prompt:
    """One task-like prompt: ``source`` (file or ``builtin``), row ``ref``, user ``text``."""

    source: str
    ref: str
    text: str


def _fingerprint(text: str) -> str:
    """Normalized key of a prompt's core text (lowercase alphanumerics, first 160 chars)."""
    return re.sub(r"[^0-9a-z]", "", text.lower())[:160]


def _is_heldout(fp: str, fraction: float = 0.15) -> bool:
    h = int(hashlib.sha256(("heldout:" + fp).encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < fraction


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _clip(text: str, chars: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= chars else text[:chars].rsplit(" ", 1)[0] + " …"


def data_prompts(root: Path) -> list[tuple[Prompt, str]]:
    """Task-like prompts from the offline data folder, as ``(prompt, fingerprint_text)`` pairs.

    Uses rows that evaluation slices (which take the head of each test file) are unlikely to
    touch: XSum rows 500+, WMT16 (not WMT14), GSM8K rows 700+, SQuAD rows 500+, NQ
    EfficientQA dev (not NQ-open dev), MBPP validation/train (task_id ≥ 511). Spec-Bench,
    HumanEval and CNN/DM are left for evaluation.
    """
    out: list[tuple[Prompt, str]] = []

    def rows(rel: str) -> list[dict]:
        p = root / rel
        return _read_jsonl(p) if p.is_file() else []

    for i, r in enumerate(rows("summarization/xsum_test_1000.jsonl")):
        if i >= 500:
            doc = _clip(r["document"])
            out.append((Prompt("xsum", str(r.get("id", i)),
                               f"Summarize the following article in one sentence.\n\n{doc}"), doc))  # fmt: skip
    for r in rows("translation/wmt16_newstest2016_de-en.jsonl"):
        if len(r["de"]) >= 30:
            out.append((Prompt("wmt16", str(r["id"]),
                               f"Translate the following German text to English.\n\n{r['de']}"), r["de"]))  # fmt: skip
    for i, r in enumerate(rows("math/gsm8k_test.jsonl")):
        if i >= 700:
            q = r["question"]
            out.append((Prompt("gsm8k", str(i), f"{q}\nLet's think step by step."), q))
    for i, r in enumerate(rows("qa/squad_v1.1_dev_1000.jsonl")):
        if i >= 500:
            text = (f"Answer the question using the context.\n\nContext: {_clip(r['context'], 1000)}\n\n"
                    f"Question: {r['question']}")  # fmt: skip
            out.append((Prompt("squad", r["id"], text), r["question"] + r["context"][:80]))
    for i, r in enumerate(rows("qa/nq_open_efficientqa_dev.jsonl")):
        q = r["question"].strip().rstrip("?")
        out.append((Prompt("nq_efficientqa", str(i), f"Answer the question: {q}?"), q))
    for r in rows("code/mbpp.jsonl"):
        if r["task_id"] >= 511:
            text = (f"{r['text']}\nWrite a Python function. Your code should pass this test:\n"
                    f"{r['test_list'][0]}")  # fmt: skip
            out.append((Prompt("mbpp", str(r["task_id"]), text), r["text"]))
    return out


def select_prompts(cfg: DraftBuildConfig, root: Path | None) -> tuple[list[Prompt], list[Prompt], str]:
    """Deterministic train and held-out prompts and the data-source tag.

    Prompts are de-duplicated by fingerprint; held-out = fingerprints whose hash falls in
    the held-out bucket (so no training prompt shares its core text with a held-out one).
    Sources are interleaved round-robin after a seeded shuffle so every task is represented.
    """
    pool: list[tuple[Prompt, str]] = []
    source_tag = "builtin"
    if root is not None:
        pool = data_prompts(root)
        source_tag = "data"
    pool += [(Prompt("builtin", f"{cat}-{i}", text), text) for i, (cat, text) in enumerate(BUILTIN_PROMPTS)]
    seen: set[str] = set()
    train: dict[str, list[Prompt]] = {}
    held: dict[str, list[Prompt]] = {}
    for prompt, core in pool:
        fp = _fingerprint(core)
        if fp in seen:
            continue
        seen.add(fp)
        (held if _is_heldout(fp) else train).setdefault(prompt.source, []).append(prompt)
    gen = torch.Generator().manual_seed(cfg.seed)

    def interleave(groups: dict[str, list[Prompt]], n: int) -> list[Prompt]:
        shuffled = {}
        for src in sorted(groups):
            items = groups[src]
            order = torch.randperm(len(items), generator=gen).tolist()
            shuffled[src] = [items[j] for j in order]
        out: list[Prompt] = []
        depth = 0
        while len(out) < n and any(depth < len(v) for v in shuffled.values()):
            for src in sorted(shuffled):
                if depth < len(shuffled[src]) and len(out) < n:
                    out.append(shuffled[src][depth])
            depth += 1
        return out

    return interleave(train, cfg.n_texts), interleave(held, cfg.n_heldout), source_tag


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, max_content_tokens: int) -> list[int]:
    """Chat-template token ids of one user turn (content truncated to ``max_content_tokens``)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > max_content_tokens:
        text = tokenizer.decode(ids[:max_content_tokens])
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(out["input_ids"])


# --------------------------------------------------------------------------------------
# Teacher data: the target's greedy continuations, top-k log-probs and final hidden states
# --------------------------------------------------------------------------------------


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
    """Greedy continuations of ``prompts`` by ``target`` (batched by length, left-padded)."""
    encoded = [encode_prompt(tokenizer, p.text, cfg.prompt_tokens) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (len(encoded[i]), i))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    results: dict[int, TeacherSeq] = {}
    bar = _tqdm(total=len(prompts), desc=desc, disable=not progress)
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


# --------------------------------------------------------------------------------------
# Draft model
# --------------------------------------------------------------------------------------


def vocab_subset(seqs: Sequence[TeacherSeq], k: int, vocab: int, always: Sequence[int] = ()) -> list[int] | None:
    """The ``k`` token ids the draft's head scores: ``always`` (special tokens) first, then by
    frequency in the teacher sequences (prompt + continuation tokens, continuation counted
    twice), then ascending id (BPE ids roughly follow merge frequency). ``None`` when
    ``k <= 0`` or ``k >= vocab`` (full head)."""
    if k <= 0 or k >= vocab:
        return None
    counts = torch.zeros(vocab, dtype=torch.float64)
    for s in seqs:
        counts.index_add_(0, s.prompt, torch.ones(len(s.prompt), dtype=torch.float64))
        counts.index_add_(0, s.cont, torch.full((len(s.cont),), 2.0, dtype=torch.float64))
    counts[torch.tensor(sorted(set(always)), dtype=torch.long)] = float("inf")
    # stable descending sort: ties (incl. zero counts) keep ascending id order
    order = torch.sort(-counts, stable=True).indices[:k]
    return sorted(int(i) for i in order)


def draft_config(
    target_config: transformers.PretrainedConfig, cfg: DraftBuildConfig, subset: list[int] | None = None
) -> LlamaConfig:
    """Llama config of the draft: the target's vocabulary, special ids and RoPE; ``cfg``'s sizes;
    ``subset`` the token ids its LM head scores (``None``: all)."""
    if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
        raise ValueError(f"hidden {cfg.hidden} / heads {cfg.heads} / kv_heads {cfg.kv_heads} do not divide")
    rope = getattr(target_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    config = LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rms_norm_eps=target_config.rms_norm_eps,
        rope_parameters=dict(rope),
        tie_word_embeddings=False,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=target_config.pad_token_id,
        dtype="float32",
    )
    return make_config(config, subset)


def _top_eigvecs(gram: torch.Tensor, k: int) -> torch.Tensor:
    """Top-``k`` eigenvectors ``[n, k]`` of a symmetric ``[n, n]`` matrix, signs fixed (largest entry > 0)."""
    evals, evecs = torch.linalg.eigh(gram.double())
    basis = evecs[:, torch.argsort(evals, descending=True)[:k]]
    signs = torch.sign(basis.gather(0, basis.abs().argmax(0, keepdim=True)))
    return (basis * signs).float()


def output_basis(seqs: Sequence[TeacherSeq], k: int) -> tuple[torch.Tensor, float]:
    """Orthonormal ``[H, k]`` basis of the top-``k`` principal directions (uncentered) of the
    target's final hidden states over ``seqs`` — the subspace the draft's output lives in.

    Measured on SmolLM2 (held-out continuations): restricting the target's final state to
    this k=256 subspace keeps its greedy token 69% of the time; the embedding matrix's own
    top-256 subspace keeps 13%. Also returns the RMS of the projected states (the draft's
    final-norm gain at init).
    """
    dim = seqs[0].hidden.shape[-1]
    gram = torch.zeros(dim, dim, dtype=torch.float64)
    count = 0
    for s in seqs:
        h = s.hidden.double()
        gram += h.T @ h
        count += h.shape[0]
    basis = _top_eigvecs(gram, k)
    energy = torch.trace(basis.double().T @ gram @ basis.double()) / max(count, 1) / k
    return basis, float(energy.sqrt())


@torch.no_grad()
def init_draft(
    target: PreTrainedModel,
    cfg: DraftBuildConfig,
    out_basis: torch.Tensor | None = None,
    out_rms: float | None = None,
    subset: list[int] | None = None,
) -> SubsetHeadLlamaForCausalLM:
    """Seeded draft. With ``init_from_target`` (the target's embedding ``E [V, H_t]``):

    * input embedding = ``E @ B_in`` with ``B_in [H_t, hidden]`` the top right singular
      directions of ``E`` (best rank-``hidden`` view of the token identities);
    * LM head = ``E @ B_out`` with ``B_out`` = ``out_basis`` (see :func:`output_basis`), so
      a draft whose final state equals ``B_outᵀ z`` (``z`` the target's final state) gives
      the target's logits restricted to that subspace; without ``out_basis``, ``B_in``;
    * final-norm gain = ``out_rms`` (the RMS of ``B_outᵀ z``) when given;
    * with ``subset`` the head keeps the rows of those token ids only.
    """
    torch.manual_seed(cfg.seed)
    draft = SubsetHeadLlamaForCausalLM(draft_config(target.config, cfg, subset))
    if cfg.init_from_target:
        emb = target.get_input_embeddings().weight.detach().float()
        if cfg.hidden > emb.shape[1]:
            raise ValueError(f"draft hidden {cfg.hidden} exceeds the target's {emb.shape[1]}")
        b_in = _top_eigvecs(emb.T.double() @ emb.double(), cfg.hidden)
        b_out = out_basis if out_basis is not None else b_in
        draft.get_input_embeddings().weight.copy_(emb @ b_in)
        head = emb @ b_out
        draft.get_output_embeddings().weight.copy_(head[torch.tensor(subset)] if subset else head)
        if out_rms is not None:
            draft.get_decoder().norm.weight.fill_(out_rms)
    return draft


# --------------------------------------------------------------------------------------
# Training and evaluation
# --------------------------------------------------------------------------------------


def _window(s: TeacherSeq, seq_len: int) -> tuple[int, int]:
    """``(start, n_cont)``: the window ``full[start : P + n_cont]`` used for ``s`` (at most
    ``seq_len`` tokens; the prompt's head is dropped first; at least 16 continuation tokens)."""
    p = len(s.prompt)
    n_cont = min(len(s.cont), max(0, seq_len - p)) or min(len(s.cont), 16)
    return max(0, p + n_cont - seq_len), n_cont


@dataclass
class _Batch:
    ids: torch.Tensor  # [B, T] right-padded
    hid_pos: torch.Tensor  # [M] flat positions (b*T + t) with a hidden-state target
    hid: torch.Tensor  # [M, H_t] target final states there
    cont_pos: torch.Tensor  # [N] flat positions whose output predicts a continuation token
    top_ids: torch.Tensor  # [N, k]
    top_lp: torch.Tensor  # [N, k]
    counts: list[int]  # continuation positions per sequence


def _batch(seqs: Sequence[TeacherSeq], seq_len: int) -> _Batch:
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
    return _Batch(ids, torch.cat(hid_pos), torch.cat(hid).float(), torch.cat(cont_pos), torch.cat(tids),
                  torch.cat(tlps), counts)  # fmt: skip


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


@torch.inference_mode()
def agreement(draft: PreTrainedModel, seqs: Sequence[TeacherSeq], seq_len: int = 4096, batch: int = 8) -> dict:
    """Top-1 agreement of ``draft`` with the target, teacher-forced on the target's continuations.

    Returns ``{"agreement": float, "tokens": int, "by_source": {source: float}}``: the fraction
    of continuation positions where ``argmax draft == target greedy token``.
    """
    hits: dict[str, list[int]] = {}
    for i in range(0, len(seqs), batch):
        chunk = seqs[i : i + batch]
        bt = _batch(chunk, seq_len)
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
    """Fraction of the continuation tokens of ``seqs`` inside ``subset`` (1.0 for a full head)."""
    if not subset:
        return 1.0
    cont = torch.cat([s.cont for s in seqs])
    return float(torch.isin(cont, torch.tensor(subset)).float().mean())


@torch.inference_mode()
def lookup_agreement(draft: PreTrainedModel, seqs: Sequence[TeacherSeq], min_match: int = 2) -> float:
    """Top-1 agreement of the ``hybrid`` drafter's rule (teacher-forced, per position): the
    prompt-lookup token when the last ``min_match``..3 tokens recur earlier in the context,
    else the draft's argmax. See :class:`viasd.engine.drafters.HybridDrafter`."""
    from viasd.engine.drafters import NgramDrafter

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


def train_draft(
    draft: SubsetHeadLlamaForCausalLM,
    train: Sequence[TeacherSeq],
    cfg: DraftBuildConfig,
    out_basis: torch.Tensor,
    progress: bool = True,
    on_step=None,
) -> list[float]:
    """Distill ``draft`` on the teacher sequences in place; returns the loss per step.

    Loss per batch: ``hidden_weight · hidden_loss`` (all positions) ``+ kd_weight ·
    distill_loss`` (continuation positions). ``on_step(step, draft)`` is called after each
    step (for learning curves).
    """
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    decay = [p for n, p in draft.named_parameters() if p.ndim >= 2 and "embed" not in n and "lm_head" not in n]
    other = [p for n, p in draft.named_parameters() if not (p.ndim >= 2 and "embed" not in n and "lm_head" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8,
    )  # fmt: skip
    warm = max(1, int(cfg.warmup * cfg.steps))

    def lr_at(step: int) -> float:
        if step < warm:
            return cfg.lr * (step + 1) / warm
        t = (step - warm) / max(1, cfg.steps - warm)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

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
    bar = _tqdm(range(cfg.steps), desc="distilling draft", disable=not progress)
    for step in bar:
        if not queue:
            queue = _length_bucketed_batches([len(s.prompt) + len(s.cont) for s in train], cfg.batch, gen)
        bt = _batch([train[i] for i in queue.pop()], cfg.seq_len)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
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
        losses.append(float(loss.detach()))
        if step % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")
        if on_step is not None:
            on_step(step, draft)
            draft.train()
    draft.eval()
    return losses


# --------------------------------------------------------------------------------------
# Build + cache
# --------------------------------------------------------------------------------------


def _tqdm(*args, **kwargs):
    from tqdm.auto import tqdm

    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(*args, **kwargs)


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[viasd] {msg}", file=sys.stderr, flush=True)


def auto_threads(cap: int = 2) -> int:
    """Threads worth using now: up to ``cap``, minus cores other processes keep busy.

    On a shared CPU, a second torch thread makes small matmuls 5–10× *slower* (measured: a
    16×576 @ 576×1536 matmul takes 0.7 ms with 1 thread, 7–9 ms with 2 while another process
    runs), so the build uses 1 thread unless the machine looks idle.
    """
    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except (OSError, AttributeError):
        busy = 0.0
    return max(1, min(cap, cores - math.ceil(busy - 0.25)))


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n if n > 0 else auto_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


def target_fingerprint(target: PreTrainedModel) -> str:
    """Short hash identifying the target (config + embedding/final-norm statistics)."""
    emb = target.get_input_embeddings().weight.detach().float()
    stats = [emb.shape[0], emb.shape[1], round(float(emb.double().sum()), 3), round(float(emb.double().abs().sum()), 3)]
    cfg = {k: v for k, v in target.config.to_dict().items() if k not in ("_name_or_path", "dtype", "torch_dtype", "transformers_version")}
    blob = json.dumps([stats, cfg], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def draft_dir(target: PreTrainedModel, cfg: DraftBuildConfig, cache_root: Path | None = None,
              data_root: Path | None | str = "auto") -> Path:  # fmt: skip
    """Cache folder ``<cache_root>/drafts/<name>-<hash>`` for this config, target and data source."""
    root = Path(cache_root) if cache_root is not None else cache_dir()
    droot = data_dir(required=False) if data_root == "auto" else data_root
    key = {"cfg": cfg.key(), "target": target_fingerprint(target), "data": "data" if droot else "builtin",
           "format": BUILD_FORMAT}  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return root / "drafts" / f"{cfg.name}-{digest}"


def build_draft(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: DraftBuildConfig,
    out_dir: Path,
    progress: bool = True,
    data_root: Path | None | str = "auto",
) -> Path:
    """Build the draft into ``out_dir`` atomically (temp folder, manifest last, rename).

    ``data_root="auto"`` uses :func:`viasd.paths.data_dir` when present, else the built-in
    prompts; ``None`` forces the built-in prompts. The folder holds the draft
    (``save_pretrained``), the tokenizer, ``heldout.pt`` (held-out teacher sequences) and
    ``build_info.json`` (architecture, parameter count, timings, held-out agreement, prompt
    refs used for training); the manifest repeats the build info. Returns ``out_dir``.
    """
    transformers.logging.set_verbosity_error()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    droot = data_dir(required=False) if data_root == "auto" else (Path(data_root) if data_root else None)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".tmp-{out_dir.name}-"))
    try:
        with _threads(cfg.threads):
            used_threads = torch.get_num_threads()
            torch.manual_seed(cfg.seed)
            train_p, held_p, source_tag = select_prompts(cfg, droot)
            _say(progress, f"draft build: {len(train_p)} training / {len(held_p)} held-out prompts ({source_tag})")
            t_gen = time.perf_counter()
            train_seqs, held_seqs, teacher_cached = teacher_data(
                target, tokenizer, cfg, train_p, held_p, out_dir.parent, progress
            )
            t_gen = time.perf_counter() - t_gen
            basis, rms = output_basis(train_seqs, cfg.hidden)
            subset = vocab_subset(train_seqs, cfg.draft_vocab, target.config.vocab_size, tokenizer.all_special_ids)
            draft = init_draft(target, cfg, basis, rms, subset)
            before = agreement(draft, held_seqs)
            t_train = time.perf_counter()
            losses = train_draft(draft, train_seqs, cfg, basis, progress)
            t_train = time.perf_counter() - t_train
            after = agreement(draft, held_seqs)
            train_agree = agreement(draft, train_seqs[: cfg.n_heldout])
        info = {
            "config": cfg.key(),
            "threads": used_threads,
            "data_source": source_tag,
            "target_fingerprint": target_fingerprint(target),
            "num_parameters": sum(p.numel() for p in draft.parameters()),
            "heldout_agreement": after["agreement"],
            "heldout_agreement_with_lookup": lookup_agreement(draft, held_seqs),
            "draft_vocab": len(subset) if subset else target.config.vocab_size,
            "heldout_vocab_coverage": vocab_coverage(held_seqs, subset),
            "heldout_agreement_by_source": after["by_source"],
            "heldout_tokens": after["tokens"],
            "heldout_agreement_at_init": before["agreement"],
            "train_agreement_sample": train_agree["agreement"],
            "train_tokens": int(sum(len(s.cont) for s in train_seqs)),
            "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
            "seconds_teacher": t_gen,
            "teacher_data_reused": teacher_cached,
            "seconds_train": t_train,
            "seconds_total": time.perf_counter() - t0,
            "train_prompts": [f"{p.source}:{p.ref}" for p in train_p],
            "heldout_prompts": [f"{p.source}:{p.ref}" for p in held_p],
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "created_unix": time.time(),
        }
        with hf_progress_bars(False):
            draft.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save([dataclasses.asdict(s) for s in held_seqs], tmp / "heldout.pt")
        (tmp / "build_info.json").write_text(json.dumps(info, indent=2))
        write_manifest(tmp, {k: v for k, v in info.items() if k not in ("train_prompts", "heldout_prompts")})
        atomic_publish(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


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
        "prompts": [f"{p.source}:{p.ref}:{_fingerprint(p.text)}" for p in (*train_p, *held_p)],
        "knobs": [cfg.prompt_tokens, cfg.gen_tokens, cfg.gen_batch, cfg.topk],
        "format": TEACHER_FORMAT,
    }
    folder = drafts_root / f"teacher-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]}"
    with file_lock(drafts_root / f".{folder.name}.lock"):
        reason = verify_manifest(folder)
        if reason is None:
            data = torch.load(folder / "teacher.pt", weights_only=True)
            _say(progress, f"reusing cached teacher continuations {folder.name}")
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
    with _threads(threads):
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


def load_heldout(folder: Path) -> list[TeacherSeq]:
    """The held-out teacher sequences saved with a built draft."""
    return [TeacherSeq(**d) for d in torch.load(Path(folder) / "heldout.pt", weights_only=True)]


def build_info(folder: Path) -> dict:
    """The ``build_info.json`` of a built draft (agreement, timings, parameter count, …)."""
    return json.loads((Path(folder) / "build_info.json").read_text())


def ensure_draft(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: DraftBuildConfig,
    cache_root: Path | None = None,
    progress: bool = True,
    data_root: Path | None | str = "auto",
) -> Path:
    """Verified cache folder of the draft, building it (under a file lock) if missing or broken."""
    folder = draft_dir(target, cfg, cache_root, data_root)
    reason = verify_manifest(folder)
    if reason is None:
        return folder
    with file_lock(folder.parent / f".{folder.name}.lock"):
        reason = verify_manifest(folder)
        if reason is None:
            return folder
        if reason != "missing":
            remove_broken(folder, reason, progress)
        _say(progress, f"building draft {folder.name} (once; see DraftBuildConfig for its size)…")
        build_draft(target, tokenizer, cfg, folder, progress, data_root)
    reason = verify_manifest(folder)
    if reason is not None:
        raise RuntimeError(f"fresh draft at {folder} fails verification: {reason}")
    return folder


def load_or_build_draft(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: DraftBuildConfig | None = None,
    cache_root: Path | None = None,
    progress: bool = True,
    data_root: Path | None | str = "auto",
) -> SubsetHeadLlamaForCausalLM:
    """The cached draft for ``target`` (built on first use), fp32, in eval mode.

    ``draft(input_ids[B, T]).logits`` is ``[B, T, V]`` with the target's vocabulary ``V``.
    """
    cfg = cfg or DraftBuildConfig()
    folder = ensure_draft(target, tokenizer, cfg, cache_root, progress, data_root)
    transformers.logging.set_verbosity_error()
    with hf_progress_bars(False):
        return SubsetHeadLlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
