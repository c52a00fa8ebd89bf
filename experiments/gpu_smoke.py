"""``python -m experiments.gpu_smoke [--device cuda] [--dtype bfloat16]`` — does the GPU path work?

A few minutes on one GPU, no download: every tiny pair family (Llama, Qwen2, Gemma2, T5) is
built on the device in the given dtype, and for a handful of prompts it checks

* ``sd`` (γ=4) greedy == ``ar`` greedy, token for token (in float32; in bf16 a first
  divergence is accepted only where the target's two candidate logits tie within bf16 rounding);
* ``viasd`` with both tiers off (τ > 1) == ``ar``;
* the routed slim verifier (a DIMR ``every_other`` mask through the target's own layers) runs
  with the tiers on and is used, and with ``mask=full``, tier 1 off and tier 2 always on (every token is the slim = full model's argmax) it is still == ``ar``;

then prints one timing table (new tokens/s per pair and method, host syncs per token counted in
one more, untimed decode: :mod:`viasd.engine.syncs`). Two more sections:

* ``split``: ``ar``, ``sd`` and ``cascade_sd`` with tiny-llama's target split by an explicit device
  map (embeddings and the first half of the layers on ``--device``, the rest, the norm and the LM
  head on ``--split-to``, default ``cpu``), in float32, == the unsplit ``ar`` run;
* ``compiled`` (``--compile inductor``, the default on cuda): ``ar`` and ``sd`` with
  ``+pair.compile=true`` (static KV cache + ``torch.compile``) == eager ``ar``, their tokens/s next
  to the eager rows (pairs the compiled path refuses are listed, not failed).

It exits 0 when every check passes and 1 otherwise. ``--device cpu`` runs the same checks on the CPU (the project's tests run
it that way as a self-check of the script).

``--paper-shapes`` instead builds the paper pairs' models (``conf/paper_shapes.yaml``) with random
weights on the device and measures their forward costs at paper shapes
(:mod:`viasd.harness.shape_costs`: ``t(k)/t(1)`` at 256 and 2,048 context, the draft/target cost
ratio ``c``, the slim verifier by keep ratio, eager vs CUDA-graph launch overhead, one DIMR
calibration batch's peak memory); it writes the ``viasd.cost/v1`` JSON (``docs/cost_file.md``) and
its table. ``--device cpu --layers 2`` runs the same path as a self-test (on the CPU the defaults
are float32, widths divided by 32, contexts 32 and 128, a 2 x 32 calibration batch: seconds, not a
measurement).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from viasd.engine.routing import num_layers
from viasd.engine.syncs import HostSyncs
from viasd.errors import ConfigError
from viasd.harness.shape_costs import CONTEXTS, SEARCH_BATCH, SEARCH_SEQ, cost_table, measure
from viasd.methods.api import decode
from viasd.models.pairs import load_pair, resolve_dtype
from viasd.models.paper_shapes import paper_architectures
from viasd.paths import PROJECT_ROOT
from viasd.utils.fs import atomic_write_json, atomic_write_text

__all__ = ["SmokeRow", "smoke", "main"]

PAIRS = ("tiny-llama", "tiny-qwen2", "tiny-gemma2", "tiny-t5")
PROMPTS = (
    "The cat sat on the mat.",
    "Once upon a time, in a land far away, there lived a king who loved numbers.",
    "def add(a, b):\n    return a + b\n",
    "Translate to English: Der Hund schläft im Garten.",
    "Q: What is 12 times 7? A:",
)
TIERS_OFF = {"tau_accept": 1.01, "tau_slim": 1.5}
ROUTED = {"tau_accept": 0.5, "tau_slim": 0.2}


@dataclass
class SmokeRow:
    """One (pair, method) line of the report: tokens, seconds, and whether its check passed."""

    pair: str
    method: str
    tokens: int
    seconds: float
    ok: bool
    detail: str = ""
    syncs_per_token: float = float("nan")


NEAR_TIE = 0.03  # relative top-2 logit gap within which reduced precision may pick either token


def _near_tie(pair, ids: torch.Tensor, common: list[int], a: int, b: int) -> float | None:
    """Relative logit gap of tokens ``a``/``b`` after ``ids + common`` (None for encoder-decoders).

    Batched verification and one-token steps round differently in bf16, so a lossless method
    may pick the other token where the target's two best logits tie within that rounding.
    """
    if getattr(pair.target.config, "is_encoder_decoder", False):
        return None
    ctx = torch.cat([ids, torch.tensor([common], dtype=ids.dtype, device=ids.device)], dim=1) if common else ids
    with torch.no_grad():
        logits = pair.target(input_ids=ctx).logits[0, -1].float()
    la, lb = float(logits[a]), float(logits[b])
    return abs(la - lb) / max(1.0, abs(la), abs(lb))


def match_rate(outs: list[list[int]], ref: list[list[int]]) -> tuple[int, int]:
    """(tokens equal at the same position, tokens of ``ref``) over every prompt: how far a method's
    outputs agree with ``ar``'s, past any divergence."""
    same = sum(x == y for o, r in zip(outs, ref) for x, y in zip(o, r))
    return same, sum(len(r) for r in ref)


