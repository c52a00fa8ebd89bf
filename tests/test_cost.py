"""The load-free cost model (viasd.analysis.cost): pricing, layer decomposition, predictions from
counters and replays, the stored cost file of ``experiments.bench --cost-curve``, and validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from experiments import bench as bench_cmd
from experiments import cost as cost_cmd
from experiments import replay as replay_cmd
from experiments import trace as trace_cmd
from viasd.analysis.cost import COST, CostModel, cost_name, find_cost, predict_example
from viasd.errors import ConfigError
from viasd.harness.runner import run
from viasd.models.pairs import load_pair
from viasd.paths import PROJECT_ROOT

NS, CTX, PRE = [1, 2, 4, 8], [0, 1000], [64, 256]


def linear(base: float, per_n: float, per_ctx: float) -> dict:
    """A curve ``t = base + per_n·n + per_ctx·ctx`` on the grid (prefill at ctx 0)."""
    return {"decode": [[base + per_n * n + per_ctx * c for c in CTX] for n in NS],
            "prefill": [base + per_n * n for n in PRE]}


def synthetic(pair: str = "tiny-llama") -> dict:
    return {"grid": {"ns": NS, "contexts": CTX, "prefill_ns": PRE},
            "meta": {"pair": pair},
            "models": {"target": {"n_layers": 4, "native": linear(1e-3, 1e-4, 1e-6), "head_row": 2e-5,
                                  "routed_base": linear(2e-4, 0.0, 0.0), "routed_layer": linear(2e-4, 2.5e-5, 2.5e-7)},
                       "draft": {"n_layers": 1, "native": linear(3e-4, 2e-5, 1e-7), "head_row": 1e-5}}}


def shape_doc() -> dict:
    """A small ``viasd.cost/v1`` document (experiments.gpu_smoke --paper-shapes): t = 1 + 0.1·k + 0.001·ctx ms
    per layer-unit; the target has 4 layers, its slim verifier at keep 0.5 runs 2 of them."""
    ctxs, ks = [32, 128], [1, 2, 3]

    def t(scale):
        return {str(c): {str(k): scale * (1 + 0.1 * k + 0.001 * c) for k in ks} for c in ctxs}

    return {"schema": "viasd.cost/v1", "device": "NVIDIA H200", "dtype": "bfloat16", "contexts": ctxs, "ks": ks,
            "shapes": {"paper": True}, "keeps": [0.5],
            "models": {"org/target": {"layers": 4, "t_ms": t(4.0), "slim_layers": {"0.5": 2}, "slim_t_ms": {"0.5": t(2.5)}},
                       "org/draft": {"layers": 2, "t_ms": t(1.0), "slim_layers": {}, "slim_t_ms": {}}},
            "pairs": {"p": {"draft": "org/draft", "target": "org/target", "c": {}}}, "skipped": {}}


def test_one_loader_reads_the_paper_shape_cost_file(tmp_path):
    """A viasd.cost/v1 file loads into the same CostModel for a named pair; a wrong pair is one line."""
    path = tmp_path / "paper_shapes_cuda.json"
    path.write_text(json.dumps(shape_doc()))
    cost = CostModel.load(path, "p")
    assert cost.meta["source"] == "viasd.cost/v1" and cost.meta["device"] == "NVIDIA H200"
    assert cost.price("target", 2, 32) == pytest.approx(4.0 * (1 + 0.2 + 0.032) / 1000)
    assert cost.price("draft", 1, 128) == pytest.approx(1.0 * (1 + 0.1 + 0.128) / 1000)
    # routed: the line through the full forward (4 layers) and the slim one (2 layers)
    assert cost.price("target", 3, 32, layers=2) == pytest.approx(2.5 * (1 + 0.3 + 0.032) / 1000)
    assert cost.price("target", 3, 32, layers=4) == pytest.approx(cost.price("target", 3, 32))
    assert cost.entry("target").n_layers == 4 and cost.entry("draft").routed_base is None
    with pytest.raises(ConfigError, match=r"has no pair 'q' \(it has \['p'\]\); name one with cost_pair=NAME"):
        CostModel.load(path, "q")
    with pytest.raises(ConfigError, match="name the pair"):
        CostModel.load(path)


def test_prices_interpolate_extrapolate_and_count_layers_and_rows():
    cost = CostModel(synthetic())
    t = cost.entry("target")
    assert t.seconds(3, 500) == pytest.approx(1e-3 + 3e-4 + 5e-4)  # inside the grid: exact on a linear curve
    assert t.seconds(128, 0) == pytest.approx(1e-3 + 128e-4)  # a prefill between the measured sizes
    assert t.seconds(1024, 0) == pytest.approx(1e-3 + 1024e-4)  # ... and beyond them (linear extrapolation)
    assert t.seconds(4, 2000) == pytest.approx(1e-3 + 4e-4 + 2e-3)  # a longer context than measured
    assert t.seconds(4, 0, last=5) == pytest.approx(t.seconds(4, 0) + 4 * 2e-5)  # verification rows
    # a forward through k of the 4 layers: base + k · per layer, e.g. the full model resuming at layer 2
    assert t.seconds(1, 0, layers=2) == pytest.approx(2e-4 + 2 * (2e-4 + 2.5e-5))
    assert t.seconds(1, 0, layers=4) > t.seconds(1, 0, layers=2)


def test_the_bilinear_fit_keeps_a_bilinear_grid_and_smooths_a_noisy_point():
    """fit_bilinear is exact on a + b·n + c·ctx + d·n·ctx; one noisy grid point moves the fitted surface
    by a fraction of its error, spread over the grid; ``fit="bilinear"`` prices by it and says so in its
    record; an unknown fit is one line."""
    import numpy as np

    from viasd.analysis.cost import fit_bilinear

    ns, ctxs = [1, 2, 4, 8], [64, 512, 1536]
    exact = np.array([[0.2 + 0.01 * n + 1e-5 * c + 2e-6 * n * c for c in ctxs] for n in ns])
    assert np.allclose(fit_bilinear(exact, ns, ctxs), exact)
    noisy = exact.copy()
    noisy[0, 1] *= 0.8  # one point 20% low (a non-monotone grid: t(1, 512) < t(1, 64))
    fitted = fit_bilinear(noisy, ns, ctxs)
    assert fitted[0, 1] > noisy[0, 1] and np.all(np.diff(fitted, axis=1) > 0) and np.all(np.diff(fitted, axis=0) > 0)
    data = synthetic()
    data["models"]["target"]["native"]["decode"][1][0] *= 1.5  # t(2, 0) 50% high
    grid, smooth = CostModel(data), CostModel(data, fit="bilinear")
    assert smooth.price("target", 2, 0) < grid.price("target", 2, 0)
    assert "fit" not in grid.record() and smooth.record()["fit"] == "bilinear"
    with pytest.raises(ConfigError, match="not one of grid, bilinear"):
        CostModel(data, fit="spline")


def test_an_ar_example_is_priced_call_by_call_from_its_counters():
    cost = CostModel(synthetic())
    p, n = 50, 21
    rec = {"new_tokens": n, "target_calls": n, "target_tokens": p + n - 1}
    got = predict_example(cost, rec, p, {"target": ("target", None)})
    want = cost.entry("target").seconds(p, 0) + (n - 1) * cost.entry("target").seconds(1, p + n // 2)
    assert got["target"] == pytest.approx(want) and got["total"] == pytest.approx(want)


def test_a_stream_that_ran_fewer_layers_is_priced_by_its_logged_layer_work():
    """The full model resuming after a prefix it shares with the slim verifier ran 2 of its 4 layers per
    token (``target_layer_tokens``): it is priced as a 2-layer routed forward, not a native one."""
    cost = CostModel(synthetic())
    p, n = 50, 21
    rec = {"new_tokens": n, "target_calls": n, "target_tokens": p + n - 1}
    native = predict_example(cost, rec, p, {"target": ("target", None)})["target"]
    assert predict_example(cost, {**rec, "target_layer_tokens": 4.0 * (p + n - 1)}, p,
                           {"target": ("target", None)})["target"] == pytest.approx(native)  # all layers: native
    half = predict_example(cost, {**rec, "target_layer_tokens": 2.0 * (p + n - 1)}, p, {"target": ("target", None)})
    t = cost.entry("target")
    assert half["target"] == pytest.approx(t.seconds(p, 0, layers=2) + (n - 1) * t.seconds(1, p + n // 2, layers=2))
    assert half["target"] < native


def test_find_cost_prefers_this_host_and_the_runtime(tmp_path):
    runtime = {"backend": "packed", "dtype": "float32"}
    folder = tmp_path / COST
    folder.mkdir()
    (folder / "tiny-llama__elsewhere__packed-float32-t1.json").write_text(json.dumps(synthetic()))
    assert find_cost(tmp_path, "tiny-llama", runtime, 1).path.name.startswith("tiny-llama__elsewhere")
    CostModel(synthetic()).save(folder / cost_name("tiny-llama", runtime, 1))
    assert find_cost(tmp_path, "tiny-llama", runtime, 1).path.name == cost_name("tiny-llama", runtime, 1)
    assert find_cost(tmp_path, "other", runtime, 1) is None


def test_a_run_is_priced_by_a_cost_file_measured_on_its_own_cpu(tmp_path):
    """Two CPUs behind one host name keep separate files; a run whose meta names its CPU gets that CPU's
    file, one without it (runs decoded before ``meta.cpu``) this machine's, else any."""
    runtime, folder = {"backend": "packed", "dtype": "float32"}, tmp_path / COST
    folder.mkdir()
    epyc, xeon = "AMD EPYC 7B13 (AVX2)", "Intel(R) Xeon(R) Processor (AVX512)"
    assert cost_name("tiny-llama", runtime, 1, "vm", epyc) != cost_name("tiny-llama", runtime, 1, "vm", xeon)
    for cpu in (epyc, xeon):
        data = synthetic()
        data["meta"]["cpu"] = cpu
        CostModel(data).save(folder / cost_name("tiny-llama", runtime, 1, "vm", cpu))
    for cpu in (epyc, xeon):
        assert find_cost(tmp_path, "tiny-llama", runtime, 1, cpu).meta["cpu"] == cpu
    assert find_cost(tmp_path, "tiny-llama", runtime, 1, "some other CPU") is not None  # none of its CPU: any
    mine = synthetic()
    mine["meta"]["cpu"] = "this machine"
    CostModel(mine).save(folder / cost_name("tiny-llama", runtime, 1))
    assert find_cost(tmp_path, "tiny-llama", runtime, 1).meta["cpu"] == "this machine"  # no CPU named: this host


