"""Forward costs of the paper pairs at paper shapes (random weights): what a replayed policy is priced with.

For each paper model (``conf/paper_shapes.yaml``, built on the device by
:func:`viasd.models.paper_shapes.build_random`; nothing downloaded) :func:`measure` times, in one
dtype on one device (medians of ``repeats``, each call synchronized):

* ``t_ms[ctx][k]``: one forward of ``k`` = 1…8 new tokens after ``ctx`` cached tokens (256 and
  2,048) through :class:`~viasd.engine.stream.Stream` — the path decoding takes (eager,
  ``DynamicCache``, rolled back to ``ctx`` before each call) — and ``ratio`` = ``t(k)/t(1)``;
* ``slim_t_ms[keep][ctx][k]``: the same forward of the slim verifier, the target routed through
  ``keep`` × its layers (evenly spaced; a layer-uniform model's cost depends on the count only),
  and ``slim_ratio`` = slim / full at the same ``ctx`` and ``k``;
* ``graph[ctx][k]``: one forward of the same shape with a ``StaticCache``, eager and replayed
  from a captured CUDA graph; ``launch_share = 1 − graph/eager`` is the share of an eager
  forward that is kernel-launch and Python overhead (CUDA only; elsewhere the eager time and a note);
* ``search``: one DIMR calibration batch at paper sizes (8 × 256 tokens through
  :class:`~viasd.dimr.calibration.Calibration`: the target's hidden states, then one slim
  verifier's KL against them, streamed in chunks; no memo), its peak device memory above the
  weights (``torch.cuda.max_memory_allocated``; CUDA only) next to the estimate of
  :func:`~viasd.dimr.memory.calibration_peak_bytes` (what the dry run prints), and the fp32
  log-prob bytes a batch would hold unstreamed;

and per pair the draft/target cost ratio ``c[ctx] = t_draft(1)/t_target(1)``. :func:`measure`
returns the ``viasd.cost/v1`` document (``docs/cost_file.md``); :func:`cost_table` prints it.
"""

from __future__ import annotations

import gc
import math
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import torch
import transformers
from transformers import StaticCache

from viasd.dimr.calibration import Calibration
from viasd.dimr.masks import every_other_mask
from viasd.dimr.memory import calibration_peak_bytes, shape_of_model
from viasd.engine.routing import RoutingPlan, num_layers
from viasd.engine.stream import Stream
from viasd.models.pairs import ModelPair
from viasd.models.paper_shapes import build_random, optional_models, paper_pairs, param_count

__all__ = ["SCHEMA", "CONTEXTS", "KS", "KEEPS", "forward_ms", "graph_vs_eager", "search_batch", "measure",
           "cost_table"]

