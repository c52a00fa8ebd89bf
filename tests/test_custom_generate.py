"""transformers' ``generate(custom_generate=<viasd checkout>)`` decodes with viasd's methods.

Lossless methods return transformers' own greedy ``generate`` output token for token on tiny random
models of every decoder family (transformers 5.24); knobs pass through; bad input is one line.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import viasd
from viasd.errors import ConfigError
from viasd.models.tiny import FAMILIES, build_tiny_pair
from viasd.paths import PROJECT_ROOT

ROOT = str(PROJECT_ROOT)  # holds custom_generate/generate.py, the layout transformers loads
LOSSLESS = ("ar", "sd", "cascade_sd", "hf_assisted", "sd_ngram")


@pytest.fixture(scope="module")
def llama():
    return build_tiny_pair("llama")


def _gen(target, enc, **kw):
    return target.generate(**enc, custom_generate=ROOT, trust_remote_code=True, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_lossless_methods_return_transformers_greedy_output(family):
    draft, target, tok = build_tiny_pair(family)
    enc = tok("Hello there, world", return_tensors="pt")
    ref = target.generate(**enc, do_sample=False, max_new_tokens=14)
    for method in LOSSLESS:
        out = _gen(target, enc, assistant_model=draft, tokenizer=tok, viasd_method=method, max_new_tokens=14,
                   return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref), (family, method)
    plain = _gen(target, enc, assistant_model=draft, viasd_method="sd", viasd_gamma=2, max_new_tokens=14)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, ref)  # no tokenizer: ids in, ids out
    kind = (transformers.generation.utils.GenerateEncoderDecoderOutput if family == "t5"
            else transformers.generation.utils.GenerateDecoderOnlyOutput)
    assert isinstance(out, kind)


def test_knobs_and_mask_file_pass_through(llama, tmp_path):
    draft, target, tok = llama
    enc = tok("The river flows", return_tensors="pt")
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"layers": [0, 2], "n_layers": 4}))
    out = _gen(target, enc, assistant_model=draft, tokenizer=tok, viasd_method="via_sd", viasd_mask=str(mask),
               viasd_tau_accept=0.9, viasd_gamma=3, max_new_tokens=16)
    pair = viasd.pair_from_models(target, tok, draft)
    ref = viasd.generate(pair, enc.input_ids, "via_sd", slim={"mask": str(mask)}, tau_accept=0.9, gamma=3,
                         max_new_tokens=16)
    assert out[0, enc.input_ids.shape[1]:].tolist() == ref.tokens
    lookup = _gen(target, enc, tokenizer=tok, viasd_method="sd", viasd_drafter={"name": "ngram"}, max_new_tokens=16)
    assert torch.equal(lookup, target.generate(**enc, do_sample=False, max_new_tokens=16))  # no draft model needed


@pytest.mark.parametrize("kw,needle", [
    ({"viasd_method": "sd"}, "pass assistant_model="),
    ({"viasd_method": "sd", "viasd_gama": 3, "assistant_model": "draft"}, "unknown knob 'gama' for method 'sd'"),
    ({"viasd_method": "sd", "num_beams": 2, "assistant_model": "draft"}, "drop num_beams"),
    ({"viasd_method": "sd", "output_scores": True, "assistant_model": "draft"}, "'output_scores' is not supported"),
    ({"viasd_method": "sd", "batch": 2, "assistant_model": "draft"}, "batch size is 1"),
])
def test_bad_input_is_one_line(llama, kw, needle):
    draft, target, tok = llama
    kw = dict(kw)
    if kw.get("assistant_model") == "draft":
        kw["assistant_model"] = draft
    texts = ["ab", "cd"] if kw.pop("batch", 1) == 2 else ["ab"]
    enc = tok(texts, return_tensors="pt")
    with pytest.raises(ConfigError) as e:
        _gen(target, enc, max_new_tokens=4, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bench_section_compares_custom_generate_with_greedy_generate(tmp_path):
    """``experiments.bench --custom-generate`` on a tiny pair: its table and JSON (structure only, no timing)."""
    import os
    import subprocess
    import sys

    out = tmp_path / "cg.json"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-m", "experiments.bench", "--custom-generate", "pair=tiny-llama", "n_prompts=2",
                        "max_new_tokens=6", "custom_generate_opts.prompts=builtin", f"custom_generate_opts.out={out}"],
                       cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| variant | equal_to_greedy | new_tokens | wall_s | tokens_per_s | speedup_vs_generate |" in r.stdout
    data = json.loads(out.read_text())
    rows = {row["variant"]: row for row in data["rows"]}
    assert list(rows) == ["generate (greedy)", "ar", "sd", "cascade_sd", "sd_ngram"]
    for name, row in rows.items():  # lossless: every prompt equals transformers' greedy output
        assert row["equal_to_greedy"] == "2/2" and row["new_tokens"] == 2 * 6, (name, row)
        assert row["tokens_per_s"] > 0 and row["speedup_vs_generate"] > 0, (name, row)
    assert rows["generate (greedy)"]["speedup_vs_generate"] == 1.0
    assert len(data["meta"]["per_prompt"]) == 2 * 5 and data["meta"]["threads"] == 1
    assert data["meta"]["prompts"] == "builtin" and data["meta"]["transformers"] == transformers.__version__
