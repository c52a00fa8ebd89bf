"""The GPU smoke script checks itself on the CPU (``--device cpu``)."""

from __future__ import annotations

from experiments.gpu_smoke import _compare, main, smoke
from viasd.models.pairs import load_pair


def test_gpu_smoke_passes_on_cpu(capsys):
    assert main(["--device", "cpu", "--prompts", "1", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "viasd_routed" in out and "tok/s" in out


def test_gpu_smoke_reports_a_real_difference():
    rows = smoke("cpu", "float32", 1, 6)
    assert all(r.ok for r in rows) and {r.method for r in rows} >= {"ar", "sd", "viasd_tiers_off", "viasd_routed"}
    pair = load_pair("tiny-llama")
    ids = pair.encode("The cat sat on the mat.")
    ok, detail = _compare(pair, [ids], [[1, 2, 3]], [[1, 2, 4]], exact=True)
    assert not ok and "prompts [0]" in detail
