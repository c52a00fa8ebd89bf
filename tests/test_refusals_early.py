"""A decode the runner would refuse once its pair is loaded is refused before a run folder exists,
and the dry run and the grid's start flag it (issue 62 item 7): ``method.gate=oracle``,
``+pair.compile=true`` with ``via_sd``, a gate file trained for another pair."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

import viasd.harness.dryrun as dr
from viasd.core.gate import FEATURES
from viasd.engine.gate_file import save_gate
from viasd.errors import ConfigError
from viasd.harness.prereq import check_ready, decode_refusal
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT

TINY = ("pair=tiny-llama", "task=prompts", "task.n_examples=1", "generation.max_new_tokens=4")


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[*TINY, *overrides])


def _foreign_gate(tmp_path):
    n = len(FEATURES)
    return save_gate(tmp_path / "gate.pt", [0.0] * n, [1.0] * n, [0.0] * n, 0.0,
                     {"pair": "gemma2-2b-9b", "layers": [0, 1], "topk": 4, "mask": "every_other"})


CASES = {
    "oracle": (("method=via_sd", "method.gate=oracle"), "method.gate=oracle is replay-only"),
    "compile": (("method=via_sd", "+pair.compile=true"), r"\+pair.compile=true .* through a slim verifier"),
    "foreign gate": (("method=via_sd", "method.gate=learned"), "was trained for pair 'gemma2-2b-9b'"),
}


def _overrides(case, tmp_path):
    extra, match = CASES[case]
    if case == "foreign gate":
        extra = (*extra, f"method.gate_path={_foreign_gate(tmp_path)}")
    return extra, match


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("VIASD_DRYRUN_GPUS", raising=False)


@pytest.mark.parametrize("case", list(CASES))
def test_refused_before_a_run_folder_exists(case, runs_dir, tmp_path, monkeypatch):
    import viasd.harness.runner as runner_mod

    extra, match = _overrides(case, tmp_path)
    monkeypatch.setattr(runner_mod, "cached_pair", lambda *a: pytest.fail("the pair was loaded before the refusal"))
    with pytest.raises(ConfigError, match=match):
        run(_cfg(*extra))
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


@pytest.mark.parametrize("case", list(CASES))
def test_the_dry_run_and_the_grid_flag_it(case, runs_dir, tmp_path, capsys):
    extra, match = _overrides(case, tmp_path)
    cells = [_cfg(*extra), _cfg("method=ar")]
    plans = dr.dry_run(cells, "two")
    out = capsys.readouterr().out
    assert [bool(p.refused) for p in plans] == [True, False]
    assert "(1/2) run tiny-llama/via_sd/prompts  [REFUSED]" in out and "(2/2) run tiny-llama/ar/prompts\n" in out
    assert "1 would be refused" in out and "before this grid can start: 1 cell(s) would be refused: " in out
    with pytest.raises(ConfigError, match=match):
        check_ready(cells)
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_what_is_not_refused():
    assert decode_refusal(_cfg("method=via_sd")) is None
    assert decode_refusal(_cfg("method=sd", "+pair.compile=true")) is None
    assert decode_refusal(_cfg("method=ar", "+pair.compile=true")) is None
