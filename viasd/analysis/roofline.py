"""GPU pricing without a GPU: a roofline model of one forward, written as a ``viasd.cost/v1`` cost file.

What this module owns: the roofline estimate of a batch-1 forward of a decoder model on a named card
(:data:`GPUS`: published peak memory bandwidth and dense bf16 tensor throughput) and the cost file built
from it, in the one cost format (``docs/cost_file.md``) so ``experiments.replay … cost=FILE`` and every
other consumer price traces with it unchanged. **It is a model, not a measurement**: the file says so
(``"roofline"`` block, ``"device": "<card> (roofline model, not measured)"``).

One forward feeding ``n`` new tokens after ``ctx`` cached ones through ``l`` of the model's decoder layers::

    bytes  = 2 · (l · P_layer + P_head) + 2 · l · kv · (ctx_l + n)        # bf16 weights, KV read + written
    flops  = 2 · n · (l · P_layer + P_head) + l · 4 · n · (ctx_l + n) · h · d
    t      = max(bytes / bandwidth, flops / bf16_peak) + overhead(l)
    overhead(l) = base + l · per_layer      # "eager" (PyTorch eager: kernel launches and Python per layer)
                                            # or "graph" (a captured CUDA graph: launch gaps only)

``P_layer``: parameters of one decoder layer and ``P_head`` the LM head's (counted exactly on a meta-device
model of the architecture; the embedding lookup reads ``n`` rows and is left out), ``kv``: key+value width
per layer (``2 · kv_heads · head_dim``), ``ctx_l``: ``min(ctx, window)`` on sliding-window layers, ``h · d``:
query heads × head dim. Left out: activations' traffic, attention and norm kernels below peak, kernel
efficiency (real kernels reach a fraction of peak bandwidth), the sampling/verification code between forwards,
host syncs, and the draft and target sharing one card's bandwidth (they run one after the other in every method,
so their times add, which the model does). The overhead constants are assumptions (:data:`OVERHEADS`), not
measurements; ``experiments.gpu_smoke --paper-shapes`` measures the same shapes on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml

from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT


@dataclass(frozen=True)
class GPU:
    """A card's published peaks (dense bf16, no sparsity) and memory."""

    name: str
    bandwidth_gbs: float  # GB/s of HBM
    bf16_tflops: float  # dense bf16 tensor-core TFLOP/s
    memory_gb: float
    source: str


#: Published datasheet numbers (SXM form factors).
GPUS: dict[str, GPU] = {
    "h100": GPU("NVIDIA H100 SXM5 80GB", 3350.0, 989.4, 80.0, "NVIDIA H100 datasheet: HBM3 3.35 TB/s, BF16 989.4 TFLOPS dense"),
    "h200": GPU("NVIDIA H200 SXM 141GB", 4800.0, 989.4, 141.0, "NVIDIA H200 datasheet: HBM3e 4.8 TB/s, BF16 989.4 TFLOPS dense"),
    "a100": GPU("NVIDIA A100 SXM4 80GB", 2039.0, 312.0, 80.0, "NVIDIA A100 datasheet: HBM2e 2,039 GB/s, BF16 312 TFLOPS dense"),
}

#: Per-forward overhead (µs): ``base + layers · per_layer``. Assumptions, not measurements: eager PyTorch issues
#: ~30-40 kernels per decoder layer at ~8-10 µs of host time each when the GPU waits on the host; a captured
#: graph leaves ~1 µs launch gaps between them.
OVERHEADS: dict[str, dict[str, float]] = {
    "eager": {"base_us": 500.0, "per_layer_us": 300.0},
    "graph": {"base_us": 30.0, "per_layer_us": 40.0},
}

#: Models of the package index whose architecture is a ``conf/paper_shapes.yaml`` entry's (same config fields:
#: the Coder models share their base models' shapes).
ALIASES = {"qwen2.5-coder-0.5b-instruct": "Qwen/Qwen2.5-0.5B-Instruct",
           "qwen2.5-coder-1.5b-instruct": "Qwen/Qwen2.5-1.5B-Instruct"}

CONTEXTS = [0, 256, 512, 1024, 2048, 4096, 8192]
KS = [*range(1, 17), 32, 64, 128, 256, 512, 1024, 2048, 4096]  # decode blocks, then prefill sizes
KEEPS = [0.5, 0.6, 0.67, 0.7, 0.8, 0.9]


