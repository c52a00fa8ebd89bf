"""Bad input gets one clear error naming the fix."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_pair
from viasd.errors import ConfigError, RunInterrupted, one_line_errors
from viasd.methods.api import METHODS, decode
from viasd.models.pairs import ModelPair, load_pair
from viasd.models.tiny import build_model
from viasd.registry import Registry


def test_registry_duplicate_and_suggestion():
    reg: Registry = Registry("widget")
    reg.register("alpha")(1)
    with pytest.raises(ValueError, match="duplicate widget name 'alpha'"):
        reg.register("alpha")(2)
    with pytest.raises(ConfigError, match=r"unknown widget 'alpah'\. Did you mean 'alpha'\?"):
        reg.get("alpah")


def test_unknown_method_lists_known_names():
    pair = tiny_pair("llama")
    with pytest.raises(ConfigError) as e:
        decode(pair, "hello", "sdd")
    msg = str(e.value)
    assert "Did you mean 'sd'" in msg and all(n in msg for n in ("ar", "hf_assisted"))
    assert set(METHODS.names()) >= {"ar", "sd", "hf_assisted"}


def test_unknown_pair():
    with pytest.raises(ConfigError, match="Did you mean 'tiny-llama'"):
        load_pair("tiny-lama")


def test_vocab_mismatch_names_both_models():
    base = tiny_pair("llama")
    other = build_model("llama", 1, 32, vocab=300)
    other.config._name_or_path = "my-draft"
    base.target.config._name_or_path = "my-target"
    pair = ModelPair("bad", target=base.target, draft=other, tokenizer=base.tokenizer)
    from viasd.models.pairs import check_vocab

    with pytest.raises(ConfigError, match="vocabulary mismatch: draft model my-draft has 300 .* target my-target has 260"):
        check_vocab(pair)


@pytest.mark.parametrize("kwargs,match", [
    ({"method": "sd", "method_cfg": {"gamma": 0}}, "gamma must be >= 1"),
    ({"gen": {"temperature": -0.5}}, "temperature must be >= 0"),
    ({"gen": {"max_new_tokens": 0}}, "max_new_tokens must be >= 1"),
    ({"gen": {"top_p": 0}}, "top_p must be in"),
    ({"method": "sd", "method_cfg": {"gamma": 2, "bogus": 1}}, "unknown SDConfig keys"),
    ({"method": "sd", "method_cfg": {"drafter": {"name": "eagle9"}}}, "unknown drafter 'eagle9'"),
    ({"method": "sd", "method_cfg": {"drafter": {"length_policy": "fast"}}}, "unknown draft length policy"),
])
def test_bad_knobs(kwargs, match):
    pair = tiny_pair("llama")
    with pytest.raises(ConfigError, match=match):
        decode(pair, "hello", **kwargs)


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt(prompt):
    with pytest.raises(ConfigError, match="empty prompt"):
        decode(tiny_pair("llama"), prompt, "ar")


def test_unknown_dtype():
    with pytest.raises(ConfigError, match="unknown dtype 'float8'"):
        load_pair("tiny-llama", dtype="float8")


@pytest.mark.parametrize("exc,code,line", [
    (ConfigError("set method.gamma"), 2, "error: set method.gamma"),
    (KeyboardInterrupt(), 130, "interrupted: nothing was marked finished"),
    (RunInterrupted("/runs/x"), 130, "interrupted: partial run left at /runs/x, not marked finished"),
])
def test_entry_points_end_in_one_line(exc, code, line, capsys):
    """search / kl / bench wrap their body in one_line_errors: one stderr line, no traceback."""
    with pytest.raises(SystemExit) as e, one_line_errors():
        raise exc
    assert e.value.code == code
    assert capsys.readouterr().err.strip().splitlines() == [line]
