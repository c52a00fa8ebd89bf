"""The concrete task kinds registered in :data:`viasd.tasks.base.TASKS`.

This module owns, for each task, the mapping from dataset rows to :class:`Example` (prompt
fields, reference, metadata), the default configuration (mirrored by
``conf/task/<name>.yaml``), the hub-row normalization, and the metric it is scored with:

=============  ======================================  ==================
task           offline file (under VIASD_DATA_DIR)     metric
=============  ======================================  ==================
xsum           summarization/xsum_test_1000.jsonl      rouge
cnndm          summarization/cnndm_test_summeval_100   rouge
wmt14_deen     translation/wmt14_newstest2014_de-en    bleu (BLEU, chrF)
gsm8k          math/gsm8k_test.jsonl                   gsm8k_accuracy
nq_open        qa/nq_open_dev.jsonl                    squad_qa
squad          qa/squad_v1.1_dev_1000.jsonl            squad_qa
humaneval      code/HumanEval.jsonl                    code_pass_at_1
mbpp           code/mbpp.jsonl (task_id 11-510)        code_pass_at_1
specbench      specbench/question.jsonl                none (speed only)
prompts        built in, or a .jsonl/.txt file         none
=============  ======================================  ==================
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from viasd.errors import ConfigError
from viasd.tasks.base import TASKS, Example, Task
from viasd.tasks.builtin_prompts import BUILTIN_PROMPTS
from viasd.tasks.fewshot import GSM8K_COT
from viasd.tasks.sandbox import require_isolation
from viasd.tasks.scoring import extract_gsm8k_gold, ptb_detokenize

__all__ = [
    "XSumTask",
    "CnnDmTask",
    "Wmt14DeEnTask",
    "Gsm8kTask",
    "NqOpenTask",
    "SquadTask",
    "HumanEvalTask",
    "MbppTask",
    "SpecBenchTask",
    "HUB",
    "PromptsTask",
    "extract_code_block",
]


def _hub(path: str, name: str | None, split: str, revision: str, files: str) -> dict[str, Any]:
    return {"path": path, "name": name, "split": split, "revision": revision, "files": files}


# The hub datasets the offline files were made from: id, config, split, pinned revision and the
# parquet files of that split at that revision (XSum's main branch holds only a loading script,
# which ``datasets`` >= 4 refuses; its parquet conversion lives on refs/convert/parquet).
# Revisions left at "main" have no commit pinned yet (see the README, "Running at paper scale").
HUB: dict[str, dict[str, Any]] = {
    "xsum": _hub("EdinburghNLP/xsum", "default", "test", "refs/convert/parquet", "default/test/*.parquet"),
    "cnndm": _hub("abisee/cnn_dailymail", "3.0.0", "test", "main", "3.0.0/test-*.parquet"),
    "wmt14_deen": _hub("wmt/wmt14", "de-en", "test", "main", "de-en/test-*.parquet"),
    "gsm8k": _hub("openai/gsm8k", "main", "test", "740312add88f781978c0658806c59bc2815b9866", "main/test-*.parquet"),
    "nq_open": _hub("google-research-datasets/nq_open", "nq_open", "validation", "main",
                    "nq_open/validation-*.parquet"),
    "squad": _hub("rajpurkar/squad", "plain_text", "validation", "7b6d24c440a36b6815f21b70d25016731768db1f",
                  "plain_text/validation-*.parquet"),
    "humaneval": _hub("openai/openai_humaneval", "openai_humaneval", "test",
                      "7dce6050a7d6d172f3cc5c32aa97f52fa1a2e544", "openai_humaneval/test-*.parquet"),
    "mbpp": _hub("google-research-datasets/mbpp", "full", "test", "main", "full/test-*.parquet"),
}


# --- summarization -------------------------------------------------------------------


class _SummarizationTask(Task):
    metric = "rouge"
    doc_field = "document"
    ref_field = "summary"

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        doc, ref = str(row[self.doc_field]), str(row[self.ref_field])
        if self.cfg.get("detokenize"):
            doc, ref = ptb_detokenize(doc), ptb_detokenize(ref)
        fields = {**row, self.doc_field: doc}
        return Example(
            id=str(row.get("id", index)),
            prompt=self.format("prompt_template", fields),
            reference=ref,
            meta={"plain_prompt": self.format("plain_template", fields)},
        )


@TASKS.register("xsum")
class XSumTask(_SummarizationTask):
    """XSum: one-sentence summaries of BBC articles, ROUGE-1/2/L/Lsum."""

    defaults = {
        "offline_file": "summarization/xsum_test_1000.jsonl",
        "hub": dict(HUB['xsum']),
        "max_new_tokens": 64,
        "stop_strings": ["\n\n"],
        "prompt_template": "Summarize the following article in one sentence.\n\nArticle: {document}",
        "plain_template": "summarize: {document}",
        "detokenize": False,
    }

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        bbc_id = str(row.get("id", ""))
        return {"document": row["document"], "summary": row["summary"],
                "id": int(bbc_id) if bbc_id.isdigit() else bbc_id}


@TASKS.register("cnndm")
class CnnDmTask(_SummarizationTask):
    """CNN/DailyMail: multi-sentence news highlights, ROUGE-1/2/L/Lsum.

    The default offline file is SummEval's 100 test articles, which are PTB-tokenized;
    ``detokenize: true`` undoes that for the prompt and the reference.
    """

    doc_field = "article"
    ref_field = "highlights"
    defaults = {
        "offline_file": "summarization/cnndm_test_summeval_100.jsonl",
        "hub": dict(HUB['cnndm']),
        "max_new_tokens": 128,
        "stop_strings": ["\n\n"],
        "prompt_template": "Summarize the following news article in three sentences.\n\nArticle: {article}",
        "plain_template": "summarize: {article}",
        "detokenize": True,
    }

    def row_key(self, index: int, row: dict[str, Any]) -> str:
        """The article's SHA1 (SummEval ids are ``dm-test-<sha1>``; the hub's are ``<sha1>``)."""
        return str(row.get("id", index)).rsplit("-", 1)[-1]

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"id": row["id"], "article": row["article"], "highlights": row["highlights"],
                "references": [row["highlights"]]}


# --- translation ---------------------------------------------------------------------


@TASKS.register("wmt14_deen")
class Wmt14DeEnTask(Task):
    """WMT14 newstest2014 German→English, sacrebleu BLEU and chrF."""

    metric = "bleu"
    defaults = {
        "offline_file": "translation/wmt14_newstest2014_de-en.jsonl",
        "hub": dict(HUB['wmt14_deen']),
        "max_new_tokens": 128,
        "stop_strings": ["\n"],
        "prompt_template": (
            "Translate the following German text into English. Reply with the English translation only.\n\n{de}"
        ),
        "plain_template": "translate German to English: {de}",
    }

    key_field = "de"

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        tr = row.get("translation") or {}
        return {"src_lang": "de", "tgt_lang": "en", "de": tr.get("de", ""), "en": tr.get("en", "")}

    def offline_row(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        return {"id": index, **row}

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            id=str(row.get("id", index)),
            prompt=self.format("prompt_template", row),
            reference=str(row["en"]),
            meta={"plain_prompt": self.format("plain_template", row)},
        )


# --- reasoning -----------------------------------------------------------------------


@TASKS.register("gsm8k")
class Gsm8kTask(Task):
    """GSM8K test problems with the standard 8-shot chain-of-thought prompt; final-answer accuracy.

    With a chat template the ``n_shot`` demonstrations are earlier user/assistant turns;
    without one they are "Q: … A: …" blocks before the question.
    """

    metric = "gsm8k_accuracy"
    key_field = "question"
    defaults = {
        "offline_file": "math/gsm8k_test.jsonl",
        "hub": dict(HUB['gsm8k']),
        "max_new_tokens": 256,
        "stop_strings": ["\nQ:", "\n\nQuestion:"],
        "chat_stop_strings": [],
        "prompt_template": ('Q: {question}\nThink step by step, then finish with "The answer is <number>."'),
        "plain_template": "Q: {question}\nA:",
        "n_shot": 8,
    }

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        n = self.cfg["n_shot"]
        if not isinstance(n, int) or not 0 <= n <= len(GSM8K_COT):
            raise ConfigError(
                f"task {self.name!r}: n_shot must be an integer in 0..{len(GSM8K_COT)}, got {n!r}"
            )

    def few_shot(self) -> list[tuple[str, str, str]]:
        return [
            (
                self.format("prompt_template", {"question": q}),
                self.format("plain_template", {"question": q}),
                a,
            )
            for q, a in GSM8K_COT[: self.cfg["n_shot"]]
        ]

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            id=str(index),
            prompt=self.format("prompt_template", row),
            reference=str(row["answer"]),
            meta={
                "plain_prompt": self.format("plain_template", row),
                "gold": extract_gsm8k_gold(str(row["answer"])),
            },
        )


# --- question answering --------------------------------------------------------------


def _dedupe(items: Sequence[Any]) -> list[str]:
    return list(dict.fromkeys(str(x) for x in items))


@TASKS.register("nq_open")
class NqOpenTask(Task):
    """Natural Questions (open), closed-book; SQuAD-normalized EM/F1 against any answer."""

    metric = "squad_qa"
    key_field = "question"
    defaults = {
        "offline_file": "qa/nq_open_dev.jsonl",
        "hub": dict(HUB['nq_open']),
        "max_new_tokens": 32,
        "stop_strings": ["\n"],
        "prompt_template": "Answer the following question with a short answer of a few words.\n\nQuestion: {question}",
        "plain_template": "Q: {question}\nA:",
    }

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        q = str(row["question"]).strip()
        q = q if q.endswith("?") else q + "?"
        fields = {**row, "question": q}
        return Example(
            id=str(index),
            prompt=self.format("prompt_template", fields),
            reference=_dedupe(row["answer"]),
            meta={"plain_prompt": self.format("plain_template", fields)},
        )


@TASKS.register("squad")
class SquadTask(Task):
    """SQuAD v1.1 dev, reading comprehension; EM/F1 against the annotators' answers."""

    metric = "squad_qa"
    defaults = {
        "offline_file": "qa/squad_v1.1_dev_1000.jsonl",
        "hub": dict(HUB['squad']),
        "max_new_tokens": 32,
        "stop_strings": ["\n"],
        "prompt_template": (
            "Answer the question with a short span copied from the passage.\n\n"
            "Passage: {context}\n\nQuestion: {question}"
        ),
        "plain_template": "question: {question} context: {context}",
    }

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        answers = row.get("answers")
        if isinstance(answers, dict):
            answers = list(answers.get("text", []))
        return {k: row[k] for k in ("id", "title", "context", "question")} | {"answers": list(answers or [])}

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            id=str(row.get("id", index)),
            prompt=self.format("prompt_template", row),
            reference=_dedupe(row["answers"]),
            meta={"plain_prompt": self.format("plain_template", row), "title": row.get("title")},
        )


