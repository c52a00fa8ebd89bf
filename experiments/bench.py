"""``python -m experiments.bench [pair=…] [methods=[ar,sd,hf_assisted]] [gamma=4] [variants=…]``

Prints a Markdown table of speed ratios against ``ar`` and writes JSON (``out=``). Speed
goals live here, never in timed unit tests. Use 1 torch thread (``threads=1``) and bf16 on CPU.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from viasd.errors import ConfigError


def load_prompts(spec: str, n: int, tokenizer=None) -> list[str]:
    """Benchmark prompts: the built-in set, a task's examples, or a prompt file."""
    from viasd.tasks import build_task

    if spec == "builtin":
        task = build_task({"name": "prompts", "path": None})
    elif spec.endswith((".jsonl", ".txt")):
        task = build_task({"name": "prompts", "path": spec})
    else:
        task = build_task({"name": spec, "n_examples": n})
    exs = task.examples()
    out = [task.render(e, tokenizer) for e in exs]
    while len(out) < n:  # cycle a short set
        out += out[: n - len(out)]
    return out[:n]


@hydra.main(version_base="1.3", config_path="../conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    import torch
    import transformers

    from viasd.benchmark import Variant, format_table, run_bench, write_json
    from viasd.config import GenerationConfig
    from viasd.models.pairs import load_pair

    transformers.logging.set_verbosity_error()
    try:
        torch.set_num_threads(int(cfg.threads))
        pair = load_pair(cfg.pair)
        variants = [Variant(m, m, {} if m == "ar" else {"gamma": int(cfg.gamma)}) for m in cfg.methods]
        for label, v in OmegaConf.to_container(cfg.variants, resolve=True).items():
            v = dict(v)
            variants.append(Variant(label, v.pop("method"), v))
        prompts = load_prompts(str(cfg.prompts), int(cfg.n_prompts), pair.tokenizer)
        gen = GenerationConfig(max_new_tokens=int(cfg.max_new_tokens), temperature=float(cfg.temperature),
                               ignore_eos=True)
        rows = run_bench(pair, prompts, variants, gen, warmup=int(cfg.warmup), seed=int(cfg.seed))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"\npair={pair.name} dtype={cfg.pair.dtype} threads={cfg.threads} prompts={len(prompts)} "
          f"max_new_tokens={cfg.max_new_tokens} gamma={cfg.gamma}")
    print(format_table(rows))
    write_json(cfg.out, rows, {"pair": OmegaConf.to_container(cfg.pair, resolve=True), "gamma": cfg.gamma,
                               "n_prompts": len(prompts), "max_new_tokens": cfg.max_new_tokens})
    print(f"wrote {cfg.out}")


if __name__ == "__main__":
    main()