@dataclass(frozen=True)
class Shape:
    """What the roofline reads of one architecture."""

    model_id: str
    layers: int
    layer_params: int
    head_params: int
    params: int
    kv_width: int  # 2 · kv_heads · head_dim
    qk_width: int  # query heads · head_dim
    window: int | None  # sliding window of the sliding layers (None: none)
    sliding_share: float  # share of layers with a sliding window


@functools.cache
def shape_of(model_id: str) -> Shape:
    """The :class:`Shape` of a paper model (``conf/paper_shapes.yaml``) or an alias (:data:`ALIASES`)."""
    from transformers import AutoModelForCausalLM

    from viasd.models.paper_shapes import architecture_config, paper_architectures

    arch = ALIASES.get(model_id, model_id)
    if arch not in paper_architectures():
        raise ConfigError(f"no architecture for {model_id!r}: the roofline knows {', '.join(sorted(paper_architectures()))}"
                          f" and {', '.join(ALIASES)} (add its config.json fields to conf/paper_shapes.yaml)")
    cfg = architecture_config(arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    layers = model.model.layers
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    types = list(getattr(cfg, "layer_types", None) or [])
    sliding = sum(t == "sliding_attention" for t in types) / len(types) if types else 0.0
    return Shape(model_id=model_id, layers=len(layers), layer_params=sum(p.numel() for p in layers[0].parameters()),
                 head_params=model.get_output_embeddings().weight.numel(),
                 params=sum(p.numel() for p in model.parameters()),
                 kv_width=2 * int(cfg.num_key_value_heads) * head_dim, qk_width=int(cfg.num_attention_heads) * head_dim,
                 window=getattr(cfg, "sliding_window", None) if sliding else None, sliding_share=sliding)


def forward_ms(shape: Shape, gpu: GPU, n: int, ctx: int, layers: int | None = None, overhead: str = "eager",
               overheads: dict[str, dict[str, float]] | None = None) -> float:
    """Roofline milliseconds of one bf16 forward of ``n`` tokens after ``ctx`` cached ones through ``layers``
    decoder layers (None: all), plus the ``overhead`` mode's per-forward term (module docstring)."""
    lay = shape.layers if layers is None else layers
    win = min(ctx, shape.window) if shape.window else ctx
    ctx_l = (1 - shape.sliding_share) * ctx + shape.sliding_share * win  # mean cached length a layer reads
    weights = lay * shape.layer_params + shape.head_params
    bytes_ = 2 * weights + 2 * lay * shape.kv_width * (ctx_l + n)
    flops = 2 * n * weights + lay * 4 * n * (ctx_l + n) * shape.qk_width
    t = max(bytes_ / (gpu.bandwidth_gbs * 1e9), flops / (gpu.bf16_tflops * 1e12))
    o = (overheads or OVERHEADS)[overhead]
    return 1e3 * t + 1e-3 * (o["base_us"] + lay * o["per_layer_us"])


def pair_models(pair: str) -> dict[str, str]:
    """``{role: model id}`` of ``conf/pair/<pair>.yaml`` (draft, target, intermediate)."""
    path = PROJECT_ROOT / "conf" / "pair" / f"{pair}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"unknown pair {pair!r}; known pairs: {', '.join(known)}")
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {role: str(cfg[role]["id"]) for role in ("draft", "target", "intermediate") if (cfg.get(role) or {}).get("id")}


def roofline_pairs() -> list[str]:
    """The pairs of ``conf/pair/`` whose every model has a known architecture."""
    out = []
    for path in sorted((PROJECT_ROOT / "conf" / "pair").glob("*.yaml")):
        roles = pair_models(path.stem)
        try:
            if "target" in roles and all(shape_of(m) for m in roles.values()):
                out.append(path.stem)
        except ConfigError:
            continue
    return out


def _table(fn, contexts: list[int], ks: list[int]) -> dict[str, dict[str, float]]:
    return {str(c): {str(k): fn(k, c) for k in ks} for c in contexts}


def roofline_doc(pair: str, gpu: str, overhead: str = "eager", contexts: list[int] | None = None,
                 ks: list[int] | None = None, keeps: list[float] | None = None,
                 overheads: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """The ``viasd.cost/v1`` document of ``pair`` on card ``gpu`` (:data:`GPUS`); ``t_ms`` holds the
    ``overhead`` mode (``eager``: how viasd decodes; ``graph``: a captured CUDA graph), ``graph`` both."""
    if gpu not in GPUS:
        raise ConfigError(f"unknown gpu {gpu!r}; use one of {', '.join(GPUS)} (gpu=h100)")
    ov = {**OVERHEADS, **(overheads or {})}
    if overhead not in ov:
        raise ConfigError(f"unknown overhead {overhead!r}; use one of {', '.join(ov)} (overhead=eager)")
    card, contexts, ks, keeps = GPUS[gpu], contexts or CONTEXTS, ks or KS, keeps or KEEPS
    roles = pair_models(pair)
    if "target" not in roles:
        raise ConfigError(f"pair {pair!r} names no model architectures (a tiny random pair?); the roofline prices "
                          f"pairs of real models: {', '.join(roofline_pairs())}")
    models, skipped = {}, {}
    for model_id in dict.fromkeys(roles.values()):
        s = shape_of(model_id)
        if 2 * s.params / 1e9 > card.memory_gb:
            skipped[model_id] = f"too large for {card.name}: {2 * s.params / 1e9:.0f} GB of bf16 weights"
            continue
        ms = functools.partial(forward_ms, s, card, overhead=overhead, overheads=ov)
        slim = {f"{k:g}": max(1, round(k * s.layers)) for k in keeps}
        models[model_id] = {
            "params": s.params, "layers": s.layers,
            "t_ms": _table(lambda k, c, ms=ms: ms(k, c), contexts, ks),
            "ratio": _table(lambda k, c, ms=ms: ms(k, c) / ms(1, c), contexts, ks),
            "slim_layers": slim,
            "slim_t_ms": {keep: _table(lambda k, c, n=n, ms=ms: ms(k, c, n), contexts, ks) for keep, n in slim.items()},
            "graph": _table(lambda k, c, s=s: {"eager_ms": forward_ms(s, card, k, c, None, "eager", ov),
                                               "graph_ms": forward_ms(s, card, k, c, None, "graph", ov)},
                            contexts, ks),
            "roofline": {"layer_params": s.layer_params, "head_params": s.head_params, "kv_width": s.kv_width,
                         "qk_width": s.qk_width, "window": s.window, "sliding_share": s.sliding_share},
        }
        for row in models[model_id]["graph"].values():
            for cell in row.values():
                cell["launch_share"] = 1 - cell["graph_ms"] / cell["eager_ms"]
    if roles["target"] in skipped:
        fits = [g for g, c in GPUS.items() if 2 * shape_of(roles["target"]).params / 1e9 <= c.memory_gb]
        raise ConfigError(f"the target {roles['target']} does not fit one {card.name} ({skipped[roles['target']]}); "
                          f"pick {'gpu=' + fits[0] if fits else 'a smaller pair'}")
    entry: dict[str, Any] = dict(roles)
    if roles.get("draft") in models and roles.get("target") in models:
        d, t = models[roles["draft"]]["t_ms"], models[roles["target"]]["t_ms"]
        entry["c"] = {str(c): d[str(c)]["1"] / t[str(c)]["1"] for c in contexts}
    return {
        "schema": "viasd.cost/v1", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": f"{card.name} (roofline model, not measured)", "dtype": "bfloat16", "torch": None,
        "transformers": None, "threads": None, "repeats": 0, "wall_s": 0.0,
        "shapes": {"paper": True, "layers": None, "width_div": 1},
        "roofline": {"measured": False, "gpu": dataclasses.asdict(card), "overhead": overhead,
                     "overheads_us": ov, "formula": "max(bytes / bandwidth, flops / bf16_peak) + base + layers * "
                                                    "per_layer (viasd.analysis.roofline)"},
        "contexts": contexts, "ks": ks, "keeps": keeps, "models": models, "pairs": {pair: entry}, "skipped": skipped,
    }


def write_roofline(out: str | Path, pair: str, gpu: str, overhead: str = "eager",
                   overheads: dict[str, dict[str, float]] | None = None) -> tuple[Path, dict[str, Any]]:
    """Write :func:`roofline_doc` to ``out`` (JSON) → ``(path, document)``."""
    import json

    doc = roofline_doc(pair, gpu, overhead, overheads=overheads)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path, doc


def price_runs(stores, pair: str, cost_path: str | Path, run_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Every finished non-``ar`` run of ``pair`` in ``stores`` with an ``ar`` run of its workload (or ``run_ids``):
    its measured CPU-time speedup, the speedup its own CPU cost file predicts from its counters, and the one the
    roofline file ``cost_path`` predicts from the same counters (:func:`viasd.analysis.paired.compare_to_ar`)."""
    from viasd.analysis.cost import CostModel
    from viasd.analysis.paired import compare_to_ar, find_ar, load_run, run_cost

    roof = CostModel.load(cost_path, pair)
    ids = run_ids or [r["run_id"] for r in stores.finished_runs()
                      if r["summary"].get("pair") == pair and r["summary"].get("method") != "ar"
                      and r["summary"].get("new_tokens")]
    rows = []
    for rid in ids:
        run = load_run(stores, rid)
        ar = find_ar(stores, run) if run is not None else None
        if ar is None:
            continue
        cpu_cost = run_cost(stores, ar)
        cpu = compare_to_ar(stores, run, ar, cpu_cost) if cpu_cost is not None else None
        gpu = compare_to_ar(stores, run, ar, roof)
        rows.append({"task": run["summary"].get("task"), "method": run["summary"].get("method"), "run": rid,
                     "n": gpu["n"], "cpu_time": cpu["cpu"].estimate if cpu else float("nan"),
                     "cpu_model": cpu["predicted"].estimate if cpu else float("nan"),
                     "roofline": gpu["predicted"].estimate})
    return rows


def price_row(cost, row: dict[str, Any], ar_examples: list[dict[str, Any]], slim_layers: int | None) -> dict[str, float]:
    """A replayed policy's speedup over ``ar`` from its aggregate counters (a frontier/gates ``rows.json`` row,
    for policies with no decoded run, e.g. the oracle gate): its streams priced as ``row["n_examples"]`` copies of
    the mean example (:func:`~viasd.analysis.cost.predict_example`, mean prompt of ``ar_examples``), ``ar``
    priced example by example. ``slim_layers``: the slim verifier's layer count (None: no slim stream)."""
    from viasd.analysis.cost import predict_example
    from viasd.analysis.paired import prompt_len

    n = int(row["n_examples"])
    mean = {k: round(v / n) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for k, v in row.items()}
    prompt = round(sum(prompt_len(e) for e in ar_examples) / len(ar_examples))
    streams = {"target": ("target", None), "draft": ("draft", None)}
    if slim_layers is not None:
        streams["slim"] = ("target", slim_layers)
    policy_s = n * predict_example(cost, mean, prompt, streams)["total"]
    ar_s = sum(predict_example(cost, e, prompt_len(e), {"target": ("target", None)})["total"] for e in ar_examples)
    return {"policy_s": policy_s, "ar_s": ar_s, "speedup": ar_s / policy_s if policy_s else float("nan")}


def slim_layer_count(label: str, pair: str, n_layers: int) -> int | None:
    """The slim verifier's layer count a replayed row's label names (``slim=auto@0.80/kl`` → the pair's shipped
    mask of keep 0.80, else ``round(0.80 · n_layers)``); None when it names no slim mask."""
    import re

    m = re.search(r"auto@([0-9.]+)", label) or re.search(r"keep_ratio=([0-9.]+)", label)
    if m is None:
        return None
    keep = float(m.group(1))
    opts = (yaml.safe_load((PROJECT_ROOT / "conf" / "pair" / f"{pair}.yaml").read_text()).get("options") or {})
    shipped = (opts.get("slim_layers") or {}).get(f"{keep:.2f}")
    return len(shipped) if shipped else max(1, round(keep * n_layers))


def price_rows(stores, pair: str, cost_path: str | Path, rows_files: list[str | Path]) -> list[dict[str, Any]]:
    """:func:`price_row` of every replayed row in ``rows_files`` (``experiments.replay … out=`` / frontier
    ``rows.json``) under the row's own CPU cost file and under ``cost_path``; the row's trace-exact CPU
    prediction beside them shows what pricing from aggregate counters costs in accuracy."""
    import json

    from viasd.analysis.cost import CostModel
    from viasd.analysis.paired import load_run, run_cost

    roof = CostModel.load(cost_path, pair)
    out = []
    for f in rows_files:
        doc = json.loads(Path(f).read_text())
        for r in doc if isinstance(doc, list) else []:
            ar = load_run(stores, str(r.get("replay_of")))
            if ar is None or not r.get("n_examples") or r.get("method_impl", "via_sd") == "ar":
                continue
            exs = [ar["examples"][i] for i in r.get("replayed_examples") or range(int(r["n_examples"]))]
            slim = slim_layer_count(str(r.get("method")), pair, roof.entry("target").n_layers or 1) \
                if r.get("slim_calls") else None
            cpu = run_cost(stores, ar)
            out.append({"rows": Path(f).name, "method": r.get("method"), "n": int(r["n_examples"]),
                        "cpu_trace": r.get("predicted_speedup"),
                        "cpu_counters": price_row(cpu, r, exs, slim)["speedup"] if cpu else float("nan"),
                        "roofline": price_row(roof, r, exs, slim)["speedup"]})
    return out
