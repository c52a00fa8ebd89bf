"""Host syncs per round: the decoding loops read the device once per round (greedy, tiny model).

On this CPU-only machine :class:`HostSyncs` counts every read of a tensor (each would be a sync
with the pair on a GPU), so the bounds below are the ones a GPU run has.
"""

from __future__ import annotations

import torch

from tests.conftest import tiny_pair
from viasd.config import GenerationConfig
from viasd.engine.stream import Stream
from viasd.engine.syncs import HostSyncs, host_copy, host_values, to_host
from viasd.harness.bench import Variant
from viasd.harness.host_syncs import add_host_syncs, host_sync_rows
from viasd.methods.api import decode

GEN = {"max_new_tokens": 24, "ignore_eos": True}
SETUP = 2  # reads once per decode: the prompt's tokens, a lookup drafter's context


def counted(pair, method, cfg=None, gen=GEN):
    ids = pair.encode("The cat sat on the mat.")
    with HostSyncs() as syncs:
        res = decode(pair, ids, method, cfg, gen=gen)
    return syncs, res


def test_the_counter_sees_every_read_and_not_a_host_copy():
    t = torch.tensor([3, 1, 2])
    with HostSyncs() as syncs:
        int(t[0]), t.tolist(), bool(t.any()), t.nonzero()
        host_values(host_copy(t))  # already on the host: no sync
    assert syncs.count == 4 and set(syncs.sites) == {"__int__", "tolist", "__bool__", "nonzero"}


def test_a_site_is_the_packages_own_frame_wherever_the_checkout_lies():
    """Issue 62: in a clone inside a folder named ``viasd`` a read made by a test was recorded at pytest's
    ``python.py:187`` (frames were told by their path). Frames are told by their module's name now."""
    t = torch.tensor([3, 1, 2])
    src = "def read(t):\n    return bool(t.any())\n"
    outside, inside = {"__name__": "_pytest.python"}, {"__name__": "viasd.engine.example"}
    exec(compile(src, "/somewhere/viasd/.venv/_pytest/python.py", "exec"), outside)
    exec(compile(src, "/anywhere/example.py", "exec"), inside)
    with HostSyncs() as syncs:
        outside["read"](t)  # a caller outside the package, in a file under a folder named viasd
        inside["read"](t)  # a module of the package: its file and line
        to_host(t)  # through the counted read of syncs.py itself: the caller (here, none in the package)
    assert syncs.sites == {"__bool__": 1, "__bool__ example.py:2": 1, "tolist": 1}


def test_ar_and_sd_read_the_device_once_per_round():
    pair = tiny_pair("llama")
    for method, cfg in (("ar", None), ("sd", {"gamma": 4}), ("sd", {"gamma": 3, "drafter": {"name": "ngram"}}),
                        ("sd", {"gamma": 3, "drafter": {"name": "hybrid"}})):
        syncs, res = counted(pair, method, cfg)
        assert syncs.count <= res.counters.rounds + SETUP, (method, cfg, syncs.count, res.counters.rounds,
                                                            syncs.sites)


def test_cascade_sd_reads_once_per_round_and_per_vertical_verification():
    syncs, res = counted(tiny_pair("llama"), "cascade_sd")
    inner = res.models["draft"].calls  # the draft model's forwards: one per vertical verification
    assert syncs.count <= res.counters.rounds + inner + SETUP, syncs.sites


def test_via_sd_reads_once_per_round_and_once_more_per_escalation():
    for share in (True, False):
        syncs, res = counted(tiny_pair("llama"), "via_sd", {"slim": {"mask": "every_other", "share_prefix": share}})
        esc = res.counters.tiers.get("escalations", 0)
        assert syncs.count <= res.counters.rounds + esc + SETUP, syncs.sites


def test_a_stream_given_the_committed_tokens_finds_its_prefix_without_a_sync():
    pair = tiny_pair("llama")
    ids = pair.encode("The cat sat on the mat.")
    stream = Stream(pair.target, ids, "t")
    stream.logits(ids, host=ids[0].tolist())
    longer = torch.cat([ids, ids[:, :2]], 1)
    with HostSyncs() as syncs:
        stream.logits(longer, host=longer[0].tolist())
    assert syncs.count == 1  # the .tolist() above; the stream itself read nothing
    with HostSyncs() as syncs:
        stream.feed(ids[:, :1])  # appended on the device: nothing to compare
        stream.logits(torch.cat([longer, ids[:, :3]], 1))  # no host values given: the device compares
    assert syncs.count >= 1 and stream.length == longer.shape[1] + 3


def test_the_bench_reports_host_syncs_per_token_and_per_round():
    pair = tiny_pair("llama")
    variants = [Variant("ar", "ar"), Variant("sd", "sd", {"gamma": 3})]
    rows = host_sync_rows(pair, ["Hello there", "The cat"], variants, GenerationConfig(max_new_tokens=8,
                                                                                         ignore_eos=True))
    ar, sd = rows
    assert 1 <= ar["host_syncs_per_round"] <= 1 + 2 * SETUP / 8 and ar["host_syncs_per_token"] == ar["host_syncs_per_round"]
    assert sd["host_syncs_per_token"] < sd["host_syncs_per_round"] <= 1 + SETUP
    merged = add_host_syncs([{"variant": "sd", "tokens_per_s": 1.0}], rows)
    assert merged[0]["host_syncs_per_round"] == sd["host_syncs_per_round"] and merged[0]["tokens_per_s"] == 1.0
