"""``experiments.cost roofline``: a GPU's cost file from the pair's shapes and the card's peaks (a model).

The shapes reproduce the published parameter counts, the roofline is memory-bound at decode sizes and
compute-bound at prefill sizes, the file is the one cost format (``CostModel.load`` prices with it, a replay
takes it), and bad input is one line.
"""

from __future__ import annotations

import json

import pytest

import viasd
from experiments.cost import main as cost_main
from tests.conftest import tiny_pair
from viasd.analysis.cost import CostModel
from viasd.analysis.roofline import GPUS, OVERHEADS, forward_ms, price_runs, shape_of
from viasd.harness.model_sizes import KNOWN_PARAMS
from viasd.models.index_specs import index_model
from viasd.tracking.store import RunStores

PAIR = "qwen2.5-coder-0.5b-1.5b"
NO_OVERHEAD = {m: {"base_us": 0.0, "per_layer_us": 0.0} for m in OVERHEADS}


@pytest.fixture(scope="module")
def h100(tmp_path_factory):
    out = tmp_path_factory.mktemp("roofline") / "h100.json"
    assert cost_main(["roofline", "gpu=h100", f"pair={PAIR}", f"out={out}"]) == 0
    return out


def test_shapes_reproduce_published_parameter_counts():
    for model_id in ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "google/gemma-2-9b-it"):
        assert shape_of(model_id).params == KNOWN_PARAMS[model_id]
    for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):  # untied GGUF head: + V·H
        s, spec = shape_of(name), index_model(name)
        assert (s.layers, s.head_params) == (spec.num_layers, spec.vocab_size * spec.hidden_size)
        assert s.params + s.head_params == KNOWN_PARAMS[f"{spec.hub_id} (GGUF)"]


def test_memory_bound_decode_and_compute_bound_prefill():
    s, card = shape_of("Qwen/Qwen2.5-7B-Instruct"), GPUS["h100"]
    weights = s.layers * s.layer_params + s.head_params
    t1 = forward_ms(s, card, 1, 0, overheads=NO_OVERHEAD)
    assert t1 == pytest.approx(1e3 * 2 * (weights + s.layers * s.kv_width) / 3350e9)  # ~4.5 ms: bytes / bandwidth
    assert forward_ms(s, card, 8, 0, overheads=NO_OVERHEAD) == pytest.approx(t1, rel=1e-3)  # a block costs a token
    big = forward_ms(s, card, 4096, 0, overheads=NO_OVERHEAD)
    assert big > 1e3 * 2 * 4096 * weights / 989.4e12  # prefill: flops / peak (plus attention)
    assert forward_ms(s, GPUS["h200"], 1, 0, overheads=NO_OVERHEAD) == pytest.approx(t1 * 3350 / 4800)
    assert forward_ms(s, card, 1, 0, overhead="graph") < forward_ms(s, card, 1, 0, overhead="eager")


def test_cost_file_is_the_one_format_and_prices_replays(h100):
    doc = json.loads(h100.read_text())
    assert doc["schema"] == "viasd.cost/v1" and "roofline model, not measured" in doc["device"]
    assert doc["roofline"]["measured"] is False and doc["pairs"][PAIR]["target"] == "qwen2.5-coder-1.5b-instruct"
    cost = CostModel.load(h100, PAIR)
    s = shape_of("qwen2.5-coder-1.5b-instruct")
    assert cost.price("target", 5, 1024) == pytest.approx(forward_ms(s, GPUS["h100"], 5, 1024) / 1e3)
    assert cost.price("target", 5, 1024, layers=14) < cost.price("target", 5, 1024)  # a slim pass: fewer layers
    p = tiny_pair("llama")  # a trace of any pair prices with the file's costs per call
    pair = viasd.pair_from_models(p.target, p.tokenizer, p.draft)
    prompts = ["The river flows", "Count: one, two"]
    traces = viasd.trace(pair, prompts, [viasd.generate(pair, t, "ar", max_new_tokens=12) for t in prompts])
    ar = viasd.replay_policy(traces, "ar", cost=cost)
    sd = viasd.replay_policy(traces, "sd", gamma=4, cost=cost)
    assert ar["predicted_s"] > 0 and sd["predicted_s"] > 0 and sd["new_tokens"] == ar["new_tokens"]


def test_decoded_runs_priced_beside_their_cpu_prices(h100):
    run = "qwen2.5-coder-0.5b-1.5b__sd__humaneval__f104a022e1"  # the verdict's sd cell (committed)
    stores = RunStores.default()
    if stores.find(run) is None:
        pytest.skip("the committed verdict run is not in the results store")
    (row,) = price_runs(stores, PAIR, h100, [run])
    assert row["cpu_model"] == pytest.approx(1.67, abs=0.01)  # the verdict table's predicted speedup
    assert 0.5 < row["roofline"] < row["cpu_model"]  # on the card the 0.5B draft is not 1/3 of the target


@pytest.mark.parametrize("args,needle", [
    (["gpu=h900", f"pair={PAIR}", "out=x.json"], "unknown gpu 'h900'; use one of h100, h200, a100"),
    ([f"pair={PAIR}", "out=x.json"], "gpu, pair and out are needed"),
    (["gpu=h100", "pair=tiny-llama", "out=x.json"], "names no model architectures"),
    (["gpu=h100", "pair=llama2-7b-70b", "out=x.json"], "does not fit one NVIDIA H100 SXM5 80GB"),
    (["gpu=h100", f"pair={PAIR}", "out=x.json", "eager_layer_us=fast"], "must be numbers"),
])
def test_bad_input_is_one_line(args, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cost_main(["roofline", *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error:") and needle in err and "\n" not in err
