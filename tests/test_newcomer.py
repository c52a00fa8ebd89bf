"""A newcomer's first hour (no data folder, no hub): reports find the committed runs, a grid names every task
it lacks data for at once, a trace asked for a draft the pair lacks refuses, the trained draft's run ids name
the prompts it is distilled on, and the small things printed along the way (cut prompts, cut-off outputs, the
interpreter in hints)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REAL_DATA_DIR
from tests.helpers.app import run_app
from viasd.distill.config import REFERENCE_PROMPTS_SHA256, DraftBuildConfig
from viasd.distill.data import selection_of
from viasd.distill.pair import DRAFT_PROMPTS, draft_prompts_identity
from viasd.harness.cli import python_command
from viasd.harness.interleave import shorten
from viasd.harness.summary import cut_off_warning
from viasd.paths import PROJECT_ROOT

TABLE5_COMMITTED = 16  # paper_figures/local/table5.sources.json: every run in results/runs/


def test_report_finds_the_committed_runs_without_a_data_folder(tmp_path, monkeypatch):
    """With no data folder a cell's id has no data-file hash (and a built-in-prompt draft): the committed runs are
    found by the hash they recorded, under their own (unchanged) ids."""
    from viasd.report.common import collect
    from viasd.tracking.store import RunStores

    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path / "no-data"))
    runs, missing = collect("table5", "local", RunStores.default(tmp_path / "runs"))
    assert (len(runs), missing) == (TABLE5_COMMITTED, [])
    assert all((PROJECT_ROOT / "results" / "runs" / r["run_id"]).is_dir() for r in runs)
    assert all(r["ar"] is not None for r in runs), "every speedup still has its matched ar run"


def test_the_trained_draft_names_its_prompts_unless_they_are_the_recipes(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path / "no-data"))
    sha, tag, n_train, n_held = selection_of(DraftBuildConfig(), None)
    assert (tag, n_train, n_held) == ("builtin", 41, 7)
    assert draft_prompts_identity({"draft": "trained"}) == {DRAFT_PROMPTS: f"builtin:{sha[:12]}"}
    assert draft_prompts_identity({"draft": "none"}) == {}
    if REAL_DATA_DIR is not None:  # the committed runs' recipe: their ids carry nothing new
        monkeypatch.setenv("VIASD_DATA_DIR", str(REAL_DATA_DIR))
        assert selection_of(DraftBuildConfig(), REAL_DATA_DIR)[0] == REFERENCE_PROMPTS_SHA256
        assert draft_prompts_identity({"draft": "trained"}) == {}


def test_a_grid_names_every_task_without_data_at_once(tmp_path, monkeypatch):
    """The start-of-grid check loads every task's data and names all that fail in one line, with the one
    command that fetches them (the grid used to stop at the first)."""
    from viasd.errors import ConfigError
    from viasd.harness.grid import check_prerequisites, exp_cells

    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path / "no-data"))
    cells = [cfg for _, cfg in exp_cells(["+exp=table2", "scale=smoke", "task.source=local"])]  # local: no hub
    with pytest.raises(ConfigError) as e:
        check_prerequisites(cells)
    assert "5 tasks of this grid have no data here" in str(e.value) and "\n" not in str(e.value)
    assert "python -m experiments.data fetch xsum wmt14_deen gsm8k nq_open humaneval" in str(e.value)


def test_trace_draft_true_on_a_pair_without_a_draft_refuses(tmp_path, monkeypatch, capsys):
    """``pair=hf`` with only a target (like SmolLM2 without pair.options.draft=trained): one error line
    naming a command that adds a draft, where it used to exit 0 and write nothing."""
    from experiments import trace
    from viasd.models.tiny import build_tiny_pair

    _, target, tok = build_tiny_pair("llama")
    target.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    runs = tmp_path / "runs"
    r = run_app("pair=hf", f"pair.target.id={tmp_path / 'tiny'}", "method=ar", "task=prompts", "task.n_examples=1",
                "generation.max_new_tokens=4", runs=runs)
    assert r.returncode == 0, r.stderr[-2000:]
    (run_id,) = [p.name for p in runs.iterdir() if "__ar__" in p.name]
    monkeypatch.setenv("VIASD_RUNS_DIR", str(runs))
    with pytest.raises(SystemExit) as e:
        trace.main([f"run={run_id}", "draft=true"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: draft=true:"), err
    assert "pair.draft.id=" in err[0] and "method.drafter.name=ngram" in err[0]


def test_shown_text_is_cut_at_a_word_with_an_ellipsis():
    text = "The town of Millbrook opened its first community bakery on Saturday"
    assert shorten(text, 300) == text
    assert shorten(text, 30) == "The town of Millbrook opened …"
    assert shorten("x" * 50, 10) == "xxxxxxxxx …"


@pytest.mark.parametrize(("tokens", "scored", "warns"), [([48, 48, 48, 20], True, True), ([48, 20, 20, 20], True, False),
                                                          ([48, 48], False, False), ([], True, False)])
def test_most_outputs_cut_off_warns(tokens, scored, warns):
    msg = cut_off_warning(tokens, 48, scored)
    assert (msg is not None) == warns
    if warns:
        assert "3/4 outputs stopped at generation.max_new_tokens=48" in msg


def test_hints_name_this_interpreter(tmp_path, monkeypatch):
    """Outside an activated venv the hint after a grid names the interpreter that ran it."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no `python` on PATH
    cmd = python_command()
    assert cmd != "python" and Path(cmd).name.startswith("python")