# --- code ----------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\r?\n(.*?)(?:```|\Z)", re.S | re.I)


def extract_code_block(text: str) -> str | None:
    """The content of the first fenced code block in ``text`` (unclosed allowed), or None."""
    m = _FENCE.search(text)
    return m.group(1) if m else None


class _CodeTask(Task):
    metric = "code_pass_at_1"
    key_field = "task_id"
    sandbox_defaults = {"timeout_s": 10.0, "memory_mb": 1024, "workers": None, "unsafe_exec": False}

    def preflight(self) -> None:
        """Raise a one-line ConfigError now if generated code could not be executed at scoring time.

        Refuses when the sandbox is unavailable here, unless ``unsafe_exec: true`` or
        ``VIASD_UNSAFE_EXEC=1`` waives it (see :func:`viasd.tasks.sandbox.require_isolation`).
        """
        require_isolation(bool(self.cfg["unsafe_exec"]))

    def postprocess(self, text: str) -> str:
        """The code in the first fenced block if there is one, else the text cut at the stop strings.

        Only trailing whitespace is stripped: the first line of a completion is indented.
        """
        block = extract_code_block(text)
        if block is not None:
            return block.rstrip()
        return self.cut_at_stop(text).rstrip()

    def metric_kwargs(self) -> dict[str, Any]:
        return {
            "timeout_s": self.cfg["timeout_s"],
            "memory_mb": self.cfg["memory_mb"],
            "workers": self.cfg["workers"],
            "unsafe_exec": bool(self.cfg["unsafe_exec"]),
        }


