"""Prompts the draft is distilled on: where they come from and how they are split.

This module owns the prompt side of the recipe: task-like prompts (summarization,
translation, math, QA, code) built from the offline data folder, from rows that the
evaluation slices are unlikely to use (e.g. XSum rows 500+, WMT16 rather than WMT14, MBPP
train/validation, NQ EfficientQA), plus the open-ended chat prompts of
:data:`viasd.tasks.builtin_prompts.DISTILL_PROMPTS` (alone when there is no data folder);
de-duplicated by a normalized-text key (:func:`prompt_key`) and split train/held-out by a
hash of that key, so held-out prompts share no text with training prompts; and the
chat-template encoding of one prompt.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from viasd.distill.config import DraftBuildConfig
from viasd.errors import ConfigError
from viasd.tasks.builtin_prompts import DISTILL_PROMPTS


@dataclass(frozen=True)
class Prompt:
    """One task-like prompt: ``source`` (file or ``builtin``), row ``ref``, user ``text``."""

    source: str
    ref: str
    text: str


def prompt_key(text: str) -> str:
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
    pool += [(Prompt("builtin", f"{cat}-{i}", text), text) for i, (cat, text) in enumerate(DISTILL_PROMPTS)]
    seen: set[str] = set()
    train: dict[str, list[Prompt]] = {}
    held: dict[str, list[Prompt]] = {}
    for prompt, core in pool:
        fp = prompt_key(core)
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


def selection_sha256(train: list[Prompt], held: list[Prompt]) -> str:
    """SHA-256 of a prompt selection (:func:`select_prompts`): every prompt's source, row and text, in order."""
    blob = json.dumps([[[p.source, p.ref, p.text] for p in part] for part in (train, held)], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


_SELECTIONS: dict[tuple, tuple[str, str, int, int]] = {}


def selection_of(cfg: DraftBuildConfig, root: Path | None) -> tuple[str, str, int, int]:
    """``(sha256, source tag, training prompts, held-out prompts)`` of what :func:`select_prompts` picks for
    ``cfg`` from ``root`` (memoized per process: identities ask for it per cell); the tag is ``builtin`` when
    every picked prompt is a built-in one (no data folder, or one without the recipe's files), else ``data``."""
    key = (str(root), json.dumps(cfg.key(), sort_keys=True))
    if key not in _SELECTIONS:
        try:
            train, held, _ = select_prompts(cfg, root)
        except (KeyError, TypeError, ValueError) as e:  # a data file of another layout (json errors included)
            raise ConfigError(f"the trained draft's prompts cannot be read from the data folder {root} "
                              f"({type(e).__name__}: {e}); rewrite its task files with `python -m experiments.data "
                              "fetch` or point VIASD_DATA_DIR at the recipe's folder") from None
        tag = "builtin" if all(p.source == "builtin" for p in train + held) else "data"
        _SELECTIONS[key] = (selection_sha256(train, held), tag, len(train), len(held))
    return _SELECTIONS[key]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, max_content_tokens: int) -> list[int]:
    """Chat-template token ids of one user turn (content truncated to ``max_content_tokens``)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > max_content_tokens:
        text = tokenizer.decode(ids[:max_content_tokens])
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(out["input_ids"])
