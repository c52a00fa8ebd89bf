"""Task registry, configs, offline loading, prompt rendering, post-processing and scoring.

Data tests take the ``any_data`` fixture: they run on the synthetic files written by
tests/helpers/synthetic_data.py, and again on the real offline folder when it exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tokenizers
import transformers
from omegaconf import OmegaConf
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tests.conftest import needs_real_data
from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT
from viasd.tasks import TASKS, Example, Task, build_task
from viasd.tasks.base import common_keys
from viasd.tasks.builtin_prompts import BUILTIN_PROMPTS
from viasd.tasks.families import extract_code_block

CONF = PROJECT_ROOT / "conf" / "task"
TASK_NAMES = [
    "prompts",
    "xsum",
    "cnndm",
    "wmt14_deen",
    "gsm8k",
    "nq_open",
    "squad",
    "humaneval",
    "mbpp",
    "specbench",
]
DATA_TASKS = [n for n in TASK_NAMES if n != "prompts"]
SCORED = ["xsum", "cnndm", "wmt14_deen", "gsm8k", "nq_open", "squad", "humaneval", "mbpp"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _tokenizer(chat: bool) -> transformers.PreTrainedTokenizerFast:
    """A tiny word-level tokenizer built offline, with or without a chat template."""
    vocab = {"[UNK]": 0, "[PAD]": 1, "the": 2, "a": 3}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    fast.chat_template = CHAT_TEMPLATE if chat else None
    return fast


def _cfg(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"), resolve=True)


_CACHE: dict[tuple, list[Example]] = {}


def _examples(name: str, n: int | None = 5) -> tuple[Task, list[Example]]:
    task = build_task({**_cfg(name), "n_examples": n})
    key = (os.environ.get("VIASD_DATA_DIR"), name, n)
    if key not in _CACHE:
        _CACHE[key] = task.examples()
    return task, _CACHE[key]


# --- registry and configs ------------------------------------------------------------


def test_every_task_yaml_key_is_known_and_every_option_has_its_yaml_default():
    """conf/task/*.yaml is the single source of task defaults: no unknown keys, no Python-only options."""
    for path in sorted(CONF.glob("*.yaml")):
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        kind = TASKS.get(str(raw.get("kind") or raw["name"]))
        known = set(common_keys()) | set(kind.options)
        assert not set(raw) - known, f"{path.name}: unknown keys {sorted(set(raw) - known)}"
        assert set(kind.options) <= set(raw), f"{path.name}: lacks {sorted(set(kind.options) - set(raw))}"
        assert build_task({"name": raw["name"]}).cfg == build_task(raw).cfg  # the YAML is the default


def test_every_task_is_registered_and_has_a_config():
    assert set(TASK_NAMES) <= set(TASKS.names())
    for name in TASK_NAMES:
        cfg = _cfg(name)
        for key in (
            "name",
            "offline_file",
            "hub",
            "source",
            "n_examples",
            "seed",
            "max_new_tokens",
            "stop_strings",
        ):
            assert key in cfg, f"conf/task/{name}.yaml lacks {key}"
        assert cfg["name"] == name and cfg["source"] in ("auto", "local")
        task = build_task(OmegaConf.load(CONF / f"{name}.yaml"))  # a DictConfig works too
        assert task.name == name and task.max_new_tokens > 0
        assert isinstance(task.stop_strings, list)
    hubs = {n: _cfg(n)["hub"] for n in SCORED}
    assert hubs["xsum"]["path"] == "EdinburghNLP/xsum"
    assert (hubs["cnndm"]["path"], hubs["cnndm"]["name"]) == ("abisee/cnn_dailymail", "3.0.0")
    assert hubs["wmt14_deen"]["name"] == "de-en"
    assert (hubs["gsm8k"]["path"], hubs["gsm8k"]["name"]) == ("openai/gsm8k", "main")
    assert hubs["humaneval"]["path"] == "openai/openai_humaneval"


def test_unknown_task_and_bad_config_are_config_errors():
    with pytest.raises(ConfigError, match="Did you mean 'gsm8k'"):
        build_task({"name": "gsm8"})
    with pytest.raises(ConfigError, match="unknown config keys.*n_exampels"):
        build_task({"name": "xsum", "n_exampels": 3})
    with pytest.raises(ConfigError, match="n_examples"):
        build_task({"name": "xsum", "n_examples": 0})
    with pytest.raises(ConfigError, match="n_shot"):
        build_task({"name": "gsm8k", "n_shot": 9})
    with pytest.raises(ConfigError, match="source: offline"):
        build_task({"name": "specbench", "source": "hub"}).examples()
    with pytest.raises(ConfigError, match="offline.*hub"):
        build_task({"name": "xsum", "source": "web"}).examples()


def test_missing_data_file_names_path_and_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path))
    with pytest.raises(ConfigError) as e:
        build_task({"name": "gsm8k"}).examples()
    msg = str(e.value)
    assert str(tmp_path / "math" / "gsm8k_test.jsonl") in msg and "VIASD_DATA_DIR" in msg
    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="VIASD_DATA_DIR"):
        build_task({"name": "xsum"}).examples()
    with pytest.raises(ConfigError, match=str(tmp_path / "absent.jsonl")):
        build_task({"name": "xsum", "offline_file": str(tmp_path / "absent.jsonl")}).examples()


# --- offline data --------------------------------------------------------------------


@pytest.mark.parametrize("name", DATA_TASKS)
def test_task_loads_its_offline_file(name, any_data):
    task, examples = _examples(name)
    assert len(examples) == 5
    for e in examples:
        assert isinstance(e.prompt, str) and e.prompt.strip()
        assert e.meta["plain_prompt"].strip()
        if name in SCORED:
            assert e.reference, f"{name} example {e.id} has an empty reference"
    assert len({e.id for e in examples}) == 5


@needs_real_data
def test_real_files_full_sizes(monkeypatch):
    from tests.conftest import REAL_DATA_DIR

    monkeypatch.setenv("VIASD_DATA_DIR", str(REAL_DATA_DIR))
    sizes = {"humaneval": 164, "mbpp": 500, "specbench": 480}
    for name, size in sizes.items():
        assert len(_examples(name, None)[1]) == size
    mbpp_ids = [int(e.id) for e in _examples("mbpp", None)[1]]
    assert min(mbpp_ids) == 11 and max(mbpp_ids) == 510


def test_seeded_subset_and_filters(any_data):
    a = [e.id for e in build_task({"name": "gsm8k", "n_examples": 20, "seed": 1}).examples()]
    b = [e.id for e in build_task({"name": "gsm8k", "n_examples": 20, "seed": 1}).examples()]
    c = [e.id for e in build_task({"name": "gsm8k", "n_examples": 20, "seed": 2}).examples()]
    assert a == b and a != c and len(set(a)) == 20
    assert a == sorted(a, key=int)  # kept in file order
    mbpp_ids = [int(e.id) for e in _examples("mbpp", None)[1]]
    assert mbpp_ids and all(11 <= i <= 510 for i in mbpp_ids)
    cats = {e.meta["category"] for e in build_task({"name": "specbench", "categories": ["qa"]}).examples()}
    assert cats == {"qa"}


def test_references_have_the_metric_shape(any_data):
    _, gsm = _examples("gsm8k")
    assert all("####" in e.reference and e.meta["gold"] for e in gsm)
    _, nq = _examples("nq_open")
    assert all(isinstance(e.reference, list) and all(isinstance(a, str) for a in e.reference) for e in nq)
    _, he = _examples("humaneval")
    assert all(e.reference.rstrip().endswith(f"check({e.meta['entry_point']})") for e in he)
    _, cnn = _examples("cnndm")
    assert all(" 's " not in e.reference and " ." not in e.reference for e in cnn)  # detokenized


# --- rendering -----------------------------------------------------------------------


@pytest.mark.parametrize("name", DATA_TASKS)
def test_render_with_and_without_chat_template(name, any_data):
    task, examples = _examples(name)
    e = examples[0]
    chat = task.render(e, _tokenizer(chat=True))
    assert chat.startswith("<|") and chat.endswith("<|assistant|>\n")
    assert f"<|user|>\n{e.prompt}<|end|>" in chat
    plain = task.render(e, _tokenizer(chat=False))
    assert "<|user|>" not in plain and plain.endswith(e.meta["plain_prompt"])
    assert task.render(e, None) == plain


def test_t5_style_plain_prefixes():
    row_tasks = {
        "xsum": ({"document": "Some article.", "summary": "S.", "id": 1}, "summarize: Some article."),
        "wmt14_deen": (
            {"de": "Guten Morgen", "en": "Good morning", "id": 0},
            "translate German to English: Guten Morgen",
        ),
    }
    for name, (row, expected) in row_tasks.items():
        task = build_task({"name": name})
        e = task.make_example(0, row)
        assert task.render(e, _tokenizer(chat=False)) == expected


def test_gsm8k_few_shot_in_both_forms():
    task = build_task({"name": "gsm8k"})
    e = task.make_example(0, {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"})
    chat = task.render(e, _tokenizer(chat=True))
    assert chat.count("<|user|>") == 9 and chat.count("<|assistant|>") == 9  # 8 shots + the question
    assert chat.count("The answer is") >= 8
    plain = task.render(e, None)
    assert plain.count("Q: ") == 9 and plain.endswith("Q: What is 2 + 2?\nA:")
    assert "There are 15 trees originally" in plain
    zero = build_task({"name": "gsm8k", "n_shot": 0})
    assert zero.render(e, None) == "Q: What is 2 + 2?\nA:"


def test_system_prompt_goes_first():
    task = build_task({"name": "prompts", "system_prompt": "Be brief."})
    e = task.examples()[0]
    assert task.render(e, _tokenizer(chat=True)).startswith("<|system|>\nBe brief.<|end|>\n<|user|>")


# --- post-processing -----------------------------------------------------------------


def test_postprocess_cuts_at_first_stop_and_strips():
    task = build_task({"name": "nq_open"})
    assert task.postprocess("  Paris\nQ: next question") == "Paris"
    assert task.postprocess("\n\n Paris \n") == "Paris"  # leading newlines do not empty the answer
    gsm = build_task({"name": "gsm8k"})
    assert gsm.postprocess("2 + 2 = 4. The answer is 4.\n\nQ: another") == "2 + 2 = 4. The answer is 4."
    assert gsm.stop_strings_for(_tokenizer(chat=False)) == ["\nQ:", "\n\nQuestion:"]
    assert gsm.stop_strings_for(_tokenizer(chat=True)) == []


def test_code_postprocess_keeps_indentation_and_extracts_fences():
    he = build_task({"name": "humaneval"})
    assert he.postprocess("    return a + b\n\ndef other():\n    pass") == "    return a + b"
    reply = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert he.postprocess(reply) == "def add(a, b):\n    return a + b"
    assert extract_code_block("```\nx = 1\n") == "x = 1\n"  # unclosed fence
    assert extract_code_block("no code") is None
    mbpp = build_task({"name": "mbpp"})
    assert mbpp.postprocess("def f(x):\n    return x\nassert f(1) == 1") == "def f(x):\n    return x"


# --- scoring -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, key",
    [("xsum", "rougeL"), ("cnndm", "rouge1"), ("wmt14_deen", "bleu"), ("gsm8k", "accuracy"),
     ("nq_open", "exact_match"), ("squad", "f1"), ("mbpp", "pass@1")],
)  # fmt: skip
def test_perfect_predictions_score_100(name, key, any_data):
    task, examples = _examples(name, 3)
    if name == "mbpp":
        preds = [e.meta["canonical_solution"] for e in examples]
    elif isinstance(examples[0].reference, list):
        preds = [e.reference[0] for e in examples]
    else:
        preds = [str(e.reference) for e in examples]
    corpus, per = task.score(preds, examples)
    assert corpus[key] == pytest.approx(100.0)
    assert len(per) == 3 and all(p[key] == pytest.approx(100.0) for p in per)
    assert all(isinstance(v, float) for v in corpus.values())


def test_score_real_like_outputs(any_data):
    task, examples = _examples("gsm8k", 3)
    preds = [f"Let me think. The answer is {e.meta['gold']}." for e in examples[:2]] + ["The answer is -1."]
    corpus, per = task.score(preds, examples)
    assert corpus["accuracy"] == pytest.approx(200 / 3)
    assert [p["accuracy"] for p in per] == [100.0, 100.0, 0.0]
    with pytest.raises(ValueError, match="predictions"):
        task.score(preds[:2], examples)


# --- the prompts task ----------------------------------------------------------------


def test_builtin_prompts():
    task = build_task(_cfg("prompts"))
    examples = task.examples()
    assert 6 <= len(examples) == len(BUILTIN_PROMPTS) <= 8
    kinds = {e.meta["kind"] for e in examples}
    assert kinds == {"summarization", "translation", "reasoning", "qa", "coding"}
    assert all(e.prompt.strip() for e in examples)
    assert task.score(["x"] * len(examples), examples) == ({}, [{}] * len(examples))
    subset = build_task({"name": "prompts", "n_examples": 3, "seed": 5}).examples()
    assert len(subset) == 3 and {e.id for e in subset} <= {e.id for e in examples}


def test_prompt_files(tmp_path):
    jl = tmp_path / "p.jsonl"
    jl.write_text(
        json.dumps({"prompt": "Hello there"}) + "\n\n" + json.dumps({"prompt": "Second", "id": "b"}) + "\n"
    )
    ex = build_task({"name": "prompts", "path": str(jl)}).examples()
    assert [e.prompt for e in ex] == ["Hello there", "Second"] and ex[1].id == "b"
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\n   \nsecond prompt\n")
    assert [e.prompt for e in build_task({"name": "prompts", "path": str(txt)}).examples()] == [
        "first prompt",
        "second prompt",
    ]


@pytest.mark.parametrize(
    "filename, content, match",
    [
        ("missing.jsonl", None, "prompt file not found"),
        ("empty.jsonl", "\n\n", "has no prompts"),
        ("empty.txt", "", "has no prompts"),
        ("noprompt.jsonl", '{"text": "hi"}\n', 'no "prompt" field'),
        ("blank.jsonl", '{"prompt": "  "}\n', "non-empty string"),
        ("bad.jsonl", "{not json\n", "not valid JSON"),
        ("p.csv", "a,b\n", "unsupported suffix"),
    ],
)
def test_prompt_file_errors_name_the_file_and_fix(tmp_path, filename, content, match):
    path = tmp_path / filename
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=match) as e:
        build_task({"name": "prompts", "path": str(path)}).examples()
    assert str(Path(path).resolve()) in str(e.value) and "task.path" in str(e.value)


def test_the_datasets_cache_is_per_user_without_viasd_cache_dir(monkeypatch, tmp_path):
    """Without ``VIASD_CACHE_DIR`` the datasets cache is one folder per user (a root-created shared folder
    made every non-root user's data loading fail); with it, the folder is under it."""
    import os

    from viasd.tasks import loading

    monkeypatch.delenv("VIASD_CACHE_DIR", raising=False)
    monkeypatch.setattr(loading.tempfile, "gettempdir", lambda: str(tmp_path))
    assert loading._datasets_cache_dir() == str(tmp_path / f"viasd-datasets-cache-{os.getuid()}")
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path / "c"))
    assert loading._datasets_cache_dir() == str(tmp_path / "c" / "datasets")