@TASKS.register("humaneval")
class HumanEvalTask(_CodeTask):
    """HumanEval: complete a function from its signature and docstring; pass@1 in the sandbox.

    The program is ``prompt + completion``; the checks, run after it, ``test + "\\ncheck(entry_point)"``.
    A completion may be the function body (base models) or the whole function (chat models).
    """

    defaults = {
        "offline_file": "code/HumanEval.jsonl",
        "hub": dict(HUB['humaneval']),
        "max_new_tokens": 512,
        "stop_strings": ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```"],
        "chat_stop_strings": [],
        "prompt_template": (
            "Complete the following Python function. Reply with the complete function in one "
            "```python code block.\n\n```python\n{prompt}```"
        ),
        "plain_template": "{prompt}",
        **_CodeTask.sandbox_defaults,
    }

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            id=str(row["task_id"]),
            prompt=self.format("prompt_template", row),
            reference=f"{row['test']}\ncheck({row['entry_point']})",
            meta={
                "plain_prompt": self.format("plain_template", row),
                "code_prompt": row["prompt"],
                "entry_point": row["entry_point"],
                "canonical_solution": row["canonical_solution"],
            },
        )

    def plain_prompt(self, example: Example) -> str:
        # Code completion continues the prompt exactly: no few-shot joins, no stripping.
        return str(example.meta["plain_prompt"])

    def metric_predictions(self, predictions: Sequence[str], examples: Sequence[Example]) -> list[str]:
        return [e.meta["code_prompt"] + p for p, e in zip(predictions, examples, strict=True)]


