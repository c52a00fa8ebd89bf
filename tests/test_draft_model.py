"""The vocabulary-subset draft head: full-vocabulary logits, save/load, its training pieces and cache key."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from viasd.distill.cache import draft_dir, target_fingerprint
from viasd.distill.config import DraftBuildConfig
from viasd.distill.draft_model import SubsetHeadLlamaForCausalLM, make_config
from viasd.distill.init import vocab_subset
from viasd.distill.teacher import TeacherSeq
from viasd.distill.train import distill_loss, warmup_cosine
from viasd.models.pairs import vocab_size_of

SUBSET = [0, 5, 7, 9, 50, 99]


def tiny(subset=SUBSET) -> SubsetHeadLlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip
    return SubsetHeadLlamaForCausalLM(make_config(cfg, subset)).eval()


def test_logits_cover_the_full_vocabulary_and_only_the_subset_is_finite():
    model = tiny()
    x = torch.randint(0, 100, (2, 7))
    logits = model(x).logits
    assert logits.shape == (2, 7, 100) and vocab_size_of(model) == 100
    finite = torch.isfinite(logits)
    assert finite[..., SUBSET].all() and finite.sum(-1).eq(len(SUBSET)).all()
    assert set(logits.argmax(-1).flatten().tolist()) <= set(SUBSET)


def test_save_and_load_round_trip(tmp_path):
    """The subset lives in config.json; a reloaded draft gives identical logits and generations."""
    model = tiny()
    x = torch.randint(0, 100, (1, 9))
    model.save_pretrained(tmp_path)
    again = SubsetHeadLlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert again.lm_head.id_list == tuple(SUBSET)
    assert torch.equal(again(x).logits, model(x).logits)
    out = again.generate(x, max_new_tokens=4, do_sample=False)
    assert set(out[0, 9:].tolist()) <= set(SUBSET)


def test_without_a_subset_it_is_a_plain_llama():
    model = tiny(subset=None)
    assert isinstance(model.lm_head, torch.nn.Linear) and model.lm_head.weight.shape == (100, 32)


def test_bad_subset_is_rejected():
    with pytest.raises(ValueError, match="distinct ids"):
        tiny(subset=[1, 1, 2])
    with pytest.raises(ValueError, match="distinct ids"):
        tiny(subset=[1, 100])


def test_vocab_subset_ranks_special_tokens_then_frequency_then_id():
    seqs = [TeacherSeq("x", torch.tensor([3, 3, 3, 8]), torch.tensor([8, 6]), torch.zeros(2, 1, dtype=torch.int32),
                       torch.zeros(2, 1), torch.zeros(5, 4))]  # fmt: skip
    # counts: 3 -> 3, 8 -> 1 + 2, 6 -> 2; special 42 always; fill by ascending id
    assert vocab_subset(seqs, 4, 50, always=[42]) == [3, 6, 8, 42]
    assert vocab_subset(seqs, 6, 50, always=[42]) == [0, 1, 3, 6, 8, 42]
    assert vocab_subset(seqs, 0, 50) is None and vocab_subset(seqs, 50, 50) is None


def test_distill_loss_ignores_teacher_tokens_the_head_cannot_score():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    top_lp = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    full = distill_loss(logits, torch.tensor([[0, 1, 2]]), top_lp, hard_weight=0.0)
    assert float(full) == pytest.approx(-(0.6 * math.log(0.5) + 0.3 * math.log(0.25) + 0.1 * math.log(0.25)))
    # token 2 is outside the head: the teacher's remaining mass is renormalized over tokens 0, 1
    part = distill_loss(logits, torch.tensor([[0, 1, -1]]), top_lp, hard_weight=0.0)
    assert float(part) == pytest.approx(-(2 / 3 * math.log(0.5) + 1 / 3 * math.log(0.25)))
    # hard term: rows whose top-1 is outside the head do not count
    hard = distill_loss(logits, torch.tensor([[-1, 1, 2]]), top_lp, hard_weight=1.0)
    assert float(hard) == 0.0


class _StubTarget:
    """Fixed embedding ``[12, 4]`` and config dict: the cache key's inputs without a real model."""

    class config:  # noqa: N801  (mimics ``model.config``)
        @staticmethod
        def to_dict() -> dict:
            return {"model_type": "llama", "vocab_size": 12, "hidden_size": 4, "_name_or_path": "/x",
                    "dtype": "float32", "transformers_version": "0.0", "rope_parameters": {"rope_theta": 10000.0}}  # fmt: skip

    @staticmethod
    def get_input_embeddings() -> torch.nn.Embedding:
        emb = torch.nn.Embedding(12, 4)
        with torch.no_grad():
            emb.weight.copy_(torch.arange(48, dtype=torch.float32).reshape(12, 4) / 7 - 3)
        return emb


def test_draft_cache_key_is_unchanged(tmp_path, monkeypatch):
    """Every cached draft is found through these hashes: they were computed by the code before
    the distill package existed (models/draft_build.py) and must not drift. A data folder holding the
    recipe's reference selection keys as before; another selection is another draft."""
    from viasd.distill import cache as cache_mod
    from viasd.distill.config import REFERENCE_PROMPTS_SHA256

    monkeypatch.setattr(cache_mod, "selection_of", lambda cfg, root: (REFERENCE_PROMPTS_SHA256,))
    target = _StubTarget()
    assert target_fingerprint(target) == "f8c4a1e261bed5d3"
    other = DraftBuildConfig(name="x", layers=2, lr=1e-3, threads=3)
    got = [draft_dir(target, cfg, tmp_path, data_root=root).name
           for cfg in (DraftBuildConfig(), other) for root in (None, Path("/data"))]  # fmt: skip
    assert got == ["smollm2-draft-1f517bc7e1eb", "smollm2-draft-80e9286486ba", "x-ff06b5bd69fa", "x-69082383e843"]
    assert draft_dir(target, other, tmp_path, None) == tmp_path / "drafts" / "x-ff06b5bd69fa"
    assert draft_dir(target, dataclasses.replace(other, threads=1), tmp_path, None).name == "x-ff06b5bd69fa"
    monkeypatch.setattr(cache_mod, "selection_of", lambda cfg, root: ("0" * 64,))
    assert draft_dir(target, other, tmp_path, Path("/data")).name not in got


def _closed_form_lr(lr: float, steps: int, warmup: float, step: int) -> float:
    """The schedule the draft build used before torch's schedulers: linear warmup, cosine to lr/10."""
    warm = max(1, int(warmup * steps))
    if step < warm:
        return lr * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@pytest.mark.parametrize("lr,steps,warmup", [(2e-3, 300, 0.05), (1e-3, 3, 0.05), (1e-3, 25, 0.2), (5e-4, 1, 0.05),
                                             (2e-3, 1000, 0.0), (2e-3, 10, 1.0), (3e-3, 7, 0.5)])  # fmt: skip
def test_warmup_cosine_gives_the_closed_form_learning_rates(lr, steps, warmup):
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.AdamW([{"params": params[:1], "weight_decay": 0.01}, {"params": params[1:]}], lr=lr)
    schedule = warmup_cosine(opt, steps, warmup)
    for step in range(steps):
        expected = _closed_form_lr(lr, steps, warmup, step)
        for group in opt.param_groups:
            assert group["lr"] == pytest.approx(expected, rel=1e-12, abs=0), step
        opt.step()
        schedule.step()
