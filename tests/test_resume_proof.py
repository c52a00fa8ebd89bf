"""A resume keeps only records that prove themselves (issue 62 item 3): an edited record of an
interrupted (or summary-less) run is decoded again, never sealed into a finished run — whether the
edit breaks the records' checksum chain or the chain was recomputed to match it."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

import viasd.harness.runner as runner_mod
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.tracking.proof import CHAIN_KEY, chain_of, chained_prefix
from viasd.tracking.store import RunStore

ARGS = ("pair=tiny-llama", "method=ar", "task=prompts", "task.n_examples=4", "generation.max_new_tokens=6")


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _rows(d):
    return [json.loads(x) for x in (d / "examples.jsonl").read_text().splitlines()]


def _write(d, rows):
    (d / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def finished(runs_dir, monkeypatch):
    """A finished run, then its summary deleted (what the issue's user did), and a decode counter."""
    s = run(_cfg(*ARGS))
    d = runs_dir / s["run_id"]
    (d / "summary.json").unlink()
    calls = []
    real = runner_mod.decode
    monkeypatch.setattr(runner_mod, "decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    return s["run_id"], d, calls


def test_every_record_carries_its_link_of_the_chain(finished):
    rid, d, _ = finished
    rows = _rows(d)
    assert all(CHAIN_KEY in r for r in rows) and chained_prefix(rid, rows) == (4, "")
    assert chained_prefix("tiny-llama__ar__prompts__0000000000", rows)[0] == 0  # copied in from another run
    del rows[1][CHAIN_KEY]
    assert chained_prefix(rid, rows) == (1, f"record 2 carries no {CHAIN_KEY} (written before the chain existed)")


def test_a_resume_decodes_an_edited_record_again(finished, capsys):
    rid, d, calls = finished
    rows = _rows(d)
    rows[2]["prediction"] = "EDITED"
    _write(d, rows)
    again = run(_cfg(*ARGS))
    out = capsys.readouterr().out
    assert f"{rid}: the interrupted attempt's record 3 is not the one written (its {CHAIN_KEY} differs" in out
    assert len(calls) == 2 and again["resumed_examples"] == 2  # records 3 and 4 decoded again
    new = _rows(d)
    assert "EDITED" not in (d / "examples.jsonl").read_text()
    assert [r["token_ids"] for r in new] == [r["token_ids"] for r in rows]  # greedy: the same decode
    assert chained_prefix(rid, new) == (4, "") and RunStore(d.parent).is_finished(rid)


def test_a_recomputed_chain_is_still_held_to_the_records_tokens(finished, capsys):
    """An edit whose chain was recomputed to match: the record is checked against its token ids."""
    rid, d, calls = finished
    rows = _rows(d)
    rows[1]["prediction"] = "EDITED"
    prev = rows[0][CHAIN_KEY]
    for r in rows[1:]:
        r[CHAIN_KEY] = prev = chain_of(prev, r)
    _write(d, rows)
    assert chained_prefix(rid, rows) == (4, "")
    again = run(_cfg(*ARGS))
    out = capsys.readouterr().out
    assert "record 2 (its prediction is not the task's reading of its raw_output)" in out
    assert len(calls) == 3 and again["resumed_examples"] == 1
    assert "EDITED" not in (d / "examples.jsonl").read_text()


def test_an_untouched_interrupted_run_resumes_after_all_its_records(finished, capsys):
    rid, d, calls = finished
    again = run(_cfg(*ARGS))
    assert not calls and again["resumed_examples"] == 4
    assert "decoding the rest again" not in capsys.readouterr().out
