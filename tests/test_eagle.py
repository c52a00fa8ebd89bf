"""The EAGLE head: chain drafting matches its training-time test, the EAGLE-3 folder layout loads (and bad
folders fail with one line), a tiny pair trains and resumes in seconds, and ``sd`` over the head is lossless."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import PROMPTS, tiny_pair
from viasd.config import GenerationConfig
from viasd.distill import eagle_train
from viasd.distill.eagle_data import EagleTrainConfig, Seq
from viasd.distill.eagle_train import heldout_acceptance, train_head, ttt_logits, ttt_mask
from viasd.engine.drafters import DrafterConfig, LengthPolicy, make_drafter
from viasd.engine.eagle import HeadState, extend, feature_layers_of, propose, target_features
from viasd.engine.eagle_drafter import EagleDrafter
from viasd.engine.eagle_io import head_sha256, load_head, new_head, save_head
from viasd.errors import ConfigError
from viasd.methods.api import decode
from viasd.methods.sd import speculate
from viasd.models.tiny import build_model

TINY = dict(n_texts=6, n_heldout=2, max_prompt=48, text="prompt", data="builtin", batch=2, window=32, ttt=2, k=3,
            checkpoint_every=2, warmup=2, lr=3e-3)


def _seq(pair, text: str) -> torch.Tensor:
    return pair.encode(text)


def test_chain_drafting_is_the_training_time_test_teacher_forced():
    pair = tiny_pair("llama")
    t = pair.target
    head = new_head(t, [-1], draft_ids=torch.arange(4, 200), seed=1)
    ids = _seq(pair, PROMPTS[2])
    n_layers = t.config.num_hidden_layers
    with torch.no_grad():
        feats, logits = target_features(t, ids, feature_layers_of(head.spec, n_layers))
        greedy = logits[0].argmax(-1)
        n = ids.shape[1] - 1
        steps = ttt_logits(head, feats[:, :n], ids[:, 1:], greedy[None, :n], 3)
        for c in (3, 9):  # a chain starting at slot c (true slots 0..c)
            state = HeadState()
            fed = iter(greedy[c + 1:].tolist())  # feed the target's greedy tokens: the chain the TTT scores
            _, got = propose(head, state, feats[:, :c + 1], ids[:, 1:c + 2], 3, pick=lambda lg, fed=fed: torch.tensor(next(fed)))
            for j in range(3):
                want = torch.full_like(got[j], float("-inf"))
                want[head.target_ids] = steps[j][0, c + j]
                assert torch.allclose(got[j], want, atol=1e-4), (c, j)
        # feeding the slots in two chunks is feeding them at once
        a, b = HeadState(), HeadState()
        whole = extend(head, a, feats[:, :n], ids[:, 1:])
        parts = torch.cat([extend(head, b, feats[:, :5], ids[:, 1:6]), extend(head, b, feats[:, 5:n], ids[:, 6:])], 1)
        assert torch.allclose(whole, parts, atol=1e-5)


def test_ttt_mask_is_the_chain():
    m = ttt_mask(5, 3, torch.device("cpu"))[0, 0]
    # step 3 at slot 4: the true prefix up to slot 2, step 2's key of slot 3, its own key
    assert m[4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]
    assert ttt_mask(4, 1, torch.device("cpu"))[0, 0].tolist() == torch.ones(4, 4).tril().bool().tolist()


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_the_eagle3_layout_round_trips(tmp_path, weights):
    pair = tiny_pair("llama")
    head = new_head(pair.target, [2, 3, 4], draft_ids=torch.arange(0, 260, 2), seed=2)
    folder = save_head(head, tmp_path / "h")
    keys = set(load_file(folder / "model.safetensors"))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
            "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight"} <= keys
    assert load_file(folder / "model.safetensors")["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * 64
    if weights == "bin":  # a published head's pytorch_model.bin, read with weights_only
        torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 130 and cfg["target_hidden_size"] == 64
    got = load_head(folder, pair.target)
    ids = _seq(pair, PROMPTS[3])
    with torch.no_grad():
        f, _ = target_features(pair.target, ids, [2, 3, 4])
        a = propose(head, HeadState(), f[:, :-1], ids[:, 1:], 4)
        b = propose(got, HeadState(), f[:, :-1], ids[:, 1:], 4)
    assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1])
    assert bool((a[0] % 2 == 0).all())  # only tokens of the reduced vocabulary are ever proposed


def test_a_published_config_without_our_block_reads_eagle3_layers(tmp_path):
    pair = tiny_pair("llama")
    head = new_head(pair.target, [2, 2, 1], seed=3)
    folder = save_head(head, tmp_path / "h")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["viasd_eagle"]
    (folder / "config.json").write_text(json.dumps(cfg))
    w = load_file(folder / "model.safetensors")
    w["lm_head.weight"] = pair.target.get_output_embeddings().weight.detach().clone()
    save_file(w, str(folder / "model.safetensors"))
    got = load_head(folder, pair.target)
    assert got.spec.feature_layers == [2, 2, 1] and got.lm_head is not None  # EAGLE-3's 2, L//2, L−3 of 4 layers


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and "train_eagle" in msg
    return msg


def test_bad_head_folders_fail_with_one_line_naming_the_fix(tmp_path):
    pair = tiny_pair("llama")
    head = new_head(pair.target, [-1], draft_ids=torch.arange(0, 100), seed=4)
    good = save_head(head, tmp_path / "good")
    with pytest.raises(ConfigError) as e:
        load_head(tmp_path / "nowhere", pair.target)
    assert "no such head folder" in _one_line(e)
    # a missing and a truncated weight file
    missing = save_head(head, tmp_path / "missing")
    (missing / "model.safetensors").unlink()
    with pytest.raises(ConfigError) as e:
        load_head(missing, pair.target)
    assert "no head weights" in _one_line(e)
    cut = save_head(head, tmp_path / "cut")
    raw = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ConfigError) as e:
        load_head(cut, pair.target)
    assert "truncated" in _one_line(e)
    cutbin = save_head(head, tmp_path / "cutbin")
    torch.save(load_file(cutbin / "model.safetensors"), cutbin / "pytorch_model.bin")
    (cutbin / "model.safetensors").unlink()
    raw = (cutbin / "pytorch_model.bin").read_bytes()
    (cutbin / "pytorch_model.bin").write_bytes(raw[: len(raw) // 3])
    with pytest.raises(ConfigError) as e:
        load_head(cutbin, pair.target)
    assert "truncated" in _one_line(e)
    # a head for another target: another hidden size, another vocabulary, another target of the same shape
    wide = build_model("llama", 4, 32, 260, seed=0)
    with pytest.raises(ConfigError) as e:
        load_head(good, wide)
    assert "hidden size" in _one_line(e)
    other_vocab = build_model("llama", 4, 64, 300, seed=0)
    with pytest.raises(ConfigError) as e:
        load_head(good, other_vocab)
    assert "vocabulary" in _one_line(e)
    with pytest.raises(ConfigError) as e:
        load_head(good, build_model("llama", 4, 64, 260, seed=7))
    assert "another target" in _one_line(e)
    # a vocabulary map that does not fit the target
    for name, edit in {"d2t": lambda w: w["d2t"].fill_(500), "t2d": lambda w: w["t2d"].zero_()}.items():
        bad = save_head(head, tmp_path / f"bad_{name}")
        w = load_file(bad / "model.safetensors")
        edit(w)
        save_file(w, str(bad / "model.safetensors"))
        with pytest.raises(ConfigError) as e:
            load_head(bad, pair.target)
        assert "vocabulary map" in _one_line(e)
    assert load_head(good, pair.target) is not None


def test_a_tiny_pair_trains_resumes_and_records_its_hash(tmp_path, monkeypatch):
    pair = tiny_pair("llama")
    cfg = EagleTrainConfig(max_steps=6, draft_vocab=128, **TINY)
    info = train_head(pair.target, pair.tokenizer, cfg, tmp_path / "a", cache_root=tmp_path / "cache", progress=False,
                      log=lambda *_: None)
    assert info["sha256"] == head_sha256(tmp_path / "a") and info["steps"] == 6
    assert info["heldout"]["chains"] > 0 and len(info["heldout"]["alpha"]) == 3
    assert not (tmp_path / "a.partial").exists()
    # killed after 3 steps (checkpoint at 2), rerun: resumes at step 2 and ends with the same head
    calls = {"n": 0}
    real = eagle_train.ttt_loss

    def dies(*a, **k):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(eagle_train, "ttt_loss", dies)
    with pytest.raises(KeyboardInterrupt):
        train_head(pair.target, pair.tokenizer, cfg, tmp_path / "b", cache_root=tmp_path / "cache", progress=False)
    monkeypatch.setattr(eagle_train, "ttt_loss", real)
    said = []
    again = train_head(pair.target, pair.tokenizer, cfg, tmp_path / "b", cache_root=tmp_path / "cache",
                       progress=False, log=said.append)
    assert any("resumed" in s and "step 2" in s for s in said)
    assert again["features_cached"] and again["sha256"] == info["sha256"]


def test_training_raises_held_out_acceptance(tmp_path):
    pair = tiny_pair("llama")
    cfg = EagleTrainConfig(max_steps=40, **{**TINY, "checkpoint_every": 100})
    info = train_head(pair.target, pair.tokenizer, cfg, tmp_path / "h", cache_root=tmp_path / "cache", progress=False)
    assert info["heldout"]["alpha"][0] > info["heldout_at_init"]["alpha"][0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pair = tiny_pair("llama")
    out = tmp_path_factory.mktemp("eagle") / "head"
    cfg = EagleTrainConfig(max_steps=30, **{**TINY, "checkpoint_every": 100})
    train_head(pair.target, pair.tokenizer, cfg, out, cache_root=out.parent / "cache", progress=False)
    return pair, out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sd_over_the_head_is_lossless(trained, temperature):
    pair, folder = trained
    gen = GenerationConfig(max_new_tokens=24, ignore_eos=True, temperature=temperature)
    head = load_head(folder, pair.target)
    for text in PROMPTS[1:4]:
        ids = _seq(pair, text)
        res = speculate(pair, ids, EagleDrafter(head, 4), LengthPolicy("constant", 4), gen,
                        torch.Generator().manual_seed(0), "sd", time.perf_counter())
        assert len(res.tokens) == 24 and res.counters.drafted > 0
        if temperature == 0:
            assert res.tokens == decode(pair, ids, "ar", gen=gen).tokens


def test_the_drafter_registry_builds_it_and_refuses_what_it_cannot_serve(trained, tmp_path):
    pair, folder = trained
    ids = _seq(pair, PROMPTS[1])
    cfg = DrafterConfig(name="eagle")
    with pytest.raises(ConfigError, match="drafter.path"):
        make_drafter(pair, ids, cfg)
    cfg.path = str(folder)
    assert isinstance(make_drafter(pair, ids, cfg), EagleDrafter)
    multi = save_head(new_head(pair.target, [2, 3, 4]), tmp_path / "multi")
    with pytest.raises(ConfigError, match="features=last"):
        EagleDrafter(load_head(multi, pair.target), 4)


def test_held_out_acceptance_counts_chains():
    pair = tiny_pair("llama")
    head = new_head(pair.target, [-1], seed=5)
    ids = _seq(pair, PROMPTS[7])
    with torch.no_grad():
        f, lg = target_features(pair.target, ids, [4])
    seq = Seq(ids[0], f[0], lg[0].argmax(-1))
    acc = heldout_acceptance(head, [seq], 3)
    assert acc["chains"] == ids.shape[1] - 1 and 0 <= acc["accepted_per_draft"] <= 3
    assert acc["p_reach"][0] >= acc["p_reach"][1] >= acc["p_reach"][2]


def test_the_head_enters_the_run_identity_and_other_runs_keep_theirs(trained):
    from omegaconf import OmegaConf

    from viasd.harness.config import drop_unset
    from viasd.harness.identity import input_files

    _, folder = trained
    files = input_files(OmegaConf.create({"method": {"name": "sd", "drafter": {"name": "eagle", "path": str(folder)}}}))
    assert files["method.drafter.path"] == folder.resolve() / "model.safetensors"
    assert drop_unset({"method": {"drafter": {"name": "model", "path": None}}}) == {"method": {"drafter": {"name": "model"}}}


def test_sampling_sd_over_a_reduced_vocabulary_head_follows_the_target():
    """Chi-square of the first two sampled tokens against the target's exact joint; the head proposes only
    4 of the 6 tokens (the others come from the residual), so a wrong ``p`` or map would show."""
    from tests.helpers.sampling import P_THRESHOLD, chi_square_pvalue, exact_joint, tiny_vocab_pair

    pair = tiny_vocab_pair()
    ids = torch.tensor([[0, 3, 1, 3, 1]])
    gen = GenerationConfig(max_new_tokens=2, ignore_eos=True, temperature=1.0)
    exact = exact_joint(pair, ids, gen, 2)
    head = new_head(pair.target, [-1], draft_ids=torch.tensor([0, 2, 3, 5]), seed=0)
    counts: dict = {}
    accepted = 0
    for seed in range(200):
        res = speculate(pair, ids, EagleDrafter(head, 2), LengthPolicy("constant", 2), gen,
                        torch.Generator().manual_seed(seed), "sd", time.perf_counter())
        key = tuple(res.tokens[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += res.counters.accepted
    p = chi_square_pvalue(counts, exact)
    assert p > P_THRESHOLD, f"sd over the EAGLE head samples another distribution (p={p:.2e})"
    assert accepted > 0


def test_the_drafter_forgets_a_rewritten_suffix():
    """A sequence that shrank and regrew differently drafts what a fresh drafter over it drafts."""
    from viasd.engine.drafters import Features

    pair = tiny_pair("llama")
    head = new_head(pair.target, [-1], seed=6)
    gen = GenerationConfig(max_new_tokens=8)
    a = _seq(pair, PROMPTS[7])
    b = torch.cat([a[:, :-4], torch.tensor([[70, 71]])], 1)
    with torch.no_grad():
        fa, _ = target_features(pair.target, a, [4])
        fb, _ = target_features(pair.target, b, [4])
    used = EagleDrafter(head, 4)
    used.propose(a, 3, gen, None, host=a[0].tolist(), features=Features(fa, 0))
    got = used.propose(b, 3, gen, None, host=b[0].tolist(), features=Features(fb[:, a.shape[1] - 5:], a.shape[1] - 5))
    fresh = EagleDrafter(head, 4).propose(b, 3, gen, None, host=b[0].tolist(), features=Features(fb, 0))
    assert torch.equal(got.tokens, fresh.tokens) and torch.allclose(got.logits, fresh.logits, atol=1e-4)
    shrunk = used.propose(b[:, :-1], 3, gen, None, host=b[0, :-1].tolist())  # no new features: still drafts
    assert len(shrunk) == 3


@pytest.mark.parametrize("argv, says", [(["pair=tiny-llama"], "out=<folder>"),
                                        (["pair=tiny-llama", "out=/tmp/x", "text=poem"], "text must be"),
                                        (["pair=tiny-llama", "out=/tmp/x", "max_stpes=3"], "max_stpes")])
def test_the_command_refuses_bad_arguments_in_one_line(argv, says, capsys):
    from experiments.train_eagle import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error:") and says in err and "\n" not in err


@pytest.mark.parametrize("policy", [LengthPolicy("heuristic", 2), LengthPolicy("confidence", 4, min_confidence=0.3)])
def test_length_policies_over_the_head_stay_lossless(trained, policy):
    pair, folder = trained
    gen = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    ids = _seq(pair, PROMPTS[5])
    res = speculate(pair, ids, EagleDrafter(load_head(folder, pair.target), 4), policy, gen, None, "sd",
                    time.perf_counter())
    assert res.tokens == decode(pair, ids, "ar", gen=gen).tokens


@pytest.mark.parametrize("family", ["qwen2", "mistral", "qwen3", "gemma2", "gemma3", "phi3"])
def test_greedy_sd_over_a_head_is_the_targets_output_on_every_decoder_family(family, tmp_path):
    from viasd.models.pairs import ModelPair
    from viasd.models.tiny import build_tiny_pair

    draft, target, tok = build_tiny_pair(family)
    pair = ModelPair(f"tiny-{family}", target=target, draft=draft, tokenizer=tok)
    n_layers = pair.target.config.num_hidden_layers
    head = load_head(save_head(new_head(pair.target, [-1], draft_ids=torch.arange(4, 180), seed=1), tmp_path / "h"),
                     pair.target)
    gen = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    ids = _seq(pair, PROMPTS[2])
    res = speculate(pair, ids, EagleDrafter(head, n_layers), LengthPolicy("constant", 3), gen, None, "sd",
                    time.perf_counter())
    assert res.tokens == decode(pair, ids, "ar", gen=gen).tokens and res.counters.drafted > 0
