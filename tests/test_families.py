"""Every supported decoder family: routing is exact and lossless methods match ``model.generate``.

Tiny random models from config (fp32, CPU) of each family in :data:`viasd.models.tiny.FAMILIES`
— Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3 (text), Phi-3 and T5's decoder: the full routing
plan reproduces the model's own forward bit for bit, a subset plan equals a physically pruned
copy, and ``sd``, ``viasd`` (taus > 1: every round escalates) and ``cascade_sd`` greedy equal
``ar`` and ``model.generate``. Each family saved to a folder runs through ``pair=hf``. The
supported-families list of docs/models.md ("Supported families") is this matrix.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from hydra import compose, initialize_config_dir

from tests.helpers.routing import feed, physically_pruned
from viasd.engine.routing import RoutingPlan, check_routable, num_layers
from viasd.engine.stream import Stream, start_sequence
from viasd.errors import ConfigError
from viasd.harness.runner import run
from viasd.methods.api import decode
from viasd.models.pairs import ModelPair, load_pair
from viasd.models.tiny import FAMILIES, build_tiny_pair
from viasd.paths import PROJECT_ROOT

LONG = "Long prompt: " + "lorem ipsum dolor sit amet " * 6  # longer than the 32-token sliding windows
PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 2, "Q: What is 12 times 7?\nA:"]
_PAIRS: dict[str, ModelPair] = {}


def family_pair(family: str) -> ModelPair:
    """A session-cached tiny pair (1-layer draft inside a 4-layer target) of ``family``."""
    if family not in _PAIRS:
        draft, target, tok = build_tiny_pair(family)
        _PAIRS[family] = ModelPair(name=f"tiny-{family}", target=target, draft=draft, tokenizer=tok)
    return _PAIRS[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_routing_full_plan_is_the_model_and_subset_is_a_pruned_copy(family):
    pair = family_pair(family)
    m, n = pair.target, num_layers(pair.target)
    ids = pair.encode(LONG)
    seq = torch.cat([start_sequence(m, ids), torch.randint(5, 200, (1, 9))], 1)
    own = feed(Stream(m, ids, "t"), seq, [3, 1, 5])
    assert torch.equal(own, feed(Stream(m, ids, "s", RoutingPlan.build(range(n), n)), seq, [3, 1, 5]))
    for kept in ([0, 2], [0, 1, 3]):
        routed = feed(Stream(m, ids, "slim", RoutingPlan.build(kept, n)), seq, [4, 1, 4])
        pruned = feed(Stream(physically_pruned(m, kept), ids, "ref"), seq, [4, 1, 4])
        torch.testing.assert_close(routed, pruned, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_lossless_methods_equal_generate(family):
    pair = family_pair(family)
    gen = {"max_new_tokens": 14, "ignore_eos": True}
    methods = [("sd", {"gamma": 3}), ("sd", {"gamma": 2, "drafter": {"name": "self", "layers": [0, 2]}}),
               ("viasd", {"tau_accept": 1.5, "tau_slim": 1.5, "slim": {"mask": [0, 1, 3]}}), ("cascade_sd", {})]
    for prompt in PROMPTS:
        ids = pair.encode(prompt)
        out = pair.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=14, min_new_tokens=14, pad_token_id=0)
        ref = out[0, 1 if pair.is_encoder_decoder else ids.shape[1]:].tolist()
        assert decode(pair, ids, "ar", gen=gen).tokens == ref, (family, "ar")
        for method, cfg in methods:
            assert decode(pair, ids, method, cfg, gen=gen).tokens == ref, (family, method, cfg)


def test_unroutable_family_is_one_clear_error():
    cfg = transformers.GraniteConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, logits_scaling=4.0)
    model = transformers.GraniteForCausalLM(cfg).eval()
    with pytest.raises(ConfigError, match=r"does not support GraniteForCausalLM \(model_type='granite'\).*logits_scaling"):
        check_routable(model)


def test_cascade_sd_without_draft_names_the_levels_fix():
    pair = family_pair("llama")
    nodraft = ModelPair(name="nodraft", target=pair.target, draft=None, tokenizer=pair.tokenizer)
    with pytest.raises(ConfigError, match="method.levels="):
        decode(nodraft, PROMPTS[0], "cascade_sd", {}, gen={"max_new_tokens": 4})
    levels = [{"name": "self", "tokens": 3, "vertical": ["ngram"], "vertical_tokens": [2]},
              {"name": "ngram", "tokens": 2, "vertical": [], "vertical_tokens": []}]
    gen = {"max_new_tokens": 10, "ignore_eos": True}
    assert decode(nodraft, PROMPTS[0], "cascade_sd", {"levels": levels}, gen=gen).tokens == \
        decode(nodraft, PROMPTS[0], "ar", gen=gen).tokens


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each family's tiny target and draft saved with save_pretrained (+ tokenizer)."""
    root = tmp_path_factory.mktemp("families")
    for family in FAMILIES:
        pair = family_pair(family)
        for role, model in (("target", pair.target), ("draft", pair.draft)):
            model.save_pretrained(root / family / role)
            pair.tokenizer.save_pretrained(root / family / role)
    return root


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("family", FAMILIES)
def test_pair_hf_runs_a_saved_folder(family, saved, runs_dir):
    target = saved / family / "target"
    common = ["pair=hf", f"pair.target.id={target}", "task.n_examples=2", "generation.max_new_tokens=6"]
    s = run(_cfg(*common, "method=sd_ngram"))
    assert s["n_examples"] == 2 and s["pair"].startswith("hf")
    assert run(_cfg(*common, "method=viasd", "method.drafter.name=ngram", "method.slim.mask=every_other"))["n_examples"]
    pair = load_pair({"name": "hf", "loader": "hf", "target": {"id": str(target)},
                      "draft": {"id": str(saved / family / "draft")}})
    assert pair.name == "hf-target" and num_layers(pair.target) == 4 and num_layers(pair.draft) == 1