SCHEMA = "viasd.cost/v1"
CONTEXTS = (256, 2048)
KS = tuple(range(1, 9))
KEEPS = (0.5, 0.6, 0.7, 0.8, 0.9)
GRAPH_KS = (1, 5)  # a draft step and a γ = 4 verification block
SEARCH_BATCH, SEARCH_SEQ = 8, 256  # conf/scale/table1/paper.yaml: 256 texts x 256 tokens, batch 8
GIB = 1024**3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """Median wall milliseconds of ``fn()`` over ``repeats`` synchronized calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _ids(model, n: int, rows: int = 1) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (rows, n), device=model.device)


def forward_ms(model, ctx: int, ks=KS, repeats: int = 10, plan: RoutingPlan | None = None) -> dict[int, float]:
    """``{k: ms}``: one :class:`Stream` forward of ``k`` new tokens after ``ctx`` cached ones (``plan``: routed)."""
    ids = _ids(model, ctx + max(ks))
    stream = Stream(model, ids[:, :ctx], "shape", plan)
    stream.logits(ids[:, :ctx])  # the cached context (not timed)
    out = {}
    for k in ks:
        seq = ids[:, :ctx + k]

        def step(seq=seq, k=k):
            stream.rollback(ctx)
            stream.logits(seq, last=k)

        out[k] = _median_ms(step, repeats, model.device)
    return out


@torch.inference_mode()
def graph_vs_eager(model, ctx: int, k: int, repeats: int = 10) -> dict[str, Any]:
    """Eager vs CUDA-graph replay of one ``StaticCache`` forward of ``k`` tokens after ``ctx`` cached ones.

    Returns ``eager_ms`` and, on CUDA, ``graph_ms`` and ``launch_share`` (``1 − graph/eager``);
    elsewhere a ``note``. A capture that fails is reported in ``error``, not raised.
    """
    cache = StaticCache(config=model.config, max_cache_len=ctx + k)
    ids = _ids(model, ctx + k)
    model(input_ids=ids[:, :ctx], cache=cache, use_cache=True, logits_to_keep=1)
    new = ids[:, ctx:].clone()

    def step():
        model(input_ids=new, cache=cache, use_cache=True, logits_to_keep=k)
        cache.crop(-k)  # back to ctx: every call (and replay) writes the same positions

    row: dict[str, Any] = {"eager_ms": _median_ms(step, repeats, model.device)}
    if model.device.type != "cuda":
        row["note"] = "CUDA graphs need a CUDA device: eager StaticCache forward only"
        return row
    try:
        side = torch.cuda.Stream(model.device)
        side.wait_stream(torch.cuda.current_stream(model.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream(model.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        row["graph_ms"] = _median_ms(graph.replay, repeats, model.device)
        row["launch_share"] = 1 - row["graph_ms"] / row["eager_ms"]
    except Exception as e:  # a model whose forward syncs with the host cannot be captured: say so
        row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    return row


def search_batch(model, keep: float = 0.5, batch: int = SEARCH_BATCH, seq_len: int = SEARCH_SEQ) -> dict[str, Any]:
    """One DIMR calibration batch (``batch × seq_len`` tokens; a slim verifier of ``keep``): its KL,
    measured peak memory above the weights and :func:`calibration_peak_bytes`'s estimate of it."""
    n = num_layers(model)
    plan = RoutingPlan.build(every_other_mask(n, keep), n)
    ids = _ids(model, seq_len, batch)
    pair = ModelPair(name="paper-shape", target=model, draft=None, tokenizer=None)
    estimate = calibration_peak_bytes(shape_of_model(model), None, batch * seq_len, batch, seq_len,
                                      model.dtype.itemsize, memo_mib=0)["total"]
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(model.device)
        base = torch.cuda.memory_allocated(model.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        value = Calibration(pair, ids.tolist(), batch, need_draft=False, memo_mib=0).statistics(plan)["kl_q_slim"]
    _sync(model.device)
    out = {"batch": batch, "seq_len": seq_len, "keep": keep, "seconds": time.perf_counter() - t0,
           "kl_q_slim": value if math.isfinite(value) else None,
           "estimate_gib": estimate / GIB, "held_gib_per_batch": batch * seq_len * model.config.vocab_size * 4 / GIB}
    if cuda:
        out["peak_gib"] = (torch.cuda.max_memory_allocated(model.device) - base) / GIB
    else:
        out["peak_gib"], out["note"] = None, "peak memory is measured on CUDA only"
    return out


def _measure_model(model_id: str, device: torch.device, dtype: torch.dtype, layers: int | None, width_div: int,
                   contexts, repeats: int, search: tuple[int, int]) -> dict[str, Any]:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = build_random(model_id, device, dtype, layers, width_div)
    n = num_layers(model)
    row: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()), "layers": n,
                           "build_s": time.perf_counter() - t0}
    t = {c: forward_ms(model, c, KS, repeats) for c in contexts}
    row["t_ms"] = {str(c): {str(k): v for k, v in t[c].items()} for c in contexts}
    row["ratio"] = {str(c): {str(k): v / t[c][1] for k, v in t[c].items()} for c in contexts}
    row["slim_layers"], row["slim_t_ms"], row["slim_ratio"] = {}, {}, {}
    by_count: dict[int, dict] = {}  # keep ratios that keep as many layers cost the same: timed once
    for keep in KEEPS:
        plan = RoutingPlan.build(every_other_mask(n, keep), n)
        if len(plan.layers) not in by_count:
            by_count[len(plan.layers)] = {c: forward_ms(model, c, KS, repeats, plan) for c in contexts}
        slim = by_count[len(plan.layers)]
        row["slim_layers"][str(keep)] = len(plan.layers)
        row["slim_t_ms"][str(keep)] = {str(c): {str(k): v for k, v in slim[c].items()} for c in contexts}
        row["slim_ratio"][str(keep)] = {str(c): {str(k): v / t[c][k] for k, v in slim[c].items()} for c in contexts}
    row["graph"] = {str(c): {str(k): graph_vs_eager(model, c, k, repeats) for k in GRAPH_KS} for c in contexts}
    row["search"] = search_batch(model, 0.5, *search)
    row["seconds"] = time.perf_counter() - t0
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _fits(model_id: str, device: torch.device, dtype: torch.dtype, layers: int | None, width_div: int) -> str | None:
    """Why ``model_id`` cannot be built here (None: it fits): weights + 3% + 2 GiB (KV cache at 2,048
    tokens, one calibration batch) against the device's memory."""
    if device.type != "cuda":
        return None
    need = param_count(model_id, layers, width_div) * torch.finfo(dtype).bits / 8 * 1.03 + 2 * GIB
    have = torch.cuda.get_device_properties(device).total_memory
    return None if need <= have else f"needs ~{need / GIB:.0f} GiB, the GPU has {have / GIB:.0f} GiB"