def test_a_run_naming_no_cpu_keeps_the_file_naming_none_on_any_machine(tmp_path):
    """Runs decoded before ``meta.cpu`` were priced by the file measured before cost files named their CPU:
    a file measured later — this machine's, in the local store searched first — does not reprice them, so a
    committed table regenerates to the same numbers wherever it is rebuilt; a run naming its CPU gets its
    CPU's file."""
    runtime = {"backend": "packed", "dtype": "float32"}
    local, results = tmp_path / "runs", tmp_path / "results"
    CostModel(synthetic()).save(results / COST / "tiny-llama__vm__packed-float32-t1.json")
    here = synthetic()
    here["meta"]["cpu"] = "this machine"
    CostModel(here).save(local / COST / cost_name("tiny-llama", runtime, 1))
    assert find_cost([local, results], "tiny-llama", runtime, 1).path.parent == results / COST
    assert find_cost([local, results], "tiny-llama", runtime, 1, "this machine").meta["cpu"] == "this machine"
    assert find_cost([local], "tiny-llama", runtime, 1).meta["cpu"] == "this machine"  # no file names none: any


def test_the_cost_model_travels_with_the_results_store(tmp_path, monkeypatch):
    """A fresh clone has no local ``_cost/``: the committed results store's file prices its runs; a
    local file of the pair comes first."""
    from viasd.tracking.store import RunStore, store_roots

    runtime = {"backend": "packed", "dtype": "float32"}
    results, local = tmp_path / "results", tmp_path / "runs"
    monkeypatch.setenv("VIASD_RESULTS_DIR", str(results))
    CostModel(synthetic()).save(results / COST / "tiny-llama__vm__packed-float32-t1.json")
    roots = store_roots(RunStore(local))
    assert roots == [local.resolve(), results.resolve()]
    assert find_cost(roots, "tiny-llama", runtime, 1).path.parent == results / COST
    CostModel(synthetic()).save(local / COST / "tiny-llama__elsewhere__packed-float32-t1.json")
    assert find_cost(roots, "tiny-llama", runtime, 1).path.parent == local / COST