@TASKS.register("mbpp")
class MbppTask(_CodeTask):
    """MBPP (full), test split task_id 11-510 by default; pass@1 on the three asserts.

    The program is the completion; the checks, run after it, ``test_setup_code`` and ``test_list``.
    """

    defaults = {
        "offline_file": "code/mbpp.jsonl",
        "hub": dict(HUB['mbpp']),
        "max_new_tokens": 512,
        "stop_strings": ["\nclass ", "\nassert ", '\n"""', "\nprint(", "\nif __name__", "\n```"],
        "chat_stop_strings": [],
        "prompt_template": (
            "You are an expert Python programmer, and here is your task: {text} "
            "Your code should pass these tests:\n\n{tests}\n\n"
            "Reply with the code in one ```python code block."
        ),
        "plain_template": '"""\n{text}\n{first_test}\n"""\n',
        "task_id_range": [11, 510],
        **_CodeTask.sandbox_defaults,
    }

    def filter_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rng = self.cfg["task_id_range"]
        if rng is None:
            return rows
        if not (isinstance(rng, (list, tuple)) and len(rng) == 2):
            raise ConfigError(f"task {self.name!r}: task_id_range must be [first, last] or null, got {rng!r}")
        lo, hi = int(rng[0]), int(rng[1])
        return [r for r in rows if lo <= int(r["task_id"]) <= hi]

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        tests = list(row["test_list"])
        fields = {**row, "tests": "\n".join(tests), "first_test": tests[0] if tests else ""}
        setup = str(row.get("test_setup_code") or "")
        return Example(
            id=str(row["task_id"]),
            prompt=self.format("prompt_template", fields),
            reference=f"{setup}\n" + "\n".join(tests),
            meta={
                "plain_prompt": self.format("plain_template", fields),
                "task_id": int(row["task_id"]),
                "canonical_solution": row["code"],
            },
        )

    def plain_prompt(self, example: Example) -> str:
        return str(example.meta["plain_prompt"])


# --- prompt-only tasks (speed) -------------------------------------------------------