def measure(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, models: list[str] | None = None,
            layers: int | None = None, width_div: int = 1, contexts=CONTEXTS, repeats: int = 10,
            budget_s: float | None = None, search: tuple[int, int] = (SEARCH_BATCH, SEARCH_SEQ),
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """The ``viasd.cost/v1`` document of the paper models (``models``: hub ids; None = every pair's draft,
    target and intermediate except :func:`optional_models`); models past ``budget_s`` are skipped;
    ``search``: the calibration batch's (rows, tokens)."""
    dev = torch.device(device)
    pairs = paper_pairs()
    if models is None:
        every = [m for p in pairs.values() for m in p.values()]
        models = [m for m in dict.fromkeys(every) if m not in optional_models()]
    doc: dict[str, Any] = {
        "schema": SCHEMA, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__, "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "shapes": {"paper": layers is None and width_div == 1, "layers": layers, "width_div": width_div},
        "contexts": list(contexts), "ks": list(KS), "keeps": list(KEEPS), "repeats": repeats,
        "models": {}, "pairs": {}, "skipped": {},
    }
    t0 = time.perf_counter()
    for model_id in models:
        why = _fits(model_id, dev, dtype, layers, width_div)
        if why is None and budget_s is not None and time.perf_counter() - t0 > budget_s:
            why = f"time budget of {budget_s:.0f} s spent"
        if why is not None:
            doc["skipped"][model_id] = why
            log(f"[gpu_smoke] {model_id}: skipped ({why})")
            continue
        doc["models"][model_id] = _measure_model(model_id, dev, dtype, layers, width_div, contexts, repeats, search)
        log(f"[gpu_smoke] {model_id}: {doc['models'][model_id]['seconds']:.1f} s")
    for name, roles in pairs.items():
        d, t = doc["models"].get(roles["draft"]), doc["models"].get(roles["target"])
        if d is not None and t is not None:
            c = {str(x): d["t_ms"][str(x)]["1"] / t["t_ms"][str(x)]["1"] for x in contexts}
            doc["pairs"][name] = {**roles, "c": c}
    doc["wall_s"] = time.perf_counter() - t0
    return doc


def cost_table(doc: dict[str, Any]) -> str:
    """A Markdown table of a cost document: per model t(1), t(k)/t(1), slim cost, launch share, search peak."""
    ctxs = [str(c) for c in doc["contexts"]]
    lines = [f"Paper-shape forward costs on {doc['device']} ({doc['dtype']}, shapes {doc['shapes']}, "
             f"median of {doc['repeats']})", "",
             "| model | ctx | t(1) ms | t(k)/t(1), k = 2…8 | slim/full at k=5, keep 0.5…0.9 | launch share k=1 / 5 "
             "| search batch peak GiB (formula) |", "|---|---|---|---|---|---|---|"]
    for m, row in doc["models"].items():
        for c in ctxs:
            ratios = " ".join(f"{row['ratio'][c][str(k)]:.2f}" for k in doc["ks"][1:])
            slim = " ".join(f"{row['slim_ratio'][str(keep)][c]['5']:.2f}" for keep in doc["keeps"])
            shares = " / ".join(f"{g['launch_share']:.2f}" if "launch_share" in g else "-"
                                for g in row["graph"][c].values())
            peak = row["search"]["peak_gib"]
            lines.append(f"| {m} | {c} | {row['t_ms'][c]['1']:.2f} | {ratios} | {slim} | {shares} | "
                         f"{'-' if peak is None else f'{peak:.2f}'} ({row['search']['estimate_gib']:.2f}) |")
    for name, p in doc["pairs"].items():
        lines.append(f"\npair {name}: c = t_draft(1)/t_target(1) = "
                     + ", ".join(f"{v:.3f} at ctx {c}" for c, v in p["c"].items()))
    for m, why in doc["skipped"].items():
        lines.append(f"\nskipped {m}: {why}")
    return "\n".join(lines)
