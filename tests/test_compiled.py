"""The compiled decode path (``+pair.compile=true``): static KV cache + ``torch.compile`` of the forward,
token-for-token equal to eager on CPU (``aot_eager`` here: it traces the same graph without generating
code; the ``inductor`` test is slow), rolling back by moving the cache's write position."""

from __future__ import annotations

import pytest

from tests.conftest import PROMPTS, tiny_pair
from viasd.errors import ConfigError
from viasd.harness.grid import compose_cells
from viasd.harness.identity import identity
from viasd.methods.api import decode
from viasd.models.pairs import load_pair

GEN = {"max_new_tokens": 20, "ignore_eos": True}
METHODS = (("ar", None), ("sd", {"gamma": 3}), ("sd", {"gamma": 2, "drafter": {"name": "ngram"}}), ("cascade_sd", None))


def equal_to_eager(backend: str) -> None:
    eager = tiny_pair("llama")
    comp = load_pair("tiny-llama", compile=True, compile_backend=backend)
    assert comp.extras["runtime"]["compile"] == backend and comp.extras["runtime"]["backend"] == "eager"
    for prompt in (PROMPTS[0], PROMPTS[2]):
        ids = eager.encode(prompt)
        for method, cfg in METHODS:
            ref = decode(eager, ids, method, cfg, gen=GEN)
            res = decode(comp, ids, method, cfg, gen=GEN)
            assert res.tokens == ref.tokens, (backend, method, cfg, prompt)
            assert res.models["target"].tokens == ref.models["target"].tokens  # same rollbacks, same work


def test_compiled_decode_equals_eager():
    equal_to_eager("aot_eager")


@pytest.mark.slow
def test_inductor_compiled_decode_equals_eager():
    equal_to_eager("inductor")  # ~2 min of compilation on a shared 2-core box


def test_compile_refuses_what_it_cannot_serve():
    comp = load_pair("tiny-llama", compile=True, compile_backend="aot_eager")
    ids = comp.encode(PROMPTS[0])
    with pytest.raises(ConfigError, match=r"\+pair\.compile=true runs the model's own forward; the slim stream"):
        decode(comp, ids, "via_sd", {"slim": {"mask": "every_other"}}, gen=GEN)
    with pytest.raises(ConfigError, match="encoder-decoder"):
        load_pair("tiny-t5", compile=True)
    with pytest.raises(ConfigError, match="sliding-window"):
        load_pair("tiny-gemma2", compile=True)
    with pytest.raises(ConfigError, match="pair.backend=eager"):
        load_pair("tiny-llama", compile=True, backend="packed")


def test_a_compiled_model_keeps_one_static_cache():
    """A new stream takes the model's static cache over; the older stream refuses to run on it."""
    from viasd.engine.stream import Stream

    comp = load_pair("tiny-llama", compile=True, compile_backend="aot_eager")
    ids = comp.encode(PROMPTS[1])
    old = Stream(comp.target, ids, "old")
    old.logits(ids)
    Stream(comp.target, ids, "new").logits(ids)
    with pytest.raises(ConfigError, match="two streams of one compiled model"):
        old.logits(comp.encode(PROMPTS[1] + " more"))


def test_compile_enters_the_run_id_only_when_set():
    plain, = compose_cells(["pair=tiny-llama", "task=prompts", "method=ar"])
    compiled, = compose_cells(["pair=tiny-llama", "task=prompts", "method=ar", "+pair.compile=true"])
    assert "compile" not in identity(plain)["pair"] and identity(compiled)["pair"]["compile"] is True