def test_pair_hf_bad_sources_are_one_line(saved, tmp_path):
    with pytest.raises(ConfigError, match="folder not found"):
        load_pair({"name": "hf", "loader": "hf", "target": {"id": str(tmp_path / "missing")}})
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in (saved / "llama" / "target").iterdir():
        data = f.read_bytes()
        (broken / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".safetensors" else data)
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        load_pair({"name": "hf", "loader": "hf", "target": {"id": str(broken)}})
    with pytest.raises(ConfigError, match="use pair=hf pair.target.id="):
        load_pair({"name": "smollm2", "loader": "smollm2", "target": {"id": str(saved / "llama" / "target")}})
    # Tokenizers are compared, not embedding rows: a different vocabulary is refused ...
    other = transformers.AutoTokenizer.from_pretrained(saved / "llama" / "draft")
    other.add_tokens(["<extra-token>"])
    other.save_pretrained(saved / "llama" / "draft")
    try:
        with pytest.raises(ConfigError, match="different tokenizers"):
            load_pair({"name": "hf", "loader": "hf", "target": {"id": str(saved / "llama" / "target")},
                       "draft": {"id": str(saved / "llama" / "draft")}})
    finally:
        family_pair("llama").tokenizer.save_pretrained(saved / "llama" / "draft")


def test_same_tokenizer_different_head_rows_is_widened(tmp_path):
    """Like Qwen2.5 0.5B vs 7B: one tokenizer, padded embeddings of different sizes."""
    draft, target, tok = build_tiny_pair("qwen2")
    target.resize_token_embeddings(len(tok) + 12)
    target.save_pretrained(tmp_path / "t")
    draft.save_pretrained(tmp_path / "d")
    for d in ("t", "d"):
        tok.save_pretrained(tmp_path / d)
    pair = load_pair({"name": "hf", "loader": "hf", "target": {"id": str(tmp_path / "t")},
                      "draft": {"id": str(tmp_path / "d")}})
    gen = {"max_new_tokens": 10, "ignore_eos": True}
    assert decode(pair, PROMPTS[0], "sd", {"gamma": 3}, gen=gen).tokens == decode(pair, PROMPTS[0], "ar", gen=gen).tokens


def test_an_intermediate_that_is_the_draft_is_loaded_once(saved):
    """The slim-verifier ablation's independent verifier may be the pair's own draft (a model-free
    drafter proposes): one module, not a second copy in memory; the dry run counts it once."""
    draft = {"id": str(saved / "llama" / "draft")}
    pair = load_pair({"name": "hf", "loader": "hf", "target": {"id": str(saved / "llama" / "target")},
                      "draft": draft, "intermediate": dict(draft)})
    assert pair.intermediate is pair.draft
    gen = {"max_new_tokens": 8, "ignore_eos": True}
    out = decode(pair, PROMPTS[0], "via_sd", {"drafter": {"name": "ngram"}, "slim": {"mask": "independent"},
                                              "tau_accept": 1.1, "tau_slim": 1.1}, gen=gen)
    assert out.tokens == decode(pair, PROMPTS[0], "ar", gen=gen).tokens
    other = load_pair({"name": "hf", "loader": "hf", "target": {"id": str(saved / "llama" / "target")},
                       "draft": draft, "intermediate": {**draft, "dtype": "bfloat16"}})
    assert other.intermediate is not other.draft
