"""The benchmark command runs end to end and writes its JSON (speed goals live there, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from viasd.paths import PROJECT_ROOT


def test_bench_command_prints_table_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-m", "experiments.bench", "pair=tiny-llama", "n_prompts=2", "max_new_tokens=8",
                        f"out={out}", "+variants.sd_ngram={method: sd, gamma: 3, drafter: {name: ngram}}"],
                       cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| variant | tokens_per_s | speedup_vs_ar |" in r.stdout
    table = r.stdout
    rows = {row["variant"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ar", "sd", "hf_assisted", "sd_ngram"}
    ar, sd = rows["ar"], rows["sd"]
    assert ar["speedup_vs_ar"] == 1.0 and ar["target_calls"] == ar["new_tokens"] == 2 * 8
    for name in ("sd", "sd_ngram", "hf_assisted"):  # lossless: the same tokens, counted the same way
        r = rows[name]
        assert r["token_match_vs_ar"] == 1.0 and r["new_tokens"] == ar["new_tokens"], name
        # every round is one target call emitting its accepted draft tokens plus one target token
        assert r["target_calls"] == r["rounds"] == r["new_tokens"] - r["accepted"], (name, r)
        assert r["accepted"] + r["rejected"] == r["drafted"], (name, r)
        assert r["rejection_rate"] == pytest.approx(r["rejected"] / r["drafted"]), (name, r)
    # the seeded tiny draft agrees with its target on a few tokens, so SD saves target calls
    assert sd["accepted"] > 0 and sd["target_calls"] < ar["target_calls"]
    assert rows["sd"]["block_cost_T"] > 0 and rows["sd"]["ideal_speedup_flat"] > 0
    assert json.loads(out.read_text())["meta"]["runtime"]["backend"] == "packed"
    # host syncs (viasd.harness.host_syncs): ar and sd read the device once per round, plus set-up
    assert "| host_syncs_per_token | host_syncs_per_round |" in table
    assert ar["host_syncs_per_round"] <= 1 + 2 * 2 / 16 and sd["host_syncs_per_round"] <= 1 + 2 * 2 / sd["rounds"]


def test_cost_curve_command_covers_every_model_and_backend(tmp_path):
    out = tmp_path / "curve.json"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-m", "experiments.bench", "--cost-curve", "pair=tiny-qwen2", "curve.ks=3",
                        "curve.reps=1", "curve.context=32", f"curve.out={out}", "curve.cost.enabled=false"],
                       cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| backend | model | weight_mb | t1_ms | r1 | r2 | r3 | floor_ms | floor_frac |" in r.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(row["backend"], row["model"]) for row in rows] == [
        (b, m) for b in ("eager", "packed") for m in ("draft", "slim@0.80", "target")]
    assert all(row["r1"] == 1.0 and row["r3"] > 0 and row["floor_ms"] > 0 for row in rows)


def test_bench_never_writes_the_committed_results_by_default(monkeypatch, tmp_path):
    """Only an explicit ``out=bench_results/…`` writes the tracked tables; the default is the run store."""
    from hydra import compose, initialize_config_dir

    monkeypatch.setenv("VIASD_RUNS_DIR", str(tmp_path))
    for name in ("bench", "bench_smollm2", "bench_qwen2_1.5b"):
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name=name)
        assert str(cfg.out).startswith(str(tmp_path)) and str(cfg.curve.out).startswith(str(tmp_path)), name


def test_sandbox_section_times_each_isolation_level(tmp_path):
    from viasd.tasks import sandbox

    out = tmp_path / "sandbox.json"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env["VIASD_DATA_DIR"] = str(tmp_path / "no-data")  # the synthetic samples, even beside ../shared/data (CI)
    r = subprocess.run([sys.executable, "-m", "experiments.bench", "--sandbox", "sandbox_opts.n_samples=2",
                        "sandbox_opts.reps=1", f"sandbox_opts.out={out}"],
                       cwd=tmp_path, env={**env, "PYTHONPATH": str(PROJECT_ROOT)}, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| level | samples | median_ms | min_ms | samples_per_s | x_unsafe | x_root | floor_ms | cgroup |" in r.stdout
    data = json.loads(out.read_text())
    rows = {row["level"]: row for row in data["rows"]}
    assert set(sandbox.levels()) | {"unsafe"} <= set(rows) and data["meta"]["source"] == "synthetic"
    assert rows["unsafe"]["x_unsafe"] == 1.0 and all(row["samples"] == 2 for row in data["rows"][:-1])
    assert data["rows"][-1]["level"].startswith("interpreter start")
    # structure only: which way the times compare is the benchmark's to say (its "orderings"), not a unit test's
    for level in ("root namespaces", "rootless namespaces"):
        if level in rows:
            row = rows[level]
            assert row["x_unsafe"] == pytest.approx(row["median_ms"] / rows["unsafe"]["median_ms"])
            assert row["floor_ms"] > 0 and row["cgroup"] in ("yes", "no (rlimits)")
            claims = {f"{level} costs more than unsafe", f"{level} floor below a sample"}
            assert claims <= set(data["meta"]["orderings"]) and all(f"  {c}: " in r.stdout for c in claims)
    assert all(type(v) is bool for v in data["meta"]["orderings"].values())


def test_the_sandbox_bench_checks_its_orderings():
    from viasd.harness.sandbox_bench import orderings

    rows = [{"level": "root namespaces", "median_ms": 150.0, "x_unsafe": 1.7, "floor_ms": 90.0},
            {"level": "rootless namespaces", "median_ms": 80.0, "x_unsafe": 0.9, "floor_ms": 95.0},
            {"level": "unsafe", "median_ms": 88.0, "x_unsafe": 1.0, "floor_ms": float("nan")},
            {"level": "interpreter start (python3 -I -c pass)", "samples": 3, "median_ms": 25.0}]  # fmt: skip
    assert orderings(rows) == {"root namespaces costs more than unsafe": True,
                               "root namespaces floor below a sample": True,
                               "rootless namespaces costs more than unsafe": False,
                               "rootless namespaces floor below a sample": False}  # fmt: skip
