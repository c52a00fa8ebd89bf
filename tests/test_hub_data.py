"""The hub code path of every task, against a local stand-in of the hub layout.

Each test writes parquet files in the hub datasets' schemas (synthetic rows) under
``<tmp>/<dataset id>/<files>`` and loads the task with ``source: hub`` and ``hub_root`` set,
so the pinned file patterns and the field mappings to the offline schema run for real.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments.data import fetch
from experiments.data import main as data_main
from viasd.errors import ConfigError
from viasd.tasks import build_task
from viasd.tasks.families import HUB


def _hub_rows(name: str, i: int) -> dict:
    """One synthetic row in the hub schema of ``name``."""
    if name == "xsum":
        return {"document": f"Article {i} about a town.", "summary": f"Summary {i}.", "id": str(30000000 + i)}
    if name == "cnndm":
        return {"article": f"News {i} .", "highlights": f"Highlight {i} .", "id": f"{i:040x}"}
    if name == "wmt14_deen":
        return {"translation": {"de": f"Satz {i}.", "en": f"Sentence {i}."}}
    if name == "gsm8k":
        return {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
    if name == "nq_open":
        return {"question": f"who wrote book {i}", "answer": [f"Author {i}", f"A. {i}"]}
    if name == "squad":
        return {"id": f"q{i:04d}", "title": "T", "context": f"Context {i} says blue.", "question": f"Colour {i}?",
                "answers": {"text": ["blue", "blue"], "answer_start": [13, 13]}}
    if name == "humaneval":
        return {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n", "canonical_solution": "    return x\n",
                "test": "def check(c):\n    assert c(1) == 1\n", "entry_point": f"f{i}"}
    if name == "mbpp":
        return {"task_id": 11 + i, "text": f"Write f{i}.", "code": f"def f{i}(x): return x",
                "test_list": [f"assert f{i}(1) == 1"], "test_setup_code": "", "challenge_test_list": []}
    raise KeyError(name)


N_ROWS = 12


def _write_hub(root, name: str, rows: list[dict]) -> None:
    hub = HUB[name]
    pattern = hub["files"]
    rel = pattern.replace("*", "0000" if pattern.endswith("/*.parquet") else "00000-of-00001")
    path = root / hub["path"] / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    for name in HUB:
        _write_hub(root, name, [_hub_rows(name, i) for i in range(N_ROWS)])
    return root


@pytest.mark.parametrize("name", list(HUB))
def test_task_loads_through_hub_path(name, hub_root):
    task = build_task({"name": name, "source": "hub", "hub_root": str(hub_root), "n_examples": 4})
    assert task.source() == "hub"
    examples = task.examples()
    assert len(examples) == 4 and len({e.id for e in examples}) == 4
    for e in examples:
        assert e.prompt.strip() and e.meta["plain_prompt"].strip() and e.reference
    if name == "squad":
        assert examples[0].reference == ["blue"]
    if name == "wmt14_deen":
        assert examples[0].reference.startswith("Sentence ")
    if name == "xsum":
        assert examples[0].reference.startswith("Summary ")


@pytest.mark.parametrize("name", list(HUB))
def test_fetch_writes_offline_schema_and_auto_reads_it(name, hub_root, tmp_path, monkeypatch):
    out = tmp_path / "data"
    dest = fetch(name, out, str(hub_root))
    rows = [json.loads(line) for line in dest.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == N_ROWS
    offline_keys = {
        "xsum": {"document", "summary", "id"}, "cnndm": {"id", "article", "highlights", "references"},
        "wmt14_deen": {"id", "src_lang", "tgt_lang", "de", "en"}, "gsm8k": {"question", "answer"},
        "nq_open": {"question", "answer"}, "squad": {"id", "title", "context", "question", "answers"},
        "humaneval": {"task_id", "prompt", "entry_point", "canonical_solution", "test"},
        "mbpp": {"text", "code", "task_id", "test_setup_code", "test_list", "challenge_test_list"},
    }[name]
    assert set(rows[0]) == offline_keys
    # auto reads the fetched file; the seeded subset picks the same examples as the hub
    monkeypatch.setenv("VIASD_DATA_DIR", str(out))
    local = build_task({"name": name, "n_examples": 5, "seed": 3})
    hub = build_task({"name": name, "source": "hub", "hub_root": str(hub_root), "n_examples": 5, "seed": 3})
    assert local.source() == "local"
    assert [e.id for e in local.examples()] == [e.id for e in hub.examples()]
    assert [e.prompt for e in local.examples()] == [e.prompt for e in hub.examples()]


def test_subset_is_independent_of_row_order(tmp_path):
    rows = [_hub_rows("gsm8k", i) for i in range(40)]
    for sub, order in (("a", rows), ("b", rows[::-1])):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "g.jsonl").write_text("".join(json.dumps(r) + "\n" for r in order))
    pick = [
        sorted(e.prompt for e in build_task({"name": "gsm8k", "source": "local", "n_examples": 7,
                                             "offline_file": str(tmp_path / sub / "g.jsonl")}).examples())
        for sub in ("a", "b")
    ]
    assert pick[0] == pick[1]


def test_auto_without_data_and_hub_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path / "nowhere"))
    task = build_task({"name": "xsum", "hub_root": str(tmp_path / "empty-mirror")})
    assert task.source() == "hub"
    with pytest.raises(ConfigError) as e:
        task.examples()
    msg = str(e.value)
    assert "\n" not in msg and "experiments.data fetch xsum" in msg and "source=local" in msg
    with pytest.raises(ConfigError) as e:
        build_task({"name": "xsum", "source": "local"}).examples()
    msg = str(e.value)
    assert "experiments.data fetch xsum" in msg and "task.source=hub" in msg
    assert msg.count(str(tmp_path / "nowhere")) == 1


def test_data_cli(hub_root, tmp_path, capsys):
    assert data_main(["fetch", "gsm8k", "squad", "--out", str(tmp_path), "--hub-root", str(hub_root)]) == 0
    assert (tmp_path / "math" / "gsm8k_test.jsonl").is_file() and (tmp_path / "qa" / "squad_v1.1_dev_1000.jsonl").is_file()
    assert data_main(["fetch", "specbench", "--out", str(tmp_path)]) == 2
    assert "no hub dataset" in capsys.readouterr().err
    assert data_main(["list"]) == 0
    assert "refs/convert/parquet" in capsys.readouterr().out
