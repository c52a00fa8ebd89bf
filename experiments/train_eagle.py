"""``python -m experiments.train_eagle pair=<pair> out=<head folder> [max_steps=200] [features=last|eagle3|[i,j,k]]
[draft_vocab=N] [text=greedy|prompt] [n_texts=64] [n_heldout=8] [max_new=64] [ttt=3] [k=5] [lr=1e-3] [batch=4]
[window=128] [warmup=20] [checkpoint_every=50] [eval_every=0] [seed=0] [data=auto|builtin] [threads=0] [cache_root=…]
[quiet=false]``

Trains an EAGLE-style draft head for the pair's target (:mod:`viasd.distill.eagle_train`): the target's
greedy continuations of distillation prompts no evaluation slice uses (the built-in prompts without the data
folder), its features stored once in a cache, AdamW with warm-up and cosine decay, a training-time test of
``ttt`` draft steps, a checkpoint every ``checkpoint_every`` steps (a killed run resumes when rerun with the
same arguments). Prints the held-out acceptance per draft position before and after training, the time of
each stage and the head's sha256; writes the head folder (EAGLE-3 layout, ``drafter.path=<out>``) with
``train_info.json``. A tiny pair trains in seconds: ``pair=tiny-llama out=/tmp/head max_steps=20``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from experiments.trace import argv_or_help, parse_args
from viasd.distill.eagle_data import EagleTrainConfig
from viasd.distill.eagle_train import train_head
from viasd.distill.runtime import torch_threads
from viasd.errors import ConfigError, one_line_errors


@dataclass
class TrainEagleArgs(EagleTrainConfig):
    """The command's ``key=value`` arguments: the recipe plus what to train it for and where to write it."""

    pair: str = ""
    out: str = ""
    threads: int = 0  # 0: auto (1 on a busy machine)
    cache_root: Any = None
    quiet: bool = False


def main(argv: list[str] | None = None) -> int:
    argv = argv_or_help(argv, __doc__)
    if argv is None:
        return 0
    with one_line_errors():
        args = parse_args(argv, TrainEagleArgs)
        if not args.pair or not args.out:
            raise ConfigError("name the pair and the head folder: pair=<pair> out=<folder> (e.g. pair=tiny-llama out=/tmp/head)")
        recipe = EagleTrainConfig(**{k: getattr(args, k) for k in EagleTrainConfig.__dataclass_fields__})
        recipe.validate()  # before a model loads
        from viasd.models.pairs import load_pair

        pair = load_pair(args.pair)
        if pair.is_encoder_decoder:
            raise ConfigError(f"pair {args.pair} is encoder-decoder; EAGLE heads are trained for decoder-only targets")
        with torch_threads(args.threads):
            info = train_head(pair.target, pair.tokenizer, recipe, args.out, args.cache_root, progress=not args.quiet)
    rows = [("at init", info["heldout_at_init"]), ("trained", info["heldout"])]
    print(f"head for {args.pair}: {info['steps']} steps, features {info['feature_layers']}, "
          f"draft vocabulary {info['draft_vocab']}, {info['train_sequences']} train / {info['heldout_sequences']} "
          f"held-out sequences ({info['train_tokens']} tokens, {info['data_source']} prompts, text={recipe.text})")
    for label, acc in rows:
        if acc:
            alpha = " ".join(f"{a:.3f}" for a in acc["alpha"])
            print(f"  held-out α per position ({label}): {alpha}; {acc['accepted_per_draft']:.2f} tokens per "
                  f"{recipe.k}-token draft over {acc['chains']} chains")
    print(f"  seconds: {json.dumps(info['seconds'])} ({info['threads']} thread(s))")
    print(f"  wrote {args.out} sha256 {info['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
