"""Bad input is one line before anything is loaded (issue 29 item 6): config typos and wrong types
on the command line, binary or undecodable prompt/data files, prompts longer than the context."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from tests.helpers.app import run_app
from viasd.errors import ConfigError
from viasd.harness.cli import check_command_line
from viasd.harness.runner import run
from viasd.models.pairs import load_pair
from viasd.paths import PROJECT_ROOT
from viasd.tasks import build_task
from viasd.tasks.length import fit_examples, tokens_over
from viasd.tasks.loading import check_text_file, load_rows


@pytest.mark.parametrize("args,line", [
    (["pair=tiny-llamma"], "unknown pair 'tiny-llamma'. Did you mean 'tiny-llama'? Known pairs: gemma2-2b-9b, "),
    (["method=sdd"], "unknown method 'sdd'. Did you mean 'sd'? Known methods: ar, "),
    (["task=humaneva"], "unknown task 'humaneva'. Did you mean 'humaneval'?"),
    (["tracking=wandbb"], "unknown tracking 'wandbb'. Did you mean 'wandb'?"),
    (["+exp=fig_gapp"], "unknown exp 'fig_gapp'. Did you mean 'fig_gap'?"),
    (["+exp=fig_gap", "scale=smok"], "unknown scale 'smok'. Did you mean 'smoke'?"),
    (["+exp=fig_gap", "scale=cpu-large"], "unknown fig_gap scale 'cpu-large'. Known fig_gap scales: local, paper, smoke"),
    (["hydra/launcher=submitit_locl"], "unknown hydra/launcher 'submitit_locl'. Did you mean 'submitit_local'?"),
    (["-m", "method=ar,sdd"], "unknown method 'sdd'. Did you mean 'sd'?"),  # a swept value
    (["pairr=tiny-llama"], "unknown config key 'pairr'. Did you mean 'pair'?"),
    (["method.drafter.ngram_maxx=3"], "unknown config key 'method.drafter.ngram_maxx'. Did you mean 'method.drafter.ngram_max'?"),
    (["method.gama=3"], "unknown config key 'method.gama'. Did you mean 'method.gamma'?"),
    (["method=viasd", "method.tau_accept=high"], "method.tau_accept=high; Value 'high' of type 'str' could not be "
                                                 "converted to Float"),
    (["method.drafter.max_gamma=1.5"], "method.drafter.max_gamma=1.5; Value '1.5' of type 'float' could not be "
                                       "converted to Integer"),
    (["generation.top_k=abc"], "generation.top_k=abc; Value 'abc' of type 'str' could not be converted to Integer"),
    (["seed=abc"], "seed=abc; Value 'abc' of type 'str' could not be converted to Integer"),
    (["threads=two"], "threads=two; Value 'two' of type 'str' could not be converted to Integer"),
    (["dry_run=maybe"], "dry_run=maybe"),
    (["exp=table2"], "use +exp=table2"),
    (["method.gamma=[1"], "method.gamma=[1"),
])
def test_command_line_mistakes_are_one_line(args, line):
    with pytest.raises(ConfigError) as e:
        check_command_line(args)
    assert line in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "Available options" not in str(e.value) and "full_key" not in str(e.value)


@pytest.mark.parametrize("args", [["pair=tiny-llama", "method=sd"], ["+exp=table2", "scale=smoke", "method=ar,sd"],
                                  ["-m", "pair=tiny-llama", "method=ar,sd", "seed=0,1"], ["threads=null"],
                                  ["hydra/launcher=viasd_local"], ["--cfg", "job"], ["--help"]])
def test_good_command_lines_pass(args):
    if "hydra/launcher=viasd_local" in args:
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="viasd_local extends the submitit plugin")
    check_command_line(args)


def test_top_level_scalars_are_typed_at_compose_time():
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        for bad in ("seed=abc", "threads=x", "dry_run=maybe"):
            with pytest.raises(ConfigCompositionException):
                compose(config_name="config", overrides=[bad])
        cfg = compose(config_name="config", overrides=["seed=3", "threads=null"])
    assert cfg.seed == 3 and cfg.threads is None and cfg.exp is None


@pytest.mark.parametrize("content,needle", [
    (b"hello\x00world\n", "is binary, not text (NUL byte at byte offset 5)"),
    ("caf\u00e9\n".encode() + b"\xff\xfe more\n", "is not UTF-8 text (byte 0xff at byte offset 6 cannot be decoded)"),
    ("ok \u2713".encode()[:-1], "(byte 0xe2 at byte offset 3 cannot be decoded)"),  # cut inside a character
])
@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_binary_or_undecodable_prompt_file_names_file_and_offset(content, needle, suffix, tmp_path):
    f = tmp_path / f"prompts{suffix}"
    f.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        build_task({"name": "prompts", "path": str(f)}).examples()
    assert str(f) in str(e.value) and needle in str(e.value) and "\n" not in str(e.value)


def test_offsets_across_read_chunks(tmp_path, monkeypatch):
    f = tmp_path / "big.txt"
    f.write_bytes(b"a" * 9 + "\u2713".encode() + b"\xff")  # the check symbol straddles the first 10-byte chunk
    import viasd.tasks.loading as loading

    real_open = open

    class Small:  # reads 10 bytes at a time
        def __init__(self, *a, **k):
            self.f = real_open(*a, **k)

        def read(self, n):
            return self.f.read(10)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(loading, "open", Small, raising=False)
    with pytest.raises(ConfigError, match=r"byte 0xff at byte offset 12 "):
        check_text_file(f)


def test_undecodable_or_non_json_data_file_is_one_line(tmp_path):
    bad = tmp_path / "xsum.jsonl"
    data = b'{"document": "a", "summary": "b"}\n{"document": "\xc3\x28"}\n'
    bad.write_bytes(data)
    at = data.index(b"\xc3")
    with pytest.raises(ConfigError, match=rf"data file .*xsum.jsonl is not UTF-8 text \(byte 0xc3 at byte offset {at} "):
        load_rows("local", str(bad), None, "xsum")
    bad.write_text('{"document": "a"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"data file .*xsum.jsonl is not JSON lines"):
        load_rows("local", str(bad), None, "xsum")


def test_a_bad_prompt_file_stops_a_grid_before_its_first_cell(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    r = run_app("-m", "pair=tiny-llama", "method=ar,sd", "task=prompts", f"task.path={f}", runs=tmp_path / "runs")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and str(f) in errors[0] and "byte offset 8" in errors[0], r.stderr
    assert "(1/" not in r.stdout and not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def tiny_llama():
    """tiny-llama (one token per byte) declaring 2,048 positions, like a real model with a short context."""
    pair = load_pair("tiny-llama")
    for model in (pair.target, pair.draft):
        model.config.max_position_embeddings = 2048
    return pair


def test_prompt_longer_than_the_context_is_refused_naming_the_limit(tiny_llama, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a" * 3000 + "\nshort\n")
    task = build_task({"name": "prompts", "path": str(f)})
    with pytest.raises(ConfigError) as e:
        fit_examples(task, task.examples(), tiny_llama, 8)
    msg = str(e.value)
    assert "example 'line1' has 3000 prompt tokens" in msg and "2048 positions - max_new_tokens 8 = 2040" in msg
    assert "task.truncate=left|right" in msg and "\n" not in msg
    short = [ex for ex in task.examples() if ex.id == "line2"]
    assert fit_examples(task, short, tiny_llama, 8) == short  # what fits is untouched
    with pytest.raises(ConfigError, match="holds 2048 positions - max_new_tokens 2047 = 1"):
        fit_examples(task, short, tiny_llama, 2047)


def test_a_huge_prompt_is_refused_from_a_prefix(tiny_llama):
    """A 1 MB one-line prompt: counted on a few thousand characters, never tokenized whole."""
    counted = []

    def count(text: str) -> int:
        counted.append(len(text))
        return len(tiny_llama.tokenizer(text).input_ids)

    over = tokens_over(count, "The quick brown fox. " * 50_000, 2040)
    assert over is not None and over[0] > 2040 and not over[1] and sum(counted) < 20_000
    assert tokens_over(count, "x" * 2040, 2040) is None and tokens_over(count, "x" * 2041, 2040) == (2041, True)


@pytest.mark.parametrize("side", ["left", "right"])
def test_opt_in_truncation_cuts_the_prompt_to_fit(side, tiny_llama, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "START " + "mid " * 1000 + "END"}) + "\n")
    task = build_task({"name": "prompts", "path": str(f), "truncate": side})
    (ex,) = fit_examples(task, task.examples(), tiny_llama, 48)
    ids = tiny_llama.encode(task.render(ex, tiny_llama.tokenizer))
    assert 2000 - 8 <= ids.shape[1] <= 2000
    assert ex.prompt.endswith("END") if side == "left" else ex.prompt.startswith("START ")
    with pytest.raises(ConfigError, match="truncate must be left, right or null"):
        build_task({"name": "prompts", "truncate": "middle"})


def test_run_refuses_an_over_long_prompt_before_a_run_folder_or_prefill(runs_dir, tmp_path):
    f = tmp_path / "huge.txt"
    f.write_text("x" * 1_000_000 + "\n")
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["pair=tiny-llama", "method=sd", "task=prompts",
                                                       f"task.path={f}", "generation.max_new_tokens=8"])
    with pytest.raises(ConfigError, match="tiny-llama holds 16384 positions - max_new_tokens 8 = 16376"):
        run(cfg)
    assert not runs_dir.exists() or not list(runs_dir.iterdir())
