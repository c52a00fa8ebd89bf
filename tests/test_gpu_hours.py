"""The dry run's GPU-hour estimate (viasd.harness.gpu_hours): hand-computed roofline numbers, the paper
XSum cell's 11,334 rows, ``rows unknown`` without a data folder, CPU pairs, and a bad card in one line."""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import viasd.harness.dryrun as dr
from viasd.errors import ConfigError
from viasd.harness.gpu_hours import ENV, cell_hours, fmt_hours, gpu_kind, print_gpu_hours
from viasd.harness.grid import compose_cells

ROWS = dr._data_line  # the dry run's row reader


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("VIASD_DRYRUN_GPUS", raising=False)
    monkeypatch.setenv("VIASD_RUNS_DIR", str(tmp_path / "runs"))
    dr.hub_reachable.cache_clear()
    yield
    dr.hub_reachable.cache_clear()


def _cell(task: str, source: str = "hub", method: str = "ar", target: str = "Qwen/Qwen2.5-7B-Instruct",
          n_examples: int | None = None, max_new_tokens: int | None = None):
    cfg = OmegaConf.create({"pair": {"name": "p", "target": {"id": target}},
                            "task": {"name": task, "source": source, "n_examples": n_examples},
                            "generation": {"max_new_tokens": max_new_tokens}, "method": {"name": method}})
    plan = SimpleNamespace(entry="run", device="cuda", need_gib=21.58, finished=False, label=f"p/{method}/{task}")
    return cfg, plan


def _qwen7b_token_ms(bandwidth_gbs: float = 3350.0, ctx: int = 512) -> float:
    """One bf16 forward of Qwen2.5-7B (28 layers, hidden 3584, MLP 18944, 4 KV heads of 128, vocab 152064,
    untied head), by hand: weight + KV bytes over the bandwidth (memory-bound) plus eager overhead."""
    h, kv = 3584, 4 * 128
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * 18944 + 2 * h
    weights = 28 * layer + 152064 * h
    bytes_ = 2 * weights + 2 * 28 * (2 * kv) * (ctx + 1)
    return bytes_ / (bandwidth_gbs * 1e9) * 1e3 + (500 + 28 * 300) / 1e3


def test_known_cell_is_the_hand_computed_number():
    cfg, plan = _cell("humaneval")
    est = cell_hours(cfg, plan, "h100", ROWS)
    want = 164 * 512 * _qwen7b_token_ms() / 1e3 / 3600  # HumanEval: 164 rows x 512 new tokens, 1 H100
    assert est.hours == pytest.approx(want, rel=1e-9)
    assert est.line.startswith(f"~{fmt_hours(want)} GPU-h (h100 roofline, ar upper bound): 164 rows x 512 new")
    assert "1 GPU(s)" in est.line
    h200 = cell_hours(cfg, plan, "h200", ROWS)  # another card: its bandwidth
    assert h200.hours == pytest.approx(164 * 512 * _qwen7b_token_ms(4800.0) / 1e3 / 3600, rel=1e-9)


def test_gpus_the_cell_needs_multiply_and_speculative_methods_get_the_ar_bound():
    cfg, plan = _cell("humaneval", method="sd", max_new_tokens=100, n_examples=10)
    plan.need_gib = 169.24  # llama2-7b-70b's cell: 3 H100s of 80 GB, 2 H200s of 141 GB
    one = cell_hours(cfg, SimpleNamespace(**{**vars(plan), "need_gib": 21.58}), "h100", ROWS).hours
    assert cell_hours(cfg, plan, "h100", ROWS).hours == pytest.approx(3 * one)
    assert "x 2 GPU(s)" in cell_hours(cfg, plan, "h200", ROWS).line
    line = cell_hours(cfg, plan, "h100", ROWS).line
    assert "10 rows x 100 new tokens" in line and "ar upper bound" in line and "sd divides it by its speedup" in line


def test_paper_xsum_cell_takes_all_11334_rows():
    cells = compose_cells(["pair=llama2-7b-70b,qwen2.5-0.5b-7b", "task=xsum", "task.source=hub",
                           "task.n_examples=null", "method=ar", "dry_run=true"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        dr.dry_run(cells, "xsum")
    out = buf.getvalue()
    rows = [ln for ln in out.splitlines() if ln.startswith("[viasd] gpu-hours (")]
    assert len(rows) == 2 and all("(h100 roofline, ar upper bound): 11334 rows x 64 new tokens" in r for r in rows)
    assert "llama2-7b-70b/ar/xsum" in rows[0] and "x 3 GPU(s)" in rows[0]  # ~169 GiB: three 80 GB cards
    total = [ln for ln in out.splitlines() if ln.startswith("[viasd] GPU-hours: ~")]
    assert len(total) == 1 and "for 2 cell(s) to run" in total[0] and "roofline model, not measured" in total[0]


def test_without_a_data_folder_rows_are_unknown(monkeypatch, tmp_path):
    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path))  # an empty data folder: the offline file is missing
    cfg, plan = _cell("xsum", source="local")
    est = cell_hours(cfg, plan, "h100", ROWS)
    assert est.hours is None and "rows unknown" in est.line


def test_cpu_and_calibration_cells_say_na(capsys):
    cfg, plan = _cell("xsum")
    plan.device = "cpu"
    assert cell_hours(cfg, plan, "h100", ROWS).line == "n/a (CPU pair)"
    print_gpu_hours([cfg], [plan], "h100", ROWS)
    assert capsys.readouterr().out == "[viasd] GPU-hours: n/a (CPU pairs only)\n"
    cal = SimpleNamespace(**{**vars(plan), "entry": "search", "device": "cuda"})
    assert cell_hours(cfg, cal, "h100", ROWS).hours is None
    cfg2, plan2 = _cell("xsum", target="google/flan-t5-large")
    assert "no roofline shape" in cell_hours(cfg2, plan2, "h100", ROWS).line


def test_fmt_hours_never_uses_e_notation():
    assert [fmt_hours(x) for x in (0.3141, 4.21, 40.4, 1234.5)] == ["0.31", "4.2", "40", "1,234"]


def test_bad_gpu_kind_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv(ENV, "h100")
    assert gpu_kind() == "h100"
    monkeypatch.setenv(ENV, "v100")
    with pytest.raises(ConfigError) as e:
        gpu_kind()
    assert "\n" not in str(e.value) and f"{ENV}=h100" in str(e.value)
    cfg, _ = _cell("xsum")
    with pytest.raises(ConfigError):  # the dry run stops on it before printing its plan
        dr.dry_run([cfg], "x")
    assert capsys.readouterr().out == ""