def _compare(pair, prompts, outs, ref, exact: bool) -> tuple[bool, str]:
    """(ok, detail): token equality with ``ar``; below fp32, a first divergence at a near-tie is allowed.

    The detail gives the token match rate (:func:`match_rate`) and, for a prompt that fails, its first
    divergence (position, ar's token vs the method's) with the relative logit margin there, so a
    bf16 near-tie is told apart from a real difference; fp32 (``exact``) still fails on any divergence."""
    bad, ties, worst, first = [], [], 0.0, ""
    for i, (ids, o, r) in enumerate(zip(prompts, outs, ref)):
        if o == r:
            continue
        j = next((k for k, (x, y) in enumerate(zip(o, r)) if x != y), min(len(o), len(r)))
        gap = None if j >= min(len(o), len(r)) else _near_tie(pair, ids, r[:j], r[j], o[j])
        if not exact and gap is not None and gap <= NEAR_TIE:
            ties.append(i)
            worst = max(worst, gap)
            continue
        bad.append(i)
        if not first:
            at = f"ar {r[j]} vs {o[j]}" if j < min(len(o), len(r)) else f"lengths {len(r)} vs {len(o)}"
            margin = "" if gap is None else f", relative logit margin {gap:.4f}"
            first = f"; first divergence: prompt {i} at token {j} ({at}{margin})"
    same, total = match_rate(outs, ref)
    rate = f"token match {same}/{total} ({100 * same / max(1, total):.1f}%)"
    if bad:
        return False, f"differs from ar on prompts {bad}: {rate}{first}"
    return True, "== ar" + (f" (prompts {ties} diverge at a near-tie, gap <= {worst:.4f}; {rate})" if ties else "")


def _sync(device: str) -> None:
    """Wait for every visible GPU (a pair split over devices queues work on each)."""
    if device.startswith("cuda"):
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def smoke(device: str, dtype: str, n_prompts: int, max_new_tokens: int) -> list[SmokeRow]:
    """Run every check on every tiny pair; returns the report rows (``ok`` False marks a failure)."""
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    gen = {"max_new_tokens": max_new_tokens, "ignore_eos": True}
    methods = {
        "ar": ("ar", None),
        "sd": ("sd", {"gamma": 4}),
        "viasd_tiers_off": ("viasd", {"gamma": 4, **TIERS_OFF, "slim": {"mask": "every_other"}}),
        "viasd_routed": ("viasd", {"gamma": 4, **ROUTED, "slim": {"mask": "every_other"}}),
        # q' = q, tier 1 off, tier 2 always: every token is q's own argmax (lossless by construction)
        "viasd_full_slim": ("viasd", {"gamma": 4, "tau_accept": 1.5, "tau_slim": 0.0, "slim": {"mask": "full"}}),
    }
    rows: list[SmokeRow] = []
    for name in PAIRS:
        pair = load_pair(name, device=device, dtype=dtype)
        prompts = [pair.encode(p) for p in PROMPTS[:n_prompts]]
        decode(pair, prompts[0], "sd", {"gamma": 4}, {"max_new_tokens": 4})  # warm-up (kernels, caches)
        ref: list[list[int]] = []
        for label, (method, cfg) in methods.items():
            outs, slim_used, t0 = [], 0, time.perf_counter()
            for ids in prompts:
                res = decode(pair, ids, method, cfg, gen)
                outs.append(res.tokens)
                slim_used += sum(v for k, v in res.counters.tiers.items() if k.startswith("tier"))
            _sync(device)
            secs = time.perf_counter() - t0
            if label == "ar":
                ref = outs
            ok, detail = True, ""
            if label in ("sd", "viasd_tiers_off", "viasd_full_slim"):
                ok, detail = _compare(pair, prompts, outs, ref, exact=dtype == "float32")
            elif label == "viasd_routed":
                ok, detail = slim_used > 0, f"slim tier decisions: {slim_used}"
            rows.append(SmokeRow(name, label, sum(len(o) for o in outs), secs, ok, detail,
                                 syncs_per_token(pair, prompts[0], method, cfg, gen)))
        del pair
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def syncs_per_token(pair, ids: torch.Tensor, method: str, cfg, gen) -> float:
    """Host syncs per generated token of one more (untimed) decode of ``ids``."""
    with HostSyncs() as syncs:
        res = decode(pair, ids, method, cfg, gen)
    return syncs.count / max(1, res.new_tokens)