def test_bench_cost_curve_stores_the_cost_model_once(tmp_path, capsys):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    args = [sys.executable, "-m", "experiments.bench", "--cost-curve", "pair=tiny-llama", "curve.ks=2", "curve.reps=1",
            "curve.context=16", f"curve.out={tmp_path / 'c.json'}", f"curve.store={tmp_path}", "curve.backends=[eager]",
            "pair.backend=eager", "curve.cost.reps=1", "curve.cost.ns=[1,2,4]", "curve.cost.contexts=[16,64]",
            "curve.cost.prefill_ns=[32,64]"]
    r = subprocess.run(args, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (path,) = (tmp_path / COST).iterdir()
    cost = CostModel.load(path)
    assert set(cost.models) == {"target", "draft"} and cost.models["target"].n_layers == 4
    assert cost.price("target", 4, 32, last=4) > 0 and cost.price("target", 1, 32, layers=2) > 0
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):  # once per machine
        cfg = compose(config_name="bench", overrides=[a for a in args[4:] if not a.startswith("curve.backends")])
    bench_cmd.store_cost_model(cfg, load_pair("tiny-llama"), "eager")
    assert "cost model reused" in capsys.readouterr().out


def _run(*overrides):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return run(compose(config_name="config", overrides=["pair=tiny-llama", "task=prompts", "task.n_examples=2",
                                                             "generation.max_new_tokens=10", *overrides]))


