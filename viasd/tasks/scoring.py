"""Pure text functions behind the metric modules (no I/O, no downloads).

This module owns the parts of scoring that are easy to get subtly wrong and are tested
directly: the regex sentence splitter used for ROUGE-Lsum (instead of nltk punkt), the
GSM8K final-answer extraction and numeric comparison, SQuAD answer normalization with exact
match and token F1, and a light PTB detokenizer for the tokenized CNN/DM files. The
``evaluate`` modules under ``viasd/tasks/metrics`` import from here.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

__all__ = [
    "split_sentences",
    "extract_gsm8k_gold",
    "extract_answer_number",
    "numbers_equal",
    "normalize_answer",
    "qa_exact_match",
    "qa_f1",
    "ptb_detokenize",
]

# --- sentence splitting for ROUGE-Lsum -------------------------------------------------

_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "inc", "ltd", "co", "corp",
    "gov", "gen", "col", "lt", "sgt", "capt", "rev", "no", "fig", "jan", "feb", "mar", "apr",
    "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.k", "e.g", "i.e",
}  # fmt: skip
_SENT_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+(?=[\"'“‘(\[]*[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences with a regex (newlines always split; no nltk data).

    A break is placed after ``.``, ``!`` or ``?`` (and any closing quotes or brackets)
    followed by whitespace and an upper-case letter or digit, except after common
    abbreviations ("Mr.", "U.S.") and single initials ("J. Smith").
    """
    sentences: list[str] = []
    for line in text.split("\n"):
        line = line.strip()
        if not line:
            continue
        start = 0
        for m in _SENT_END.finditer(line):
            head = line[start : m.start()].rstrip("\"'”’)]")
            last = head.rsplit(None, 1)[-1] if head.split() else ""
            word = last.rstrip(".!?").lower()
            if last.endswith(".") and (word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())):
                continue
            sentences.append(line[start : m.start()].strip() + line[m.start() : m.end()].strip())
            start = m.end()
        tail = line[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences


# --- GSM8K ---------------------------------------------------------------------------

# A number: optional sign, thousands groups or plain digits, optional decimals; or ".5".
_NUM = r"[-−]?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|[-−]?\.\d+"
_NUM_RE = re.compile(_NUM)
_ANSWER_CUES = [
    re.compile(r"####\s*(.*)", re.S),
    re.compile(r"\\boxed\{([^{}]*)\}"),
    re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(.*)", re.I | re.S),
]


def _clean_number(tok: str) -> str | None:
    tok = tok.replace("$", "").replace(",", "").replace(" ", "").replace("−", "-")
    try:
        d = Decimal(tok)
    except InvalidOperation:
        return None
    if d == d.to_integral_value():  # exact for any length (quantize would overflow past 28 digits)
        return format(d.to_integral_value(), "f")
    return format(d.normalize(), "f")


def extract_answer_number(text: str) -> str | None:
    """The final numeric answer in a model's GSM8K output, canonicalized, or None.

    Looks, in order, after the last ``####``, inside the last ``\\boxed{}``, after the last
    "answer is"/"answer:", and otherwise takes the last number in the text. Commas, ``$``
    and trailing text are dropped; ``-3``, ``1,234.50`` → ``"1234.5"`` and ``18.00`` →
    ``"18"`` are handled.
    """
    if not text:
        return None
    for cue in _ANSWER_CUES:
        matches = list(cue.finditer(text))
        if matches:
            m = _NUM_RE.search(matches[-1].group(1))
            if m:
                return _clean_number(m.group(0))
    nums = _NUM_RE.findall(text)
    return _clean_number(nums[-1]) if nums else None


def extract_gsm8k_gold(answer: str) -> str | None:
    """The gold number of a GSM8K ``answer`` field (after ``####``), canonicalized."""
    if "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    m = _NUM_RE.search(answer)
    return _clean_number(m.group(0)) if m else None


def numbers_equal(a: str | None, b: str | None) -> bool:
    """True when two canonical number strings denote the same value."""
    if a is None or b is None:
        return False
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


# --- SQuAD-style QA ------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalization: lower-case, drop punctuation and articles, squeeze spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _f1_single(prediction: str, reference: str) -> float:
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = collections.Counter(pred) & collections.Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def qa_exact_match(prediction: str, references: str | Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized reference, else 0.0."""
    refs = [references] if isinstance(references, str) else list(references)
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(r) for r in refs))


def qa_f1(prediction: str, references: str | Sequence[str]) -> float:
    """Best token-level F1 (0..1) of the prediction against any reference."""
    refs = [references] if isinstance(references, str) else list(references)
    return max((_f1_single(prediction, r) for r in refs), default=0.0)


# --- PTB detokenization (CNN/DM SummEval file) ----------------------------------------

_DETOK_RULES = [
    (re.compile(r"-lrb-", re.I), "("),
    (re.compile(r"-rrb-", re.I), ")"),
    (re.compile(r"-lsb-", re.I), "["),
    (re.compile(r"-rsb-", re.I), "]"),
    (re.compile(r"``\s*"), '"'),
    (re.compile(r"\s*''"), '"'),
    (re.compile(r"\s+(n't|'s|'re|'ve|'ll|'d|'m)\b", re.I), r"\1"),
    (re.compile(r"\s+([.,;:?!%)\]}])"), r"\1"),
    (re.compile(r"([(\[{$£€])\s+"), r"\1"),
    (re.compile(r"(\d)\s*,\s*(\d{3})\b"), r"\1,\2"),
    (re.compile(r"\s{2,}"), " "),
]


def ptb_detokenize(text: str) -> str:
    """Undo the common Penn-Treebank tokenization ("team 's draw ." → "team's draw.")."""
    for pattern, repl in _DETOK_RULES:
        text = pattern.sub(repl, text)
    return text.strip()
