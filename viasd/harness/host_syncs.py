"""The benchmark's host-sync section: device→host reads per generated token and per round.

Each variant decodes the prompts once more, untimed, under :class:`~viasd.engine.syncs.HostSyncs`
(which counts every read, so the timed decodes pay nothing for it). On a CPU-only machine every
read counts (each would be a sync with the pair on a GPU); on a GPU only reads of device tensors.
The decoding loops aim at one read per round (``docs/paper_scale.md``).
"""

from __future__ import annotations

import math
from typing import Any

from viasd.config import GenerationConfig
from viasd.engine.syncs import HostSyncs
from viasd.methods.api import decode

SYNC_COLUMNS = [("host_syncs_per_token", "{:.2f}"), ("host_syncs_per_round", "{:.2f}")]


def host_sync_rows(pair, prompts: list[str], variants: list, gen: GenerationConfig, seed: int = 0) -> list[dict[str, Any]]:
    """One row per variant (``Variant``: ``label``, ``method``, ``cfg``): ``host_syncs`` over the
    prompts, ``host_syncs_per_token`` and ``host_syncs_per_round`` (set-up reads included), and the
    three sites that read most (``host_sync_sites``)."""
    ids = [pair.encode(p) for p in prompts]
    rows = []
    for v in variants:
        tokens = rounds = 0
        with HostSyncs() as syncs:
            for i, x in enumerate(ids):
                r = decode(pair, x, v.method, v.cfg, gen, seed=seed + i)
                tokens, rounds = tokens + r.new_tokens, rounds + r.counters.rounds
        rows.append({"variant": v.label, "host_syncs": syncs.count,
                     "host_syncs_per_token": syncs.count / tokens if tokens else math.nan,
                     "host_syncs_per_round": syncs.count / rounds if rounds else math.nan,
                     "host_sync_sites": dict(syncs.sites.most_common(3))})
    return rows


def add_host_syncs(rows: list[dict[str, Any]], sync_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The benchmark rows with their variant's host-sync columns added."""
    by_variant = {r["variant"]: r for r in sync_rows}
    return [{**r, **{k: v for k, v in by_variant.get(r["variant"], {}).items() if k != "variant"}} for r in rows]
