"""Prompts that fit the model: every rendered prompt plus ``max_new_tokens`` within its context.

A pair whose models have ``max_position_embeddings`` P (the smallest over the target, the draft
and the intermediate model; encoder-decoder and position-free models are not limited here) holds
a prompt of at most ``P − max_new_tokens`` tokens. :func:`fit_examples` checks each example's
rendered prompt before a run decodes anything (before its run folder opens or the warm-up
prefill runs) and, per ``task.truncate``:

* ``null`` (default): the first prompt over the limit is refused with one ConfigError line that
  names the example, its length, the limit and the fixes;
* ``left`` / ``right``: the prompt's text (the user message, or the plain prompt for tokenizers
  without a chat template) loses its start / its end until the rendered prompt fits.

A long text is measured on a growing prefix (:func:`tokens_over`), so a 1 MB one-line prompt is
refused after tokenizing a few thousand characters, not its 200k tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from viasd.errors import ConfigError
from viasd.tasks.base import Example, Task

__all__ = ["context_limit", "tokens_over", "fit_examples"]

def context_limit(pair: Any) -> int | None:
    """The fewest positions any decoder-only model of ``pair`` has (``max_position_embeddings``);
    None when none has a limit (T5's relative positions) or the target is an encoder-decoder."""
    if getattr(pair, "is_encoder_decoder", False):
        return None
    limits = [getattr(getattr(m, "config", None), "max_position_embeddings", None)
              for m in (pair.target, pair.draft, getattr(pair, "intermediate", None)) if m is not None]
    limits = [int(n) for n in limits if isinstance(n, int) and n > 0]
    return min(limits) if limits else None


def tokens_over(count: Callable[[str], int], text: str, limit: int) -> tuple[int, bool] | None:
    """``(tokens, exact)`` when ``text`` has more than ``limit`` tokens, None when it fits.

    ``count(s)``: the number of tokens of ``s``. A long text is counted on prefixes of
    4·(limit + 1) characters, then 4× longer, each cut at a space; a prefix over ``limit + 8``
    (a margin for the word a cut splits) proves the text too long (``exact`` False: a lower
    bound). Only a text that fits is tokenized whole.
    """
    n = 4 * (limit + 1)
    while n < len(text):
        cut = text.rfind(" ", n // 2, n)
        got = count(text[:cut if cut > 0 else n])
        if got > limit + 8:
            return got, False
        n *= 4
    got = count(text)
    return (got, True) if got > limit else None


def _field(example: Example, chat: bool) -> tuple[str, str]:
    """``(where, text)``: the part of an example that truncation shortens."""
    if chat or "plain_prompt" not in example.meta:
        return "prompt", example.prompt
    return "plain_prompt", str(example.meta["plain_prompt"])


def _with_text(example: Example, where: str, text: str) -> Example:
    if where == "prompt":
        return dataclasses.replace(example, prompt=text)
    return dataclasses.replace(example, meta={**example.meta, "plain_prompt": text})


def _truncate(task: Task, example: Example, tokenizer: Any, limit: int, side: str,
              count: Callable[[str], int]) -> Example:
    """``example`` with its text cut on ``side`` until its rendered prompt has ≤ ``limit`` tokens."""
    where, text = _field(example, bool(getattr(tokenizer, "chat_template", None)))
    if len(text) > 64 * (limit + 1):  # far too long: keep the side that stays before tokenizing it
        text = text[-64 * (limit + 1):] if side == "left" else text[:64 * (limit + 1)]
    ids = tokenizer(text, add_special_tokens=False).input_ids
    keep = len(ids) - (count(task.render(_with_text(example, where, text), tokenizer)) - limit)
    for _ in range(8):  # decode/encode round trips can shift a token or two
        if keep < 1:
            break
        cut = tokenizer.decode(ids[-keep:] if side == "left" else ids[:keep])
        fitted = _with_text(example, where, cut)
        over = count(task.render(fitted, tokenizer)) - limit
        if over <= 0 and cut.strip():
            return fitted
        keep -= max(over, 1)
    raise ConfigError(f"task {task.name!r}: example {example.id!r} does not fit {limit} tokens even with its text "
                      f"cut (task.truncate={side}): the template alone is too long; lower generation.max_new_tokens")


def fit_examples(task: Task, examples: list[Example], pair: Any, max_new_tokens: int) -> list[Example]:
    """``examples`` whose rendered prompts fit ``pair``'s context with ``max_new_tokens`` to spare
    (see the module docstring); raises a one-line ConfigError for a prompt that does not fit when
    ``task.truncate`` is null. ``pair``: a :class:`~viasd.models.pairs.ModelPair`."""
    positions = context_limit(pair)
    if positions is None or not examples:
        return examples
    limit = positions - int(max_new_tokens)
    side = task.cfg.get("truncate")
    if limit < 1:
        raise ConfigError(f"generation.max_new_tokens={max_new_tokens} leaves no room for a prompt in {pair.name}'s "
                          f"{positions} positions; lower it")
    tok = pair.tokenizer
    special = not getattr(tok, "chat_template", None)  # as ModelPair.encode tokenizes

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=special).input_ids)

    out, cut = [], 0
    for ex in examples:
        over = tokens_over(count, task.render(ex, tok), limit)
        if over is None:
            out.append(ex)
            continue
        if side is None:
            raise ConfigError(
                f"task {task.name!r}: example {ex.id!r} has {'' if over[1] else 'at least '}{over[0]} prompt "
                f"tokens; {pair.name} holds {positions} positions - max_new_tokens {max_new_tokens} = {limit}; shorten "
                f"it, lower generation.max_new_tokens, or set task.truncate=left|right to cut its start|end")
        out.append(_truncate(task, ex, tok, limit, side, count))
        cut += 1
    if cut:
        print(f"[viasd] task.truncate={side}: {cut} of {len(examples)} prompts cut to {limit} tokens")
    return out
