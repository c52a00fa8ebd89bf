"""Gate files and ``experiments.train_gate`` are checked in depth (issue 62.6): a gate file whose
coefficients do not match its features, with a bad ``topk``, lists instead of tensors, NaN or zero-scale
coefficients (which made every probability NaN: every token escalated) is one error line naming the fix;
``train_gate topk=0``, ``seed=-1`` and a ``transfer=`` run of another pair are refused before anything is
trained."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from experiments import trace as trace_cmd
from experiments import train_gate as train_cmd
from tests.test_replay import _run
from viasd.core.gate import FEATURES
from viasd.engine.gate_file import load_gate, save_gate
from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT

F = len(FEATURES)


def good() -> dict:
    """A well-formed gate file's contents."""
    t = lambda v: torch.full((F,), v, dtype=torch.float64)  # noqa: E731
    return {"mean": t(0.0), "scale": t(1.0), "coef": t(0.1), "intercept": 0.5,
            "meta": {"pair": "tiny-llama", "mask": "layers:0,1,3", "layers": [0, 1, 3], "topk": 8, "lam": 0.5,
                     "features": list(FEATURES), "train_problems": [0, 1], "test_problems": [2]}}


def broken(**changes) -> dict:
    d = copy.deepcopy(good())
    for key, value in changes.items():
        if key.startswith("meta_"):
            if value is ...:
                del d["meta"][key[5:]]
            else:
                d["meta"][key[5:]] = value
        else:
            d[key] = value
    return d


nan = torch.full((F,), 0.1, dtype=torch.float64)
nan[3] = float("nan")
zero_scale = torch.ones(F, dtype=torch.float64)
zero_scale[5] = 0.0
BREAKS = {  # name -> (file contents, a fragment of the error line)
    "3 coefficients for 14 features": (broken(coef=torch.zeros(3, dtype=torch.float64)), "coef has shape [3]"),
    "2-D mean": (broken(mean=torch.zeros(1, F, dtype=torch.float64)), "mean has shape"),
    "topk 0": (broken(meta_topk=0), "meta.topk must be a whole number >= 1"),
    "topk text": (broken(meta_topk="abc"), "meta.topk"),
    "topk missing": (broken(meta_topk=...), "meta.topk"),
    "topk bool": (broken(meta_topk=True), "meta.topk"),
    "lists for tensors": (broken(mean=[0.0] * F, scale=[1.0] * F), "mean must be a float tensor"),
    "integer tensor": (broken(scale=torch.ones(F, dtype=torch.int64)), "scale must be a float tensor"),
    "nan coefficient": (broken(coef=nan), "coef holds NaN"),
    "nan mean": (broken(mean=nan), "mean holds NaN"),
    "zero scale": (broken(scale=zero_scale), "scale holds values <= 0"),
    "negative scale": (broken(scale=-torch.ones(F, dtype=torch.float64)), "scale holds values <= 0"),
    "nan intercept": (broken(intercept=float("nan")), "intercept must be a finite number"),
    "text intercept": (broken(intercept="1.0"), "intercept"),
    "no intercept": (broken(intercept=None), "intercept"),
    "no pair": (broken(meta_pair=None), "meta.pair"),
    "layers text": (broken(meta_layers="0,1,3"), "meta.layers"),
    "meta list": (broken(meta=[1, 2]), "not an object"),
    "top-level list": ([1, 2, 3], "not an object"),
    "other features": (broken(meta_features=["p_tok"]), "uses features"),
    "problems text": (broken(meta_train_problems="0,1"), "meta.train_problems"),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_every_malformed_gate_file_is_one_line_naming_the_fix(tmp_path, name):
    d, fragment = BREAKS[name]
    path = tmp_path / "gate.pt"
    torch.save(d, path)
    with pytest.raises(ConfigError) as e:
        load_gate(path)
    msg = str(e.value)
    assert fragment in msg and str(path) in msg and "\n" not in msg, msg
    assert "python -m experiments.train_gate" in msg, msg


def test_a_well_formed_gate_loads_and_save_refuses_what_would_not(tmp_path):
    path = tmp_path / "gate.pt"
    torch.save(good(), path)
    gate = load_gate(path)
    assert gate.topk == 8 and gate.probability(torch.zeros(2, F)).isfinite().all()
    with pytest.raises(ConfigError, match="scale holds values <= 0"):
        save_gate(tmp_path / "z.pt", [0.0] * F, [0.0] * F, [0.0] * F, 0.0, good()["meta"])
    assert not (tmp_path / "z.pt").exists()
    with pytest.raises(ConfigError, match="coef has shape"):
        save_gate(tmp_path / "c.pt", [0.0] * F, [1.0] * F, [0.0] * 3, 0.0, good()["meta"])


def test_the_committed_gates_load():
    files = sorted((PROJECT_ROOT / "results" / "gates").rglob("*.pt"))
    assert files
    for path in files:
        gate = load_gate(path)
        assert gate.topk >= 1 and gate.meta["pair"] == path.parts[-3]


def test_train_gate_refuses_bad_values_and_another_pairs_transfer_run(runs_dir, tmp_path, capsys):
    """``topk=0``, ``seed=-1`` and other out-of-range values are refused with one line before the traces are
    read; ``transfer=`` a run of another pair is refused before any labelling and no gate is written."""
    out = tmp_path / "gate.pt"
    for bad, msg in ((["topk=0"], "topk must be >= 1"), (["seed=-1"], "seed must be in [0, 2**32)"),
                     (["gamma=0"], "gamma must be >= 1"), (["min_rows=0"], "min_rows must be >= 1"),
                     (["live=0"], "live must be >= 1"), (["gate_temperature=0"], "gate_temperature must be > 0"),
                     (["gate_temperature=nan"], "gate_temperature must be > 0"), (["lam=nan"], "lam must be in"),
                     (["topk=abc"], "topk")):
        with pytest.raises(SystemExit) as e:
            train_cmd.main(["run=whatever", "mask=[0,1,3]", f"out={out}", *bad])
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and err.startswith("error: ") and err.count("\n") == 1, (bad, err)
    llama = _run("method=ar", "task.n_examples=4", "generation.max_new_tokens=16")["run_id"]
    qwen = _run("method=ar", "pair=tiny-qwen2", "task.n_examples=2", "generation.max_new_tokens=8")["run_id"]
    for rid in (llama, qwen):
        assert trace_cmd.main([f"run={rid}", "masks=[[0,1,3]]", "topk=64"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_cmd.main([f"run={llama}", "mask=[0,1,3]", f"out={out}", "min_rows=5", f"transfer={qwen}"])
    err = capsys.readouterr().err
    assert f"transfer run {qwen} was traced on pair 'tiny-qwen2', the gate is trained on 'tiny-llama'" in err
    assert err.count("\n") == 1 and not Path(out).exists()
    assert train_cmd.main([f"run={llama}", "mask=[0,1,3]", f"out={out}", "min_rows=5", f"transfer={llama}",
                           "test=0.5"]) == 0  # its own pair: a transfer row
    assert load_gate(out).meta["metrics"]["transfer"]["run"] == llama
