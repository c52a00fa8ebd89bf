"""Run store identity and files, exp overrides, and W&B runs parsed back from the offline log."""

from __future__ import annotations

import json
import stat
import struct
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from viasd.harness.grid import compose_cells
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.tracking.store import RunStore

TINY = ["pair=tiny-llama", "task=prompts", "generation.max_new_tokens=4", "task.n_examples=2"]


def _run(overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return run(compose(config_name="config", overrides=overrides))


def test_run_folder_files_share_one_mode_and_method_label_is_as_configured(runs_dir):
    s = _run(["method=sd_ngram", *TINY])
    assert s["method"] == "sd_ngram" and "__sd_ngram__" in s["run_id"]
    d = RunStore(runs_dir).path(s["run_id"])
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in d.iterdir()}
    assert set(modes) >= {"config.yaml", "meta.json", "examples.jsonl", "summary.json"}
    assert len(set(modes.values())) == 1, modes
    meta = json.loads((d / "meta.json").read_text())
    assert "git_dirty" in meta and "data_dir" in meta and "threads" in meta
    assert s["target_calls_per_token"] > 0 and "rejection_rate" in s


def test_editing_a_prompt_file_reruns(runs_dir, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Hello there"}\n')
    over = ["method=ar", "pair=tiny-llama", "task=prompts", f"task.path={f}", "generation.max_new_tokens=3"]
    a = _run(over)
    assert _run(over)["run_id"] == a["run_id"]  # unchanged file: the finished run is reused
    f.write_text('{"prompt": "Something else entirely"}\n')
    b = _run(over)
    assert b["run_id"] != a["run_id"]
    meta = json.loads((RunStore(runs_dir).path(b["run_id"]) / "meta.json").read_text())
    assert meta["inputs"]["task.path"]["path"] == str(f.resolve())
    assert len(meta["inputs"]["task.path"]["sha256"]) == 64


def test_slim_mask_used_is_recorded(runs_dir):
    s = _run(["method=viasd", "method.slim.mask=first_k", "method.slim.keep_ratio=0.5", *TINY])
    assert s["slim_mask/source"] == "first_k" and s["slim_mask/layers"] and len(s["slim_mask/sha256"]) == 64
    meta = json.loads((RunStore(runs_dir).path(s["run_id"]) / "meta.json").read_text())
    assert meta["slim_mask"]["layers"] == s["slim_mask/layers"]


def test_command_line_overrides_exp_values_and_seeds_expand():
    base = ["+exp=table2", "scale=smoke"]
    cells = compose_cells([*base, "generation.max_new_tokens=32", "seed=3"])
    assert len(cells) == 25 and all(c.generation.max_new_tokens == 32 and c.seed == 3 for c in cells)
    default = compose_cells(base)
    assert {c.generation.max_new_tokens for c in default} == {8}
    seeds = compose_cells([*base, "seed=0,1,2", "method=ar,sd", "task=xsum"])
    assert sorted((c.method.name, c.seed) for c in seeds) == [("ar", 0), ("ar", 1), ("ar", 2), ("sd", 0), ("sd", 1),
                                                             ("sd", 2)]


def read_wandb_log(path: Path) -> list:
    """Records of a ``.wandb`` file: a LevelDB-style log (32 KiB blocks of CRC'd chunks) of ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            chunks.append(buf + chunk)
    return [pb.Record.FromString(c) for c in chunks]


def read_complete(path: Path, timeout: float = 60.0) -> list:
    """Records of a ``.wandb`` file once its ``exit`` record is written (the W&B service flushes it late)."""
    deadline = time.time() + timeout
    while True:
        try:
            recs = read_wandb_log(path)
        except Exception:  # a chunk still being written
            recs = []
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.time() > deadline:
            return recs
        time.sleep(0.5)


def _offline_records(root: Path) -> list:
    logs = sorted(root.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 1, logs
    return read_complete(logs[0])


def _check_wandb_run(recs, job_type: str, steps: int) -> None:
    run_rec = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    assert run_rec.run_group == "adhoc" and run_rec.job_type == job_type
    assert {"tiny-llama", "prompts", "adhoc"} <= set(run_rec.tags)
    summary = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for r in recs
               if r.WhichOneof("record_type") == "summary" for i in r.summary.update}
    assert isinstance(summary["speedup_vs_ar"], float) and summary["speedup_vs_ar"] > 0
    assert {"speedup_at_quality", "rejection_rate", "target_calls_per_token"} <= set(summary)
    hist = [r.history for r in recs if r.WhichOneof("record_type") == "history"]
    keys = lambda h: [i.key or "/".join(i.nested_key) for i in h.item]  # noqa: E731 ("a/b" keys are nested)
    with_examples = [h for h in hist if any(k.startswith("example/") for k in keys(h))]
    assert len(with_examples) >= steps
    arts = [r.artifact.name for r in recs if r.WhichOneof("record_type") == "artifact"]
    assert any(a.startswith("run-tiny-llama__") for a in arts), arts


def test_wandb_offline_run_has_grouping_speedup_and_history(runs_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    _run(["method=ar", *TINY])
    s = _run(["method=sd_ngram", "tracking.wandb.mode=offline", *TINY])
    assert s["speedup_vs_ar"] > 0
    _check_wandb_run(_offline_records(runs_dir), "sd_ngram", 2)


def test_sync_uploads_finished_runs_offline(runs_dir, tmp_path, monkeypatch):
    from experiments import sync

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    _run(["method=ar", *TINY])
    s = _run(["method=sd_ngram", *TINY])
    assert sync.main(["--runs", str(runs_dir), "--mode", "offline"]) == 0
    logs = sorted(runs_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 2
    recs = next(rs for rs in map(read_complete, logs)
                if any(r.WhichOneof("record_type") == "run" and r.run.job_type == "sd_ngram" for r in rs))
    _check_wandb_run(recs, "sd_ngram", 2)
    assert (RunStore(runs_dir).path(s["run_id"]) / "wandb.json").is_file()
    assert sync.main(["--runs", str(runs_dir), "--mode", "offline"]) == 0  # uploaded before: skipped
    assert len(sorted(runs_dir.glob("wandb/offline-run-*"))) == 2


@pytest.mark.parametrize("name", ["thresholds", "thresholds_bayes"])
def test_sweeps_optimise_speedup_at_quality(name):
    import yaml

    sweep = yaml.safe_load((PROJECT_ROOT / "conf" / "sweep" / f"{name}.yaml").read_text())
    assert sweep["metric"] == {"name": "speedup_at_quality", "goal": "maximize"}


def test_tune_runs_optuna_trials_on_the_same_objective(runs_dir):
    from experiments import tune

    assert tune.main(["--trials", "2", "pair=tiny-llama", "task=prompts", "task.n_examples=1",
                      "generation.max_new_tokens=4"]) == 0
    import optuna

    study = optuna.load_study(study_name="viasd-thresholds", storage=f"sqlite:///{runs_dir / 'tune-viasd-thresholds.db'}")
    assert len(study.trials) == 2 and all(t.value is not None and t.value > 0 for t in study.trials)


def test_turning_wandb_on_for_a_finished_run_logs_it(runs_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    _run(["method=ar", *TINY])
    s = _run(["method=sd_ngram", *TINY])
    assert not list(runs_dir.glob("wandb/offline-run-*"))
    assert _run(["method=sd_ngram", "tracking.wandb.mode=offline", *TINY])["run_id"] == s["run_id"]  # skipped
    _check_wandb_run(_offline_records(runs_dir), "sd_ngram", 2)
