"""`python -m experiments.run` writes a complete run folder; bad input is one clear line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from hydra import compose, initialize_config_dir

from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.tasks import sandbox
from viasd.tracking.store import RunStore

SUMMARY_KEYS = {"method", "pair", "task", "n_examples", "new_tokens", "wall_s", "tokens_per_s", "rejection_rate",
                "mean_accepted"}


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("method", ["ar", "sd", "hf_assisted", "viasd", "cascade_sd", "faster_cascades"])
def test_run_writes_config_summary_examples(method, runs_dir):
    s = run(_cfg("pair=tiny-llama", f"method={method}", "generation.max_new_tokens=6"))
    assert SUMMARY_KEYS <= set(s)
    d = runs_dir / s["run_id"]
    assert (d / "config.yaml").is_file() and (d / "meta.json").is_file()
    assert json.loads((d / "summary.json").read_text())["n_examples"] == s["n_examples"] > 0
    lines = [json.loads(x) for x in (d / "examples.jsonl").read_text().splitlines()]
    assert len(lines) == s["n_examples"] and all(len(x["token_ids"]) <= 6 and "prediction" in x for x in lines)
    again = run(_cfg("pair=tiny-llama", f"method={method}", "generation.max_new_tokens=6"))
    assert again["run_id"] == s["run_id"] and (d / "summary.json").stat().st_mtime_ns == \
        (runs_dir / s["run_id"] / "summary.json").stat().st_mtime_ns


@pytest.mark.parametrize("suffix,content", [
    (".jsonl", '{"prompt": "Hello there"}\n{"prompt": "Second prompt"}\n'),
    (".txt", "Hello there\n\nSecond prompt\n"),
])
def test_user_prompt_files(suffix, content, runs_dir, tmp_path):
    f = tmp_path / f"p{suffix}"
    f.write_text(content)
    s = run(_cfg("pair=tiny-qwen2", "method=sd", "task=prompts", f"task.path={f}", "generation.max_new_tokens=4"))
    assert s["n_examples"] == 2
    rows = [json.loads(x) for x in (runs_dir / s["run_id"] / "examples.jsonl").read_text().splitlines()]
    assert "Second prompt" in rows[1]["prompt"]


@pytest.mark.parametrize("args,needle", [
    (["method.name=sdd"], "unknown method 'sdd'. Did you mean 'sd'?"),
    (["method.gamma=0"], "gamma must be >= 1"),
    (["generation.temperature=-1"], "temperature must be >= 0"),
    (["generation.max_new_tokens=0"], "max_new_tokens must be >= 1"),
    (["task=prompts", "task.path=/nonexistent/prompts.jsonl"], "/nonexistent/prompts.jsonl"),
])
def test_cli_errors_are_one_line(args, needle, tmp_path):
    env = {**os.environ, "VIASD_RUNS_DIR": str(tmp_path), "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-m", "experiments.run", "pair=tiny-llama", *args], cwd=PROJECT_ROOT,
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 2, r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and needle in err[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args,lines", [
    (["method.gamma=abc"], ["Error merging override method.gamma=abc",
                            "Value 'abc' of type 'str' could not be converted to Integer"]),
    (["seed=abc"], ["seed=abc", "could not be converted to Integer"]),
    (["pair=tiny-llamma"], ["unknown pair 'tiny-llamma'. Did you mean 'tiny-llama'? Known pairs: "]),
])
def test_cli_type_errors_fail_at_compose_time(args, lines, tmp_path):
    """The schemas (viasd.harness.config, RunConfig for the top-level scalars) type the composition and
    the command line is composed before Hydra runs it (viasd.harness.cli): one line naming the key or
    the closest option, before anything is loaded and before a run folder opens (more cases, in
    process: tests/test_input_errors.py)."""
    env = {**os.environ, "VIASD_RUNS_DIR": str(tmp_path), "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-m", "experiments.run", "pair=tiny-llama", *args], cwd=PROJECT_ROOT,
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert all(x in r.stderr for x in lines), r.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("task", ["xsum", "cnndm", "wmt14_deen", "gsm8k", "nq_open", "squad", "humaneval", "mbpp",
                                  "specbench"])
def test_every_task_runs_end_to_end(task, runs_dir, any_data):
    if task in ("humaneval", "mbpp") and sandbox._isolation()[0] is None:
        pytest.skip(f"code sandbox unavailable here ({sandbox._isolation()[1]})")
    s = run(_cfg("pair=tiny-llama", "method=sd", f"task={task}", "task.n_examples=2", "generation.max_new_tokens=4"))
    assert s["n_examples"] == 2 and s["task"] == task
    rows = [json.loads(x) for x in (runs_dir / s["run_id"] / "examples.jsonl").read_text().splitlines()]
    assert all("prediction" in r and "reference" in r for r in rows)
    if task != "specbench":  # speed-only task has no metric
        assert any(k.startswith("metric/") for k in s)
        assert all("score" in r for r in rows)
    meta = json.loads((runs_dir / s["run_id"] / "meta.json").read_text())
    code = task in ("humaneval", "mbpp")  # the level its programs ran at, sealed with the run
    assert meta.get("isolation") == (sandbox._isolation()[0].level if code else None), meta
    assert RunStore(runs_dir).find(s["run_id"]) is not None


def test_ctrl_c_leaves_an_unfinished_run_and_says_where(tmp_path):
    """Ctrl-C once the decode loop has started (its progress bar is on stderr) — no fixed delay."""
    env = {**os.environ, "VIASD_RUNS_DIR": str(tmp_path), "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "experiments.run", "pair=tiny-llama", "method=sd",
                             "generation.max_new_tokens=2000", "generation.ignore_eos=true"],
                            cwd=tmp_path, env={**env, "PYTHONPATH": str(PROJECT_ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            # a pytest-xdist worker ignores SIGINT, and an ignored signal stays ignored across exec
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    chunks: list[bytes] = []
    in_loop = threading.Event()

    def read_stderr() -> None:  # the bar "sd on tiny-llama/…" is drawn inside the run's try block
        while chunk := os.read(proc.stderr.fileno(), 4096):
            chunks.append(chunk)
            if b" on tiny-llama/" in b"".join(chunks):
                in_loop.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert in_loop.wait(timeout=240), b"".join(chunks).decode(errors="replace")[-3000:]
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=60)
    err = b"".join(chunks).decode(errors="replace")
    run_dir = next(tmp_path.glob("*/examples.jsonl")).parent
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.replace("\r", "\n").splitlines()[-1] == f"interrupted: partial run left at {run_dir}, not marked finished"
    assert not (run_dir / "summary.json").exists()
    assert not (tmp_path / "outputs").exists()  # Hydra writes nothing of its own


def test_an_interrupted_run_resumes_after_the_examples_it_finished(runs_dir, monkeypatch):
    """A crash keeps finished examples: the next attempt at the same run decodes only the rest."""
    import viasd.harness.runner as runner_mod

    args = ("pair=tiny-llama", "method=sd", "task.n_examples=4", "generation.max_new_tokens=6")
    s = run(_cfg(*args))
    d = runs_dir / s["run_id"]
    lines = (d / "examples.jsonl").read_text().splitlines()
    (d / "summary.json").unlink()  # as a crash after two examples leaves it (plus half a line)
    (d / "examples.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])
    calls = []
    real = runner_mod.decode
    monkeypatch.setattr(runner_mod, "decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = run(_cfg(*args))
    assert len(calls) == 2 and again["resumed_examples"] == 2 and again["run_id"] == s["run_id"]
    rows = [json.loads(x) for x in (d / "examples.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [json.loads(x)["id"] for x in lines]
    assert [r["token_ids"] for r in rows] == [json.loads(x)["token_ids"] for x in lines]
    assert again["new_tokens"] == s["new_tokens"] and again["n_examples"] == 4


def test_a_single_run_prints_no_grid_callback_warning(runs_dir):
    out = subprocess.run([sys.executable, "-m", "experiments.run", "pair=tiny-llama", "task.n_examples=1",
                          "generation.max_new_tokens=2"], capture_output=True, text=True, timeout=300,
                         cwd=PROJECT_ROOT, env={**os.environ, "VIASD_RUNS_DIR": str(runs_dir)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Callback" not in out.stderr and "hydra.job.num" not in out.stderr, out.stderr[-2000:]
