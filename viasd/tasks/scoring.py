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
from fractions import Fraction

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
_NUM = r"[-−]?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|[-−]?\$?\.\d+"
_NUM_RE = re.compile(_NUM)
# A number, or a fraction of two (``2/9``) read whole: the text-wide fallback's last number.
_NUM_OR_FRACTION_RE = re.compile(rf"(?:{_NUM})(?:\s*/\s*(?:\d{{1,3}}(?:,\d{{3}})+(?!\d)|\d+)(?:\.\d+)?)?")
_ANSWER_CUES = [
    re.compile(r"####\s*(.*)", re.S),
    re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}"),
    re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(.*)", re.I | re.S),
]
# The end of the answer's sentence: a line break, or a period, "!", "?" or ";" not inside a number.
_SENTENCE_END = re.compile(r"\n|[.!?;](?!\d)")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_CLOCK = re.compile(r"\d{1,2}:\d{2}(?!\d)")
# One token of an arithmetic answer: a number, an operator (x between numbers multiplies), a paren.
_TOKEN = re.compile(rf"\s*(?:(?P<num>{_NUM})|(?P<op>[-−+*/×÷xX])|(?P<paren>[()]))")
_MAX_TOKENS = 64  # a longer run is prose, not an answer (and bounds the work)


def _fraction(tok: str) -> Fraction | None:
    tok = tok.replace("$", "").replace(",", "").replace(" ", "").replace("−", "-")
    try:
        return Fraction(tok)
    except (ValueError, ZeroDivisionError):
        return None


def _canonical(value: Fraction) -> str:
    """``18``, ``1234.5``, ``-7``; a fraction whose decimal does not terminate stays ``2/9``."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    scaled = str(abs(value.numerator * 10**digits // value.denominator)).rjust(digits + 1, "0")
    return ("-" if value < 0 else "") + scaled[:-digits] + "." + scaled[-digits:]


def _clean_number(tok: str) -> str | None:
    value = _fraction(tok)
    return None if value is None else _canonical(value)


def _tokens(text: str) -> list[tuple[str, str]]:
    """The arithmetic tokens at the start of ``text`` (``("num", "2")``, ``("op", "/")``…), up to the
    first character that is none, without a dangling operator or open parenthesis at the end."""
    out: list[tuple[str, str]] = []
    pos = 0
    while len(out) <= _MAX_TOKENS:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            break
        kind = m.lastgroup
        tok = m.group(kind)
        if kind == "op" and tok in "xX" and not (out and out[-1][0] in ("num", ")")):
            break  # a word starting with x, not a multiplication
        if kind == "num" and out and out[-1][0] in ("num", ")"):
            if tok[0] in "-−":  # "5 -3": a subtraction
                out += [("op", "-"), ("num", tok[1:])]
                pos = m.end()
                continue
            break  # two numbers in a row: the answer ended at the first
        out.append((tok if kind == "paren" else kind, tok))
        pos = m.end()
    while out and (out[-1][0] in ("op", "(")):
        out.pop()
    return out


class _Parser:
    """Recursive descent over :func:`_tokens` with exact fractions: ``+ - * / × ÷ x``, unary minus,
    parentheses — nothing else is evaluated (no names, no powers, no calls)."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.toks, self.i = tokens, 0

    def _peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def expr(self) -> Fraction:
        value = self.term()
        while (t := self._peek()) and t[0] == "op" and t[1] in "+-−":
            self.i += 1
            rhs = self.term()
            value = value + rhs if t[1] == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while (t := self._peek()) and t[0] == "op" and t[1] in "*/×÷xX":
            self.i += 1
            rhs = self.factor()
            value = value / rhs if t[1] in "/÷" else value * rhs
        return value

    def factor(self) -> Fraction:
        t = self._peek()
        if t is None:
            raise ValueError("end of answer")
        self.i += 1
        if t[0] == "op" and t[1] in "-−+":
            return -self.factor() if t[1] != "+" else self.factor()
        if t[0] == "(":
            value = self.expr()
            if (c := self._peek()) is None or c[0] != ")":
                raise ValueError("unclosed parenthesis")
            self.i += 1
            return value
        if t[0] == "num":
            value = _fraction(t[1])
            if value is None:
                raise ValueError(t[1])
            return value
        raise ValueError(t[1])


