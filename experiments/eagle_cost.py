"""``python -m experiments.eagle_cost [hidden=1536] [intermediate=8960] [layers=28] [heads=12] [kv_heads=2]
[vocab=151936] [draft_vocab=[151936,32000,8000]] [context=256] [reps=30] [threads=1]``

What an EAGLE head costs per drafted token next to one target forward, on this CPU, without the target's
weights: one random decoder layer of the target's shape (Llama layout, fp32) timed on a 1-token step over a
``context``-token KV cache, times ``layers``, plus the LM head over ``vocab``; against the head's step (its
2H-input layer, ``fc``, its LM head over each ``draft_vocab``) — ``c`` = head / target, the ratio the ideal
SD speedup ``E / (γ·c + 1)`` reads. The defaults are Qwen2.5-Coder-1.5B's shapes (the real pair's target).
Prints one row per draft vocabulary (median milliseconds over ``reps`` interleaved repetitions).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from experiments.trace import argv_or_help, parse_args
from viasd.engine.eagle import EagleHead, HeadSpec, Shared
from viasd.errors import ConfigError, one_line_errors


@dataclass
class CostArgs:
    hidden: int = 1536
    intermediate: int = 8960
    layers: int = 28
    heads: int = 12
    kv_heads: int = 2
    vocab: int = 151936
    draft_vocab: list[int] = field(default_factory=lambda: [151936, 32000, 8000])
    context: int = 256
    reps: int = 30
    threads: int = 1


def _ms(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


@torch.inference_mode()
def measure(a: CostArgs) -> pd.DataFrame:
    """Median ms of the target's per-token forward (layer × layers + LM head) and of each head's step."""
    torch.manual_seed(0)
    spec = HeadSpec(hidden=a.hidden, target_hidden=a.hidden, vocab=a.vocab, draft_vocab=a.vocab, heads=a.heads,
                    kv_heads=a.kv_heads, intermediate=a.intermediate)
    cfg = spec.llama_config()
    layer = LlamaDecoderLayer(cfg, layer_idx=0).eval()
    lm = torch.nn.Linear(a.hidden, a.vocab, bias=False)
    embed = torch.nn.Embedding(a.vocab, a.hidden)
    heads = {}
    for dv in a.draft_vocab:
        s = HeadSpec(**{**spec.__dict__, "draft_vocab": dv, "own_lm_head": dv < a.vocab, "meta": {}})
        h = EagleHead(s).eval()
        h.shared = Shared(embed, lm)
        if dv < a.vocab:
            h.set_vocab(torch.arange(dv))
        heads[dv] = h
    x = torch.randn(1, 1, a.hidden)
    ctx = torch.randn(1, a.context, a.hidden)
    rope_ctx = heads[a.draft_vocab[0]].rotary(ctx, torch.arange(a.context)[None])
    rope = heads[a.draft_vocab[0]].rotary(x, torch.tensor([[a.context]]))

    def cache_with_context(run) -> DynamicCache:
        c = DynamicCache()
        run(c)
        return c

    tcache = cache_with_context(lambda c: layer(ctx, position_embeddings=rope_ctx, cache=c,
                                                attention_mask=None))
    # one 1-token step, then roll the cache back (the timed step must not grow the context)
    def target_step():
        layer(x, position_embeddings=rope, cache=tcache, attention_mask=None)
        for lay in tcache.layers:
            lay.keys, lay.values = lay.keys[..., :a.context, :], lay.values[..., :a.context, :]

    hcaches = {dv: cache_with_context(lambda c, h=h: h.midlayer(torch.randn(1, a.context, a.hidden),
                                                                  torch.randn(1, a.context, a.hidden), rope_ctx, None, c))
               for dv, h in heads.items()}
    tok = torch.tensor([[5]])

    def head_step(dv):
        h, c = heads[dv], hcaches[dv]
        out = h.midlayer(h.embed(tok), h.fuse(x), rope, None, c)
        h.logits(out[0, -1]).argmax()
        for lay in c.layers:
            lay.keys, lay.values = lay.keys[..., :a.context, :], lay.values[..., :a.context, :]

    t_layer, t_lm, t_head = [], [], {dv: [] for dv in heads}
    for _ in range(a.reps):  # interleaved: load on a shared machine hits every part alike
        t_layer += _ms(target_step, 1)
        t_lm += _ms(lambda: lm(x).argmax(), 1)
        for dv in heads:
            t_head[dv] += _ms(lambda dv=dv: head_step(dv), 1)
    target = statistics.median(t_layer) * a.layers + statistics.median(t_lm)
    rows = []
    for dv in heads:
        hm = statistics.median(t_head[dv])
        rows.append({"draft_vocab": dv, "head_ms": round(hm, 2), "target_ms": round(target, 1),
                     "layer_ms": round(statistics.median(t_layer), 2), "lm_head_ms": round(statistics.median(t_lm), 2),
                     "c": round(hm / target, 4)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    argv = argv_or_help(argv, __doc__)
    if argv is None:
        return 0
    with one_line_errors():
        args = parse_args(argv, CostArgs)
        if min(args.hidden, args.layers, args.reps, args.context, min(args.draft_vocab)) < 1:
            raise ConfigError("hidden, layers, reps, context and every draft_vocab must be at least 1")
        torch.set_num_threads(args.threads)
        table = measure(args)
    print(table.to_markdown(index=False))
    print(f"\n{args.threads} thread(s), fp32, random weights of the given shapes; c = head step / target forward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
