"""Build (or reuse) the embedded default pair's draft and report how good and how cheap it is.

    python -m experiments.build_draft                      # default DraftBuildConfig
    python -m experiments.build_draft pair=smollm2 steps=200 layers=2 --cost
    python -m experiments.build_draft --no-data           # built-in prompts only (no data folder)

``key=value`` arguments set :class:`viasd.distill.config.DraftBuildConfig` fields
(``pair=smollm2`` is accepted for Hydra-style symmetry with ``experiments.run`` and ignored).
The draft is cached under ``<cache>/drafts/<name>-<hash>/``; a cached draft is verified and
re-evaluated on its held-out prompts instead of being rebuilt (``--rebuild`` forces a build).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from pathlib import Path

import torch

from viasd.errors import ConfigError
from viasd.distill.build import build_info, ensure_draft, load_heldout, load_or_build_draft
from viasd.distill.cache import draft_dir
from viasd.distill.config import DraftBuildConfig
from viasd.distill.evaluate import agreement, forward_cost_ms
from viasd.models.smollm2 import load_smollm2_target


def parse_overrides(items: list[str]) -> DraftBuildConfig:
    """``DraftBuildConfig`` from ``key=value`` strings (``pair=smollm2`` ignored)."""
    fields = {f.name: f for f in dataclasses.fields(DraftBuildConfig)}
    kwargs: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.lstrip("+")
        if not sep:
            raise ConfigError(f"expected key=value, got {item!r}")
        if key == "pair":
            if value != "smollm2":
                raise ConfigError(f"experiments.build_draft builds the smollm2 pair's draft only, got pair={value}")
            continue
        if key not in fields:
            raise ConfigError(f"unknown DraftBuildConfig field {key!r}; known: {', '.join(fields)}")
        default = getattr(DraftBuildConfig(), key)
        if isinstance(default, bool):
            kwargs[key] = value.lower() in ("1", "true", "yes", "on")
        else:
            kwargs[key] = type(default)(value)
    return DraftBuildConfig(**kwargs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="DraftBuildConfig fields as key=value")
    ap.add_argument("--cache-root", type=Path, default=None, help="cache root (default: VIASD_CACHE_DIR or ~/.cache/viasd)")
    ap.add_argument("--no-data", action="store_true", help="ignore the data folder; use built-in prompts")
    ap.add_argument("--rebuild", action="store_true", help="delete a cached draft of this config and build again")
    ap.add_argument("--cost", action="store_true", help="also measure the draft/target forward cost ratio c (1 thread)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_intermixed_args(argv)
    try:
        cfg = parse_overrides(args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    progress = not args.quiet
    data_root = None if args.no_data else "auto"

    t0 = time.perf_counter()
    try:
        target, tokenizer = load_smollm2_target(cache_root=args.cache_root, progress=progress)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"target: SmolLM2-135M-Instruct loaded in {time.perf_counter() - t0:.1f}s")

    folder = draft_dir(target, cfg, args.cache_root, data_root)
    if args.rebuild and folder.exists():
        shutil.rmtree(folder)
    cached = folder.exists()
    t1 = time.perf_counter()
    ensure_draft(target, tokenizer, cfg, args.cache_root, progress, data_root)
    draft = load_or_build_draft(target, tokenizer, cfg, args.cache_root, progress=False, data_root=data_root)
    elapsed = time.perf_counter() - t1
    info = build_info(folder)
    held = load_heldout(folder)
    with torch.inference_mode():
        res = agreement(draft, held)

    print(f"draft: {folder}")
    print(f"  architecture: {cfg.layers} layers, hidden {cfg.hidden}, heads {cfg.heads}/{cfg.kv_heads} kv, "
          f"MLP {cfg.intermediate}, untied embeddings, head over {info.get('draft_vocab', '?')} tokens; "
          f"{info['num_parameters'] / 1e6:.2f}M parameters")  # fmt: skip
    if cached:
        print(f"  reused the cached draft (loaded in {elapsed:.1f}s); it was built in {info['seconds_total'] / 60:.1f} min")
    else:
        print(f"  built in {info['seconds_total'] / 60:.1f} min (teacher {info['seconds_teacher'] / 60:.1f} min, "
              f"training {info['seconds_train'] / 60:.1f} min, {info['threads']} thread(s), data: {info['data_source']})")  # fmt: skip
    print(f"  held-out top-1 agreement with the target: {res['agreement']:.3f} over {res['tokens']} tokens "
          f"(at init {info['heldout_agreement_at_init']:.3f}; recorded at build {info['heldout_agreement']:.3f})")  # fmt: skip
    for src, a in res["by_source"].items():
        print(f"    {src:16s} {a:.3f}")
    if "heldout_agreement_with_lookup" in info:
        print(f"  with prompt lookup first (drafter `hybrid`): {info['heldout_agreement_with_lookup']:.3f}; "
              f"head vocabulary covers {info['heldout_vocab_coverage']:.3f} of the held-out target tokens")  # fmt: skip
    if args.cost:
        for dtype in (torch.float32, torch.bfloat16):
            t_ms = forward_cost_ms(target.to(dtype))
            d_ms = forward_cost_ms(draft.to(dtype))
            print(f"  cost ({str(dtype).replace('torch.', '')}, 1 thread, 1-token forward): target {t_ms:.1f} ms, "
                  f"draft {d_ms:.2f} ms, c = {d_ms / t_ms:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