def _timed(pair, prompts, method, cfg, gen, device) -> tuple[list[list[int]], float]:
    t0 = time.perf_counter()
    outs = [decode(pair, ids, method, cfg, gen).tokens for ids in prompts]
    _sync(device)
    return outs, time.perf_counter() - t0


def split_smoke(device: str, split_to: str, n_prompts: int, max_new_tokens: int) -> list[SmokeRow]:
    """Lossless methods with tiny-llama's target split between ``device`` and ``split_to`` by an
    explicit device map (float32) == the unsplit ``ar`` run."""
    from accelerate import dispatch_model

    gen = {"max_new_tokens": max_new_tokens, "ignore_eos": True}
    pair = load_pair("tiny-llama", device=device, dtype="float32")
    prompts = [pair.encode(p) for p in PROMPTS[:n_prompts]]
    ref, _ = _timed(pair, prompts, "ar", None, gen, device)
    n = num_layers(pair.target)
    dmap = {"model.embed_tokens": device, "model.rotary_emb": device, "model.norm": split_to, "lm_head": split_to,
            **{f"model.layers.{i}": device if i < n // 2 else split_to for i in range(n)}}
    pair.target = dispatch_model(pair.target, device_map=dmap)
    rows = []
    for label, (method, cfg) in {"ar": ("ar", None), "sd": ("sd", {"gamma": 4}), "cascade_sd": ("cascade_sd", None)}.items():
        outs, secs = _timed(pair, prompts, method, cfg, gen, device)
        ok, detail = _compare(pair, prompts, outs, ref, exact=False)
        rows.append(SmokeRow(f"split:{device}+{split_to}", label, sum(map(len, outs)), secs, ok, detail,
                             syncs_per_token(pair, prompts[0], method, cfg, gen)))
    return rows


def compiled_smoke(device: str, dtype: str, backend: str, n_prompts: int, max_new_tokens: int) -> list[SmokeRow]:
    """``ar`` and ``sd`` eager and with ``+pair.compile=true`` (``backend``) per decoder-only tiny pair:
    tokens/s of each, the compiled outputs == eager ``ar``'s (a pair the compiled path refuses is listed)."""
    gen = {"max_new_tokens": max_new_tokens, "ignore_eos": True}
    methods = {"ar": ("ar", None), "sd": ("sd", {"gamma": 4})}
    rows = []
    for name in PAIRS:
        try:
            comp = load_pair(name, device=device, dtype=dtype, compile=True, compile_backend=backend)
        except ConfigError as e:
            rows.append(SmokeRow(name, "compiled", 0, 0.0, True, f"not compiled: {e}"))
            continue
        eager = load_pair(name, device=device, dtype=dtype, backend="eager")
        prompts = [eager.encode(p) for p in PROMPTS[:n_prompts]]
        ref: list[list[int]] = []
        for label, (method, cfg) in methods.items():
            for tag, pair in (("eager", eager), (f"compiled:{backend}", comp)):
                decode(pair, prompts[0], method, cfg, gen)  # warm-up: compilation stays out of the timing
                outs, secs = _timed(pair, prompts, method, cfg, gen, device)
                ref = ref or outs
                ok, detail = _compare(eager, prompts, outs, ref, exact=dtype == "float32")
                rows.append(SmokeRow(name, f"{label} {tag}", sum(map(len, outs)), secs, ok, detail))
    return rows


def _table(rows: list[SmokeRow], device: str, dtype: str) -> str:
    lines = [f"GPU smoke on {device} ({dtype})",
             f"{'pair':<18} {'method':<22} {'tokens':>6} {'tok/s':>8} {'syncs/tok':>9}  check"]
    for r in rows:
        rate = r.tokens / r.seconds if r.seconds else float("nan")
        lines.append(f"{r.pair:<18} {r.method:<22} {r.tokens:>6} {rate:>8.1f} {r.syncs_per_token:>9.2f}  "
                     f"{'ok' if r.ok else 'FAIL'} {r.detail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line entry: run the smoke checks, print the table; 0 when all pass, 1 otherwise."""
    ap = argparse.ArgumentParser(prog="python -m experiments.gpu_smoke", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--split-to", default="cpu", help="device of the split target's second half (split check)")
    ap.add_argument("--compile", default=None, choices=["none", "inductor", "aot_eager", "eager"],
                    help="torch.compile backend of the compiled rows (default: inductor on cuda, none on cpu)")
    shapes = ap.add_argument_group("--paper-shapes (forward costs of the paper models, random weights)")
    shapes.add_argument("--paper-shapes", action="store_true", help="measure the paper pairs' costs instead")
    shapes.add_argument("--models", default=None,
                        help="comma-separated hub ids; 'all' adds Llama-2-70B (>= 140 GB); default: every pair's "
                             "models but the 70B")
    shapes.add_argument("--layers", type=int, default=None, help="keep this many decoder layers (default: all)")
    shapes.add_argument("--width-div", type=int, default=None, help="divide widths by this (default 1; 32 on cpu)")
    shapes.add_argument("--contexts", default=None,
                        help=f"cached tokens before a forward (default {','.join(map(str, CONTEXTS))}; 32,128 on cpu)")
    shapes.add_argument("--repeats", type=int, default=None, help="timed calls per point (default 10; 1 on cpu)")
    shapes.add_argument("--budget-s", type=float, default=270.0, help="skip the models left after this many s")
    shapes.add_argument("--out", default=None, help="JSON path (default bench_results/paper_shapes_<device>.json)")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU (torch.cuda.is_available() is False); "
              "install a CUDA build of torch or pass --device cpu", file=sys.stderr)
        return 2
    if args.paper_shapes:
        return paper_shapes(args)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    t0 = time.perf_counter()
    rows = smoke(args.device, dtype, args.prompts, args.max_new_tokens)
    rows += split_smoke(args.device, args.split_to, args.prompts, args.max_new_tokens)
    backend = args.compile or ("inductor" if args.device.startswith("cuda") else "none")
    if backend != "none":
        rows += compiled_smoke(args.device, dtype, backend, args.prompts, args.max_new_tokens)
    print(_table(rows, args.device, dtype))
    failed = [f"{r.pair}/{r.method}" for r in rows if not r.ok]
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 1 if failed else 0


def paper_shapes(args: argparse.Namespace) -> int:
    """``--paper-shapes``: measure, write the cost JSON and its Markdown table, print the table; 0 when written."""
    cpu = not args.device.startswith("cuda")
    models = None if args.models is None else (list(paper_architectures()) if args.models == "all"
                                                 else [m.strip() for m in args.models.split(",") if m.strip()])
    contexts = [int(c) for c in args.contexts.split(",")] if args.contexts else (32, 128) if cpu else CONTEXTS
    doc = measure(args.device, resolve_dtype(args.dtype or ("float32" if cpu else "bfloat16")), models, args.layers,
                  args.width_div or (32 if cpu else 1), contexts, args.repeats or (1 if cpu else 10), args.budget_s,
                  search=(2, 32) if cpu else (SEARCH_BATCH, SEARCH_SEQ))
    out = Path(args.out or PROJECT_ROOT / "bench_results" / f"paper_shapes_{'cpu' if cpu else 'cuda'}.json")
    table = cost_table(doc)
    atomic_write_json(out, doc)
    atomic_write_text(out.with_suffix(".md"), table + "\n")
    print(table)
    print(f"cost file written to {out} ({doc['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
