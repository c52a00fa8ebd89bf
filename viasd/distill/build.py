"""Build (distill) and cache the draft model of the embedded default pair.

This module owns the build of the project's draft for SmolLM2-135M-Instruct and its cache:
:func:`build_draft` runs the recipe, :func:`ensure_draft` / :func:`load_or_build_draft` find
or build the verified cached draft. The recipe (every knob is a
:class:`~viasd.distill.config.DraftBuildConfig` field):

1. **Prompts** (:mod:`viasd.distill.data`) — task-like prompts from the offline data folder
   plus built-in chat prompts, de-duplicated and split train/held-out by a hash of their text.
2. **Teacher data** (:mod:`viasd.distill.teacher`) — the target greedily continues each
   chat-templated prompt; kept per sequence: its top-k log-probs at each continuation
   position and its final normed hidden state at every position (cached on its own).
3. **Draft** (:mod:`viasd.distill.init`) — ``layers`` × ``hidden`` Llama initialized from the
   target's embedding, LM head over the ``draft_vocab`` most frequent teacher tokens.
4. **Distillation** (:mod:`viasd.distill.train`) — hidden-state regression + top-k
   distillation, AdamW with warmup + cosine, fp32.
5. **Report** (:mod:`viasd.distill.evaluate`) — top-1 agreement with the target on held-out
   prompts, teacher-forced on the target's greedy continuations.

The result is cached in ``<cache_root>/drafts/<name>-<hash>/`` (:func:`viasd.distill.cache.draft_dir`:
hash of the config, the target's identity and the data source), written atomically with a
verified manifest exactly like the converted target (:mod:`viasd.models.artifacts`): a
truncated or altered checkpoint is detected, deleted and rebuilt, never loaded.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from viasd.distill.cache import draft_dir, target_fingerprint
from viasd.distill.config import REFERENCE_PROMPTS_SHA256, DraftBuildConfig
from viasd.distill.data import select_prompts, selection_of
from viasd.distill.draft_model import SubsetHeadLlamaForCausalLM
from viasd.distill.evaluate import agreement, lookup_agreement, vocab_coverage
from viasd.distill.init import init_draft, output_basis, vocab_subset
from viasd.distill.runtime import torch_threads
from viasd.distill.teacher import TeacherSeq, teacher_data
from viasd.distill.train import train_draft
from viasd.models.artifacts import (
    atomic_publish,
    hf_progress_bars,
    remove_broken,
    say,
    verify_manifest,
    write_manifest,
)
from viasd.paths import data_dir
from viasd.utils.fs import file_lock


def build_draft(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: DraftBuildConfig,
    out_dir: Path,
    progress: bool = True,
    data_root: Path | None | str = "auto",
) -> Path:
    """Build the draft into ``out_dir`` atomically (temp folder, manifest last, rename).

    ``data_root="auto"`` uses :func:`viasd.paths.data_dir` when present, else the built-in
    prompts; ``None`` forces the built-in prompts. The folder holds the draft
    (``save_pretrained``), the tokenizer, ``heldout.pt`` (held-out teacher sequences) and
    ``build_info.json`` (architecture, parameter count, timings, held-out agreement, prompt
    refs used for training); the manifest repeats the build info. Returns ``out_dir``.
    """
    transformers.logging.set_verbosity_error()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    droot = data_dir(required=False) if data_root == "auto" else (Path(data_root) if data_root else None)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".tmp-{out_dir.name}-"))
    try:
        with torch_threads(cfg.threads):
            used_threads = torch.get_num_threads()
            torch.manual_seed(cfg.seed)
            train_p, held_p, source_tag = select_prompts(cfg, droot)
            say(progress, f"draft build: {len(train_p)} training / {len(held_p)} held-out prompts ({source_tag})")
            t_gen = time.perf_counter()
            train_seqs, held_seqs, teacher_cached = teacher_data(
                target, tokenizer, cfg, train_p, held_p, out_dir.parent, progress
            )
            t_gen = time.perf_counter() - t_gen
            basis, rms = output_basis(train_seqs, cfg.hidden)
            subset = vocab_subset(train_seqs, cfg.draft_vocab, target.config.vocab_size, tokenizer.all_special_ids)
            draft = init_draft(target, cfg, basis, rms, subset)
            before = agreement(draft, held_seqs)
            t_train = time.perf_counter()
            losses = train_draft(draft, train_seqs, cfg, basis, progress)
            t_train = time.perf_counter() - t_train
            after = agreement(draft, held_seqs)
            train_agree = agreement(draft, train_seqs[: cfg.n_heldout])
        info = {
            "config": cfg.key(),
            "threads": used_threads,
            "data_source": source_tag,
            "target_fingerprint": target_fingerprint(target),
            "num_parameters": sum(p.numel() for p in draft.parameters()),
            "heldout_agreement": after["agreement"],
            "heldout_agreement_with_lookup": lookup_agreement(draft, held_seqs),
            "draft_vocab": len(subset) if subset else target.config.vocab_size,
            "heldout_vocab_coverage": vocab_coverage(held_seqs, subset),
            "heldout_agreement_by_source": after["by_source"],
            "heldout_tokens": after["tokens"],
            "heldout_agreement_at_init": before["agreement"],
            "train_agreement_sample": train_agree["agreement"],
            "train_tokens": int(sum(len(s.cont) for s in train_seqs)),
            "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
            "seconds_teacher": t_gen,
            "teacher_data_reused": teacher_cached,
            "seconds_train": t_train,
            "seconds_total": time.perf_counter() - t0,
            "train_prompts": [f"{p.source}:{p.ref}" for p in train_p],
            "heldout_prompts": [f"{p.source}:{p.ref}" for p in held_p],
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "created_unix": time.time(),
        }
        with hf_progress_bars(False):
            draft.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save([dataclasses.asdict(s) for s in held_seqs], tmp / "heldout.pt")
        (tmp / "build_info.json").write_text(json.dumps(info, indent=2))
        write_manifest(tmp, {k: v for k, v in info.items() if k not in ("train_prompts", "heldout_prompts")})
        atomic_publish(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def load_heldout(folder: Path) -> list[TeacherSeq]:
    """The held-out teacher sequences saved with a built draft."""
    return [TeacherSeq(**d) for d in torch.load(Path(folder) / "heldout.pt", weights_only=True)]


def build_info(folder: Path) -> dict:
    """The ``build_info.json`` of a built draft (agreement, timings, parameter count, …)."""
    return json.loads((Path(folder) / "build_info.json").read_text())


def build_notice(cfg: DraftBuildConfig, folder: Path, data_root: Path | None | str = "auto") -> str:
    """What a draft build is about to cost and use, said before it starts: its prompts (the data folder's recipe
    or the built-in ones, and whether run ids name them), its size and its time on a 2-core CPU."""
    droot = data_dir(required=False) if data_root == "auto" else (Path(data_root) if data_root else None)
    sha, tag, n_train, n_held = selection_of(cfg, droot)
    if sha == REFERENCE_PROMPTS_SHA256:
        source = f"the recipe's {n_train} + {n_held} prompts from the data folder {droot}: the committed runs' draft"
    else:
        source = (f"{n_train} + {n_held} {'built-in' if tag == 'builtin' else 'data-folder'} prompts, not the recipe's "
                  f"384 + 48 from the offline data folder: another draft, so runs using it carry "
                  f"pair.options.draft_prompts={tag}:{sha[:12]} in their ids")
    return (f"building draft {folder.name} once (cached after; ~12–21 min on 2 CPU cores: the target continues every "
            f"prompt by up to {cfg.gen_tokens} tokens, then {cfg.steps} training steps of a {cfg.layers}-layer "
            f"{cfg.hidden}-wide Llama) from {source}…")


def ensure_draft(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: DraftBuildConfig,
    cache_root: Path | None = None,
    progress: bool = True,
    data_root: Path | None | str = "auto",
) -> Path:
    """Verified cache folder of the draft, building it (under a file lock) if missing or broken."""
    folder = draft_dir(target, cfg, cache_root, data_root)
    reason = verify_manifest(folder)
    if reason is None:
        return folder
    with file_lock(folder.parent / f".{folder.name}.lock"):
        reason = verify_manifest(folder)
        if reason is None:
            return folder
        if reason != "missing":
            remove_broken(folder, reason, progress)
        say(progress, build_notice(cfg, folder, data_root))
        build_draft(target, tokenizer, cfg, folder, progress, data_root)
    reason = verify_manifest(folder)
    if reason is not None:
        raise RuntimeError(f"fresh draft at {folder} fails verification: {reason}")
    return folder


def load_or_build_draft(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: DraftBuildConfig | None = None,
    cache_root: Path | None = None,
    progress: bool = True,
    data_root: Path | None | str = "auto",
) -> SubsetHeadLlamaForCausalLM:
    """The cached draft for ``target`` (built on first use), fp32, in eval mode.

    ``draft(input_ids[B, T]).logits`` is ``[B, T, V]`` with the target's vocabulary ``V``.
    """
    cfg = cfg or DraftBuildConfig()
    folder = ensure_draft(target, tokenizer, cfg, cache_root, progress, data_root)
    transformers.logging.set_verbosity_error()
    with hf_progress_bars(False):
        return SubsetHeadLlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
