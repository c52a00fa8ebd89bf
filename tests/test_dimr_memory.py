"""DIMR search / KL-geometry memory: statistics are streamed, and the dry run's estimate is what the code allocates.

torch's own allocation records (the profiler's memory events on CPU) give the peak of a
:class:`~viasd.dimr.calibration.Calibration` and its mask evaluations for a tiny pair (a large
vocabulary, so the full-vocabulary statistics dominate) at two calibration sizes; it matches
:func:`~viasd.dimr.memory.calibration_peak_bytes` and does not grow with the number of batches
the way holding every batch's log-probs would.
The README's paper-pair hardware table is checked against the dry run's plans of the paper cells.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import transformers
from torch.profiler import ProfilerActivity, profile

import viasd.harness.dryrun as dr
from viasd.dimr.calibration import Calibration
from viasd.dimr.memory import calibration_peak_bytes, shape_of_model
from viasd.engine.routing import RoutingPlan
from viasd.errors import ConfigError
from viasd.harness.grid import compose_cells
from viasd.models.pairs import ModelPair

VOCAB, SEQ, BATCH = 4096, 32, 4


def _model(layers: int):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=True)
    torch.manual_seed(layers)
    return transformers.LlamaForCausalLM(cfg).eval()


def _peak(fn) -> int:
    """Peak bytes torch allocates during ``fn()`` (allocations minus frees, in time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak


@pytest.mark.parametrize("with_draft", [False, True])
def test_estimate_matches_measured_peak_at_two_calibration_sizes(with_draft):
    target, draft = _model(4), _model(1)
    pair = ModelPair(name="mem", target=target, draft=draft if with_draft else None, tokenizer=None)
    plans = (RoutingPlan.of_layers([0, 3]), RoutingPlan((0, 1, 2, 3), (0, 2, 3)))
    measured, estimated = {}, {}
    for n_chunks in (4, 12):
        chunks = torch.randint(4, VOCAB, (n_chunks, SEQ), generator=torch.Generator().manual_seed(1)).tolist()

        def run(chunks=chunks):
            calib = Calibration(pair, chunks, BATCH, need_draft=with_draft, memo_mib=0.05, stat_mib=0.5)
            for plan in plans:
                calib.statistics(plan)

        measured[n_chunks] = _peak(run)
        estimated[n_chunks] = calibration_peak_bytes(shape_of_model(target), shape_of_model(draft) if with_draft
                                                     else None, n_chunks * SEQ, BATCH, SEQ, 4, 0, 0.05, 0.5)["total"]
        assert 0.9 <= estimated[n_chunks] / measured[n_chunks] <= 1.15, (n_chunks, estimated, measured)
    held_every_batch = 12 * SEQ * VOCAB * 4  # what keeping the target's log-probs of all batches would take
    assert measured[12] - measured[4] < 0.1 * held_every_batch


def test_dry_run_prints_search_memory_and_refuses_what_does_not_fit(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VIASD_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIASD_DRYRUN_GPUS", "40")
    cells = [c for c in compose_cells(["+exp=table1", "scale=paper", "dry_run=true"])
             if c.pair.name in ("gemma2-2b-9b", "llama2-7b-70b")]
    dr.dry_run(cells[:1], "table1")
    out = capsys.readouterr().out
    assert "gemma2-2b-9b/dimr_search" in out and "+ stored states" in out and "batch/chunk" in out
    with pytest.raises(ConfigError, match=r"llama2-7b-70b.*needs ~14\d GiB \(bfloat16, weights .* stored states"):
        dr.dry_run(cells, "table1", strict=True)


def test_readme_hardware_table_gives_the_dry_runs_peaks(monkeypatch, tmp_path):
    """The README's paper-pair table lists decode / search / KL peaks as the dry run plans them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VIASD_RUNS_DIR", str(tmp_path / "runs"))
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    search = {c.pair.name: dr.plan_cell(c) for c in compose_cells(["+exp=table1", "scale=paper", "search.keep_ratio=0.5"])}
    kl = {c.pair.name: dr.plan_cell(c) for c in compose_cells(["+exp=fig_kl", "scale=paper", "search.calibration=[xsum]",
                                                               "pair=" + ",".join(search)])}
    assert len(search) == 4 and kl.keys() == search.keys()
    for name, plan in search.items():
        peaks = (sum(m["gib"] for m in plan.models) * dr.OVERHEAD, plan.need_gib, kl[name].need_gib)  # decode: weights x 1.2
        row = re.search(rf"^\| `{re.escape(name)}` \|.*$", readme, re.M)
        assert row and " / ".join(f"{p:.1f}" for p in peaks) + " GiB" in row.group(0), (name, peaks)
