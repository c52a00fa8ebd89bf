"""transformers' ``generate(custom_generate=…)`` against transformers' own greedy ``generate``.

This module owns ``python -m experiments.bench --custom-generate``'s measurement: per prompt, the
target's plain greedy ``model.generate(do_sample=False)`` (the reference) and
``model.generate(custom_generate=<this checkout>, trust_remote_code=True, assistant_model=draft,
viasd_method=M)`` for each method ``M``, timed one after the other on the same prompt (so machine
load hits all alike) after an untimed warm-up of each. Reported per row: whether every prompt's
output equals the reference token for token, wall seconds, new tokens, tokens/s and the speedup over
the greedy ``generate``. Speed is the benchmark's to report, never a timed unit test's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from viasd.paths import PROJECT_ROOT

__all__ = ["COLUMNS", "GREEDY", "custom_generate_bench"]

#: The reference row's label.
GREEDY = "generate (greedy)"

COLUMNS = [("variant", "{}"), ("equal_to_greedy", "{}"), ("new_tokens", "{:.0f}"), ("wall_s", "{:.1f}"),
           ("tokens_per_s", "{:.2f}"), ("speedup_vs_generate", "{:.2f}x")]


def custom_generate_bench(target, draft, tokenizer, prompts: list[str], methods: list[str], max_new_tokens: int,
                          warmup: int = 1, root: Path = PROJECT_ROOT,
                          progress: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Time greedy ``generate`` and ``generate(custom_generate=root, viasd_method=m)`` per prompt.

    Args:
        target: the verifier, a transformers causal LM; its ``generate`` is called for every row.
        draft: the draft model passed as ``assistant_model`` (``None``: model-free methods only).
        tokenizer: the target's tokenizer; prompts are ``tokenizer(p, return_tensors="pt")`` (ids ``[1, P]``).
        prompts: prompt strings (already rendered, e.g. with the chat template).
        methods: viasd method names (``ar``, ``sd``, ``cascade_sd``, ``sd_ngram``, …).
        max_new_tokens: new tokens per call (fewer when the target emits EOS: every row stops alike).
        warmup: untimed calls per row, on the first prompt, with at most 4 new tokens each.
        root: the folder holding ``custom_generate/generate.py`` (this checkout).

    Returns:
        ``(rows, per_prompt)``: one row per variant (greedy first) with ``equal_to_greedy`` ("k/n"
        prompts), ``prompts_equal``, ``new_tokens``, ``wall_s``, ``tokens_per_s`` and
        ``speedup_vs_generate`` (greedy wall / the row's wall); one record per prompt and variant
        with its prompt length, new tokens, wall seconds and equality.
    """
    greedy = {"do_sample": False, "max_new_tokens": int(max_new_tokens)}

    def call(label: str, enc, n: int) -> torch.Tensor:
        kw = {**greedy, "max_new_tokens": n}
        if label == GREEDY:
            return target.generate(**enc, **kw)
        return target.generate(**enc, **kw, custom_generate=str(root), trust_remote_code=True,
                               assistant_model=draft, tokenizer=tokenizer, viasd_method=label)

    labels = [GREEDY, *methods]
    encs = [tokenizer(p, return_tensors="pt") for p in prompts]
    for label in labels:  # loads custom_generate/generate.py, composes the method files, warms kernels
        for _ in range(warmup):
            call(label, encs[0], min(4, int(max_new_tokens)))
    per_prompt: list[dict[str, Any]] = []
    for i, enc in enumerate(encs):
        n_prompt = enc["input_ids"].shape[1]
        ref: list[int] | None = None
        for label in labels:
            t0 = time.perf_counter()
            out = call(label, enc, int(max_new_tokens))
            wall = time.perf_counter() - t0
            new = out[0, n_prompt:].tolist()
            ref = new if label == GREEDY else ref
            per_prompt.append({"prompt": i, "variant": label, "prompt_tokens": n_prompt, "new_tokens": len(new),
                               "wall_s": wall, "equal_to_greedy": new == ref})
            if progress:
                print(f"  prompt {i + 1}/{len(encs)} {label}: {len(new)} tokens in {wall:.1f} s"
                      f"{'' if new == ref else ' (differs from greedy generate)'}", flush=True)
    rows = []
    for label in labels:
        recs = [r for r in per_prompt if r["variant"] == label]
        wall, toks = sum(r["wall_s"] for r in recs), sum(r["new_tokens"] for r in recs)
        equal = sum(r["equal_to_greedy"] for r in recs)
        rows.append({"variant": label, "equal_to_greedy": f"{equal}/{len(recs)}", "prompts_equal": equal,
                     "prompts": len(recs), "new_tokens": toks, "wall_s": wall,
                     "tokens_per_s": toks / wall if wall > 0 else float("nan")})
    base = rows[0]["wall_s"]
    for row in rows:
        row["speedup_vs_generate"] = base / row["wall_s"] if row["wall_s"] > 0 else float("nan")
    return rows, per_prompt