def _evaluate(text: str) -> Fraction | None:
    """The value of the arithmetic at the start of ``text`` (``2/9`` → 2/9, ``5 - 3`` → 2,
    ``$1,234.50 in total`` → 1234.5), or None when it does not start with one."""
    toks = _tokens(text)
    while toks:
        parser = _Parser(toks)
        try:
            value = parser.expr()
        except (ValueError, ZeroDivisionError):
            value = None
        if value is not None and parser.i == len(toks):
            return value
        toks = toks[: parser.i] if value is not None and 0 < parser.i < len(toks) else toks[:-1]
        while toks and toks[-1][0] in ("op", "("):
            toks.pop()
    return None


def _read_answer(segment: str) -> str | None:
    """The answer a cue introduces ("" when it is not a number; None when its sentence has none), read
    whole: the first number of its sentence with the arithmetic around it — after the last ``=`` when the
    sentence has one (``5 - 3 = 2`` → 2), a fraction as a fraction (``2/9`` stays 2/9), an expression by
    its value; a clock time (``1:30 pm``) is no number."""
    segment = _LATEX_FRAC.sub(r"(\1)/(\2)", segment).lstrip()
    end = _SENTENCE_END.search(segment)
    sentence = segment[: end.start()] if end else segment
    if "=" in sentence:
        sentence = sentence.rsplit("=", 1)[1]
    first = _NUM_RE.search(sentence)
    if first is None:
        return None
    start = first.start()
    while start > 0 and sentence[start - 1] in "(-−":  # "(2/9)", "-(3 - 5)": they belong to the answer
        start -= 1
    if _CLOCK.match(sentence, first.start() if sentence[first.start()] not in "-−$" else first.start() + 1):
        return ""  # an answer, but not a number: never equal to a gold number
    value = _evaluate(sentence[start:])
    return _canonical(value) if value is not None else _clean_number(first.group(0))


def extract_answer_number(text: str) -> str | None:
    """The final numeric answer in a model's GSM8K output, canonicalized, or None.

    Looks, in order, after the last ``####``, inside the last ``\\boxed{}``, after the last
    "answer is"/"answer:"/"answer =", and reads the answer there whole (:func:`_read_answer`): the
    sentence after the cue, right of its last ``=``, from its first number on, evaluated exactly
    (``2/9`` is the fraction 2/9, ``5 - 3`` is 2, ``\\frac{2}{9}`` is 2/9); units and words after it
    end it (``42 apples`` → 42, ``50%`` → 50); a clock time (``1:30 pm``) is no number. Without a
    cue, the last number (or fraction) in the text. Commas, ``$`` and the sentence's period are
    dropped: ``-3``, ``1,234.50`` → ``"1234.5"``, ``18.00`` → ``"18"``; a fraction whose decimal does
    not terminate stays a fraction (``"2/9"``, which :func:`numbers_equal` compares exactly).
    """
    if not text:
        return None
    for cue in _ANSWER_CUES:
        matches = list(cue.finditer(text))
        if matches:
            answer = _read_answer(matches[-1].group(1))
            if answer is not None:
                return answer or None
    nums = _NUM_OR_FRACTION_RE.findall(text)
    return _clean_number(nums[-1].replace(" ", "")) if nums else None


def extract_gsm8k_gold(answer: str) -> str | None:
    """The gold number of a GSM8K ``answer`` field (after ``####``), canonicalized."""
    if "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    m = _NUM_RE.search(answer)
    return _clean_number(m.group(0)) if m else None


def numbers_equal(a: str | None, b: str | None) -> bool:
    """True when two canonical number strings (``"3.5"``, ``"2/9"``) denote the same value, exactly."""
    if a is None or b is None:
        return False
    x, y = _fraction(a), _fraction(b)
    return x is not None and y is not None and x == y


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
