"""Build (or reuse) the embedded default pair's draft and report how good and how cheap it is.

    python -m experiments.build_draft                      # default DraftBuildConfig
    python -m experiments.build_draft pair=smollm2 steps=200 layers=2 --cost
    python -m experiments.build_draft --no-data           # built-in prompts only (no data folder)

A build takes ~12–21 min on 2 CPU cores (the target continues every prompt, then the draft trains) and is
cached. The recipe's prompts are 384 + 48 from the offline data folder: the committed runs' draft. Without a
data folder (or ``--no-data``) the draft is distilled on the 41 + 7 built-in prompts — another draft, and the
runs that use it carry ``pair.options.draft_prompts=builtin:<hash>`` in their ids
(:func:`viasd.distill.pair.draft_prompts_identity`), so a run id always names one draft.

A Hydra entry (``conf/build_draft.yaml``): ``key=value`` overrides set
:class:`viasd.distill.config.DraftBuildConfig` fields (typed and checked by the schema built
from the dataclass); ``cost``, ``no_data``, ``rebuild``, ``quiet`` and ``cache_root`` choose
what the command does (``--cost``, ``--no-data``, ``--rebuild``, ``--quiet`` are accepted as
flags). The draft is cached under ``<cache>/drafts/<name>-<hash>/``; a cached draft is
verified and re-evaluated on its held-out prompts instead of being rebuilt (``rebuild=true``
forces a build).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from viasd.distill.build import build_info, ensure_draft, load_heldout, load_or_build_draft
from viasd.distill.cache import draft_dir
from viasd.distill.config import DraftBuildConfig
from viasd.distill.evaluate import agreement, forward_cost_ms
from viasd.errors import ConfigError, one_line_errors
from viasd.models.smollm2 import load_smollm2_target

FLAGS = {"--cost": "cost=true", "--no-data": "no_data=true", "--rebuild": "rebuild=true", "--quiet": "quiet=true"}


@dataclass
class BuildDraftOptions:
    """What the command does, besides the draft's config (see ``conf/build_draft.yaml``)."""

    pair: Any = None  # the `pair` config group (conf/pair/smollm2.yaml)
    cost: bool = False
    no_data: bool = False
    rebuild: bool = False
    quiet: bool = False
    cache_root: Optional[str] = None  # noqa: UP045  (OmegaConf reads the annotation)


def schema() -> type:
    """The command's structured config: :class:`BuildDraftOptions` plus every
    :class:`DraftBuildConfig` field with its type and default, as top-level keys."""
    hints = typing.get_type_hints(DraftBuildConfig)
    fields = [(f.name, hints[f.name], dataclasses.field(default=f.default)) for f in dataclasses.fields(DraftBuildConfig)]
    return dataclasses.make_dataclass("BuildDraftSchema", fields, bases=(BuildDraftOptions,))


ConfigStore.instance().store(name="build_draft_schema", node=schema())


def draft_build_config(cfg: DictConfig) -> DraftBuildConfig:
    """The :class:`DraftBuildConfig` of a composed ``build_draft`` config (only ``pair=smollm2``)."""
    if cfg.pair.get("loader") != "smollm2":
        raise ConfigError(f"experiments.build_draft builds the smollm2 pair's draft only, got pair={cfg.pair.name}")
    return DraftBuildConfig(**{f.name: cfg[f.name] for f in dataclasses.fields(DraftBuildConfig)})


@hydra.main(version_base="1.3", config_path="../conf", config_name="build_draft")
def main(cfg: DictConfig) -> None:
    with one_line_errors():
        report(cfg)


def report(args: DictConfig) -> None:
    """Build or reuse the draft of ``args`` and print its size, agreement and (``cost``) cost ratio."""
    cfg = draft_build_config(args)
    cache_root = Path(args.cache_root) if args.cache_root else None
    progress = not args.quiet
    data_root = None if args.no_data else "auto"

    t0 = time.perf_counter()
    target, tokenizer = load_smollm2_target(cache_root=cache_root, progress=progress)
    print(f"target: SmolLM2-135M-Instruct loaded in {time.perf_counter() - t0:.1f}s")

    folder = draft_dir(target, cfg, cache_root, data_root)
    if args.rebuild and folder.exists():
        shutil.rmtree(folder)
    cached = folder.exists()
    t1 = time.perf_counter()
    ensure_draft(target, tokenizer, cfg, cache_root, progress, data_root)
    draft = load_or_build_draft(target, tokenizer, cfg, cache_root, progress=False, data_root=data_root)
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


if __name__ == "__main__":
    sys.argv = [FLAGS.get(a, a) for a in sys.argv]  # flags, not Hydra overrides: turn them into ones
    main()