def test_replay_and_compare_predict_speedups_and_validation_prints_the_error(runs_dir, tmp_path, capsys):
    ar, sd = _run("method=ar"), _run("method=sd")
    meta = json.loads((runs_dir / ar["run_id"] / "meta.json").read_text())
    path = runs_dir / COST / cost_name("tiny-llama", meta["runtime"], meta["threads"])
    CostModel(synthetic()).save(path)
    assert trace_cmd.main([f"run={ar['run_id']}"]) == 0
    out = tmp_path / "r.json"
    assert replay_cmd.main([f"run={ar['run_id']}", "method=ar,sd", f"out={out}"]) == 0
    got = {r["method"]: r for r in json.loads(out.read_text())}
    assert got["ar"]["predicted_speedup"] == pytest.approx(1.0) and got["sd"]["predicted_speedup"] > 0
    assert got["sd"]["target_calls"] == sd["target_calls"]  # sd is lossless: its trajectory is ar's
    assert got["sd"]["cost_file"] == str(path)
    gpu = tmp_path / "paper_shapes_cuda.json"  # costs measured on another machine price the same trace
    gpu.write_text(json.dumps(shape_doc()))
    capsys.readouterr()
    assert replay_cmd.main([f"run={ar['run_id']}", "method=ar,sd", f"out={out}", f"cost={gpu}", "cost_pair=p",
                            "cost.allow_other_pair=true"]) == 0  # pair p's costs for a tiny-llama trace: asked for
    assert f"predicted speedups priced by the cost file {gpu}" in capsys.readouterr().out
    got = {r["method"]: r for r in json.loads(out.read_text())}
    assert got["ar"]["predicted_speedup"] == pytest.approx(1.0) and got["sd"]["cost_file"] == str(gpu)
    capsys.readouterr()
    assert cost_cmd.main(["--runs-dir", str(runs_dir)]) == 0
    printed = capsys.readouterr().out
    assert sd["run_id"] in printed and "mean |error|" in printed
    assert cost_cmd.main(["--runs-dir", str(runs_dir), "--fit", "bilinear"]) == 0
    assert "cost grids read by bilinear" in capsys.readouterr().out  # the synthetic grid is bilinear: same prices
    rows = cost_cmd.validate(__import__("viasd.tracking.store", fromlist=["RunStore"]).RunStore(runs_dir))
    assert {r["method"] for r in rows} == {"ar", "sd"} and all(r["predicted"] > 0 for r in rows)
    assert all(r["cpu n"] == 2 and r["cpu"] > 0 for r in rows if r["method"] == "sd")  # cpu_s of both runs
    # an example from before cpu_s: the CPU-time speedup and the prediction it validates are on the other one
    from viasd.analysis.paired import compare_to_ar, load_run, predicted_seconds
    from viasd.analysis.stats import speedup_ci

    st = __import__("viasd.tracking.store", fromlist=["RunStore"]).RunStore(runs_dir)
    a, b = load_run(st, ar["run_id"]), load_run(st, sd["run_id"])
    del b["examples"][0]["cpu_s"]
    cmp, one = compare_to_ar(st, b, a), [b["examples"][1]["id"]]
    model = find_cost(runs_dir, "tiny-llama", meta["runtime"], meta["threads"])
    want = speedup_ci([b["examples"][1]["new_tokens"]], predicted_seconds(model, b, a, one),
                      [a["examples"][1]["new_tokens"]], predicted_seconds(model, a, a, one))
    assert cmp["cpu"].n == 1 and cmp["predicted"].n == 2 and cmp["predicted_cpu"].estimate == pytest.approx(want.estimate)
    # a row decoded on another machine is priced on its baseline's: one price list per compared table
    other = synthetic()
    other["meta"]["cpu"], other["models"]["draft"]["native"] = "another machine", linear(9e-4, 1e-4, 1e-6)
    CostModel(other).save(runs_dir / COST / "tiny-llama__other__packed-float32-t1.json")
    moved = {**b, "meta": {**b["meta"], "cpu": "another machine"}}
    from viasd.analysis.paired import run_cost

    assert run_cost(st, moved).meta["cpu"] == "another machine"
    assert compare_to_ar(st, moved, a)["predicted"].estimate == pytest.approx(cmp["predicted"].estimate)
    # a run still being decoded (an interleaved cell): left out, unless --unfinished asks for it
    (runs_dir / sd["run_id"] / "summary.json").unlink()
    store = __import__("viasd.tracking.store", fromlist=["RunStore"]).RunStore(runs_dir)
    assert {r["method"] for r in cost_cmd.validate(store)} == {"ar"}
    rows = cost_cmd.validate(store, unfinished=True)
    assert {r["method"] for r in rows} == {"ar", "sd"} and next(r for r in rows if r["method"] == "sd")["n"] == 2
    assert cost_cmd.main(["--runs-dir", str(runs_dir), "--unfinished"]) == 0 and sd["run_id"] in capsys.readouterr().out