@TASKS.register("specbench")
class SpecBenchTask(Task):
    """Spec-Bench's 480 prompts (first turn), for speed measurements; not scored.

    ``categories`` (e.g. ``[translation, summarization]``) restricts the categories;
    ``reference`` carries the file's reference where it has one (else None).
    """

    key_field = "question_id"
    defaults = {
        "offline_file": "specbench/question.jsonl",
        "hub": None,
        "max_new_tokens": 256,
        "stop_strings": [],
        "prompt_template": "{prompt}",
        "plain_template": "{prompt}",
        "categories": None,
    }

    def filter_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        cats = self.cfg["categories"]
        if not cats:
            return rows
        cats = [cats] if isinstance(cats, str) else list(cats)
        known = sorted({str(r["category"]) for r in rows})
        bad = [c for c in cats if c not in known]
        if bad:
            raise ConfigError(f"task {self.name!r}: unknown categories {bad}; known: {', '.join(known)}")
        return [r for r in rows if r["category"] in cats]

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        fields = {**row, "prompt": str(row["turns"][0])}
        return Example(
            id=str(row["question_id"]),
            prompt=self.format("prompt_template", fields),
            reference=row.get("reference"),
            meta={"plain_prompt": self.format("plain_template", fields), "category": row["category"]},
        )


@TASKS.register("prompts")
class PromptsTask(Task):
    """Free prompts for smoke runs and speed: the built-in set, or a user file; not scored.

    ``path: null`` uses :data:`viasd.tasks.builtin_prompts.BUILTIN_PROMPTS`. ``path: FILE``
    reads ``.jsonl`` (one ``{"prompt": ...}`` object per line) or ``.txt`` (one prompt per
    line, blank lines skipped); a relative path is taken from the current directory.
    """

    defaults = {
        "source": "local",
        "offline_file": None,
        "hub": None,
        "max_new_tokens": 128,
        "stop_strings": [],
        "prompt_template": "{prompt}",
        "plain_template": "{prompt}",
        "path": None,
    }

    def load_rows(self) -> list[dict[str, Any]]:
        path = self.cfg["path"]
        if path is None:
            return [dict(p) for p in BUILTIN_PROMPTS]
        return read_prompt_file(Path(str(path)))

    def source(self) -> str:
        return "local"

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        fields = {**row, "prompt": str(row["prompt"])}
        meta = {"plain_prompt": self.format("plain_template", fields)}
        if "kind" in row:
            meta["kind"] = row["kind"]
        return Example(
            id=str(row.get("id", index)),
            prompt=self.format("prompt_template", fields),
            reference=row.get("reference"),
            meta=meta,
        )


def read_prompt_file(path: Path) -> list[dict[str, Any]]:
    """Rows ``{"id", "prompt", ...}`` of a ``.jsonl`` or ``.txt`` prompt file.

    Raises a ConfigError naming the file and the fix for a missing or empty file, a line
    that is not a JSON object with a non-empty string ``"prompt"``, or an unknown suffix.
    """
    fix = 'set task.path to a .jsonl file with one {"prompt": ...} per line or a .txt file with one prompt per line'
    p = path.expanduser().resolve()
    if not p.is_file():
        raise ConfigError(f"prompt file not found: {p}; {fix} (or task.path=null for the built-in prompts)")
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".txt"):
        raise ConfigError(f"prompt file {p} has an unsupported suffix {suffix!r}; {fix}")
    rows: list[dict[str, Any]] = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if suffix == ".txt":
                rows.append({"id": f"line{lineno}", "prompt": line.rstrip("\r\n")})
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{p}:{lineno}: not valid JSON ({e.msg}); {fix}") from None
            if not isinstance(obj, dict) or "prompt" not in obj:
                raise ConfigError(f'{p}:{lineno}: line has no "prompt" field; {fix}')
            if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
                raise ConfigError(f'{p}:{lineno}: "prompt" must be a non-empty string; {fix}')
            rows.append(
                {"id": str(obj.get("id", f"line{lineno}")), **{k: v for k, v in obj.items() if k != "id"}}
            )
    if not rows:
        raise ConfigError(f"prompt file {p} has no prompts; {fix}")
    return rows
