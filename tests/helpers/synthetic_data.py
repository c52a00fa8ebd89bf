"""Synthetic offline evaluation data, written by the tests themselves.

:func:`write_synthetic_data` fills a folder with one small file per task, at the same relative
paths and with the same fields as the real offline files (see each task's ``offline_file``),
so that every task's loader, templates, metric and the exp smoke grids run on a fresh clone
without the real data folder. All text is invented here; nothing is copied from a dataset.

Point ``VIASD_DATA_DIR`` at the returned folder to use it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

__all__ = ["write_synthetic_data", "SYNTHETIC_SIZES"]

_TOPICS = [
    ("river", "The town council of Brindle voted to clean the old river banks next spring."),
    ("bakery", "A small bakery in Norwick now sells bread made from a forgotten grain."),
    ("library", "The Elmstead library opened a reading room that stays open all night."),
    ("bridge", "Engineers finished repairs on the stone bridge two weeks ahead of plan."),
    ("garden", "Volunteers planted four hundred trees in the new community garden."),
    ("train", "The coastal train line will add a second morning service in May."),
    ("school", "Pupils at Harrow Lane school built a weather station on the roof."),
    ("museum", "The harbour museum found a lost map of the old fishing routes."),
    ("market", "Farmers at the Saturday market sold out of apples before noon."),
    ("festival", "The lantern festival drew record crowds despite the light rain."),
    ("cycling", "A new cycle path now links the two villages along the canal."),
    ("orchestra", "The youth orchestra will tour three cities over the summer."),
]
_DE_EN = [
    ("Der blaue Zug fährt heute früher ab.", "The blue train leaves earlier today."),
    ("Meine Schwester liest gern alte Bücher.", "My sister likes to read old books."),
    ("Im Garten wachsen viele rote Blumen.", "Many red flowers grow in the garden."),
    ("Wir treffen uns morgen am Bahnhof.", "We will meet at the station tomorrow."),
    ("Das Wetter ist am Wochenende schön.", "The weather is nice at the weekend."),
    ("Der Bäcker öffnet um sechs Uhr.", "The baker opens at six o'clock."),
    ("Die Kinder spielen am Fluss.", "The children play by the river."),
    ("Er trinkt jeden Morgen einen Tee.", "He drinks a tea every morning."),
    ("Die Brücke wurde letztes Jahr gebaut.", "The bridge was built last year."),
    ("Sie kauft Äpfel auf dem Markt.", "She buys apples at the market."),
    ("Das Museum ist montags geschlossen.", "The museum is closed on Mondays."),
    ("Unser Hund schläft unter dem Tisch.", "Our dog sleeps under the table."),
]
_QA = [
    ("what colour is the door of the lighthouse in brindle", ["green"]),
    ("how many bridges cross the norwick canal", ["seven", "7"]),
    ("who founded the elmstead reading room", ["Ada Marlow"]),
    ("in which month is the lantern festival held", ["October"]),
    ("what grain does the norwick bakery use", ["spelt"]),
    ("how long is the harrow lane cycle path", ["four miles", "4 miles"]),
    ("who conducts the youth orchestra", ["Tomas Reyes"]),
    ("what is kept in the harbour museum", ["a map", "old maps"]),
    ("when does the saturday market open", ["eight o'clock", "8am"]),
    ("what did the pupils build on the roof", ["a weather station"]),
    ("which river runs through brindle", ["the Wend"]),
    ("how many trees were planted in the garden", ["four hundred", "400"]),
]
_FUNCS = [
    ("add_one", "x", "return x + 1", [(1, 2), (5, 6), (-1, 0)]),
    ("double", "x", "return 2 * x", [(2, 4), (0, 0), (7, 14)]),
    ("square", "x", "return x * x", [(3, 9), (-2, 4), (0, 0)]),
    ("negate", "x", "return -x", [(3, -3), (0, 0), (-4, 4)]),
    ("is_even", "n", "return n % 2 == 0", [(2, True), (3, False), (0, True)]),
    ("last_digit", "n", "return abs(n) % 10", [(123, 3), (-47, 7), (5, 5)]),
    ("count_vowels", "s", "return sum(c in 'aeiou' for c in s.lower())", [("'apple'", 2), ("'sky'", 0), ("'AEIOU'", 5)]),
    ("reverse_text", "s", "return s[::-1]", [("'abc'", "'cba'"), ("''", "''"), ("'ab'", "'ba'")]),
    ("halve", "x", "return x // 2", [(9, 4), (10, 5), (1, 0)]),
    ("triple", "x", "return 3 * x", [(1, 3), (2, 6), (0, 0)]),
    ("max_of_two", "a, b", "return a if a >= b else b", [("1, 2", 2), ("5, 3", 5), ("4, 4", 4)]),
    ("min_of_two", "a, b", "return a if a <= b else b", [("1, 2", 1), ("5, 3", 3), ("4, 4", 4)]),
]
_SPECBENCH_CATEGORIES = ["writing", "translation", "summarization", "qa", "math_reasoning", "rag"]

SYNTHETIC_SIZES = {"xsum": 12, "cnndm": 12, "wmt14_deen": 12, "gsm8k": 24, "nq_open": 12, "squad": 12,
                   "humaneval": 12, "mbpp": 12, "specbench": 12}  # fmt: skip


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _ptb(text: str) -> str:
    """A PTB-style tokenization of invented text (space before punctuation and 's)."""
    return text.replace("'s", " 's").replace(".", " .").replace(",", " ,")


def _call(args: Any) -> str:
    return str(args)


def write_synthetic_data(root: Path) -> Path:
    """Write every task's synthetic offline file under ``root``; returns ``root``.

    Sizes per task are :data:`SYNTHETIC_SIZES`. Every HumanEval/MBPP canonical solution passes
    its tests, every GSM8K answer ends with ``#### <number>``, and the CNN/DM text is
    PTB-tokenized like the real SummEval file.
    """
    root = Path(root)
    docs = [f"{s} Residents said the {t} had been discussed for years. Officials, however, hoped the "
            f"{t} plan would be a model for other towns. The work's cost was shared by local groups."
            for t, s in _TOPICS]  # fmt: skip
    _write_jsonl(root / "summarization/xsum_test_1000.jsonl",
                 [{"document": d, "summary": s, "id": 40000000 + i} for i, (d, (_, s)) in enumerate(zip(docs, _TOPICS))])
    _write_jsonl(root / "summarization/cnndm_test_summeval_100.jsonl", [
        {"id": f"dm-test-{i:040x}", "article": _ptb(d), "highlights": _ptb(s),
         "references": [_ptb(s)] + [f"Reference {k} about the {t} ." for k in range(1, 11)]}
        for i, (d, (t, s)) in enumerate(zip(docs, _TOPICS))
    ])  # fmt: skip
    _write_jsonl(root / "translation/wmt14_newstest2014_de-en.jsonl",
                 [{"id": i, "src_lang": "de", "tgt_lang": "en", "de": de, "en": en} for i, (de, en) in enumerate(_DE_EN)])
    gsm = []
    for i in range(SYNTHETIC_SIZES["gsm8k"]):
        a, b = 3 + i, 2 + (i % 5)
        gsm.append({"question": f"Mira has {a} boxes with {b} pencils in each box. How many pencils does she have?",
                    "answer": f"She has {a} * {b} = <<{a}*{b}={a * b}>>{a * b} pencils.\n#### {a * b}"})
    _write_jsonl(root / "math/gsm8k_test.jsonl", gsm)
    _write_jsonl(root / "qa/nq_open_dev.jsonl", [{"question": q, "answer": a} for q, a in _QA])
    _write_jsonl(root / "qa/squad_v1.1_dev_1000.jsonl", [
        {"id": f"{i:024x}", "title": t.capitalize(), "context": f"{s} The answer is {a[0]}.",
         "question": q.capitalize() + "?", "answers": [a[0], a[0]]}
        for i, ((t, s), (q, a)) in enumerate(zip(_TOPICS, _QA))
    ])  # fmt: skip
    he = []
    for i, (name, args, body, cases) in enumerate(_FUNCS):
        prompt = f'def {name}({args}):\n    """Compute {name.replace("_", " ")} of the input."""\n'
        test = "def check(candidate):\n" + "".join(f"    assert candidate({_call(x)}) == {y}\n" for x, y in cases)
        he.append({"task_id": f"HumanEval/{i}", "prompt": prompt, "entry_point": name,
                   "canonical_solution": f"    {body}\n", "test": test})
    _write_jsonl(root / "code/HumanEval.jsonl", he)
    (root / "code/HumanEval.jsonl.gz").write_bytes(gzip.compress((root / "code/HumanEval.jsonl").read_bytes()))
    _write_jsonl(root / "code/mbpp.jsonl", [
        {"text": f"Write a function {name} that computes {name.replace('_', ' ')}.",
         "code": f"def {name}({args}):\n    {body}", "task_id": 11 + i, "test_setup_code": "",
         "test_list": [f"assert {name}({_call(x)}) == {y}" for x, y in cases], "challenge_test_list": []}
        for i, (name, args, body, cases) in enumerate(_FUNCS)
    ])  # fmt: skip
    spec = []
    for i in range(SYNTHETIC_SIZES["specbench"]):
        cat = _SPECBENCH_CATEGORIES[i % len(_SPECBENCH_CATEGORIES)]
        row: dict[str, Any] = {"question_id": 81 + i, "category": cat,
                               "turns": [f"Please help with this {cat} request about the {_TOPICS[i][0]}.",
                                         "Now make it shorter."]}
        if cat in ("translation", "summarization"):
            row["reference"] = [f"A reference answer about the {_TOPICS[i][0]}."]
        spec.append(row)
    _write_jsonl(root / "specbench/question.jsonl", spec)
    return root
