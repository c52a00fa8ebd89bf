"""``drafter=eagle``: the EAGLE head (:mod:`viasd.engine.eagle`) behind the drafter seam.

This module owns :class:`EagleDrafter` (registered lazily as the ``eagle`` entry of
:data:`~viasd.engine.drafters.DRAFTERS`): it declares ``needs_hidden``, keeps the target's hidden
states it was handed (:class:`~viasd.engine.drafters.Features`, each position once), feeds the head
one *true slot* per committed position whose features and next token are both known, and chain-drafts
``k`` tokens (:func:`~viasd.engine.eagle.propose`) with the verifier's own sampling processors. A
sequence that shrank or was rewritten crops the head's cache back to the slots still valid.

Committed tokens the target has not run on yet (``via_sd`` commits tier-1/2 tokens its full model never saw;
they reach the target at the next escalation, whose forward hands their features over) are fed as *pending*
slots on the head's own predicted features — EAGLE's draft-time input — before the draft, and re-fed as true
slots once the target's features arrive. The head never reads another model's hidden states (not the slim
verifier's: that would change its input distribution).

The decode seam hands the target's last-layer hidden states (``hidden_states[-1]``), so a head that reads
other layers (EAGLE-3's low/mid/high fusion) is refused with one line; train ``features=last`` heads
for decoding until the seam hands more layers.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from viasd.core.sampling import confidence, probs_from_logits, sample
from viasd.engine.drafters import Drafter, DrafterConfig, Features, Proposal
from viasd.engine.eagle import EagleHead, HeadState, feature_layers_of, propose
from viasd.engine.eagle_io import load_head
from viasd.engine.stream import ModelStats
from viasd.errors import ConfigError

#: (folder, mtime of its files, id of the target) -> the loaded head: one load per pair, not per prompt.
_HEADS: dict[tuple, EagleHead] = {}


def cached_head(path: str, target) -> EagleHead:
    """The head folder ``path`` loaded for ``target`` (once per process while its files are unchanged)."""
    folder = Path(path).expanduser().resolve()
    stamp = tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in folder.glob("*") if p.is_file())) \
        if folder.is_dir() else ()
    key = (str(folder), stamp, id(target))
    if key not in _HEADS:
        _HEADS.clear()  # one head in memory
        _HEADS[key] = load_head(folder, target)
    return _HEADS[key]


class EagleDrafter(Drafter):
    """Chain drafting with an EAGLE head over the target's hidden states."""

    name = "eagle"
    needs_hidden = True

    def __init__(self, head: EagleHead, n_layers: int):
        if feature_layers_of(head.spec, n_layers) != [n_layers]:
            raise ConfigError(f"this EAGLE head reads target layers {head.spec.feature_layers}; decoding hands the "
                              f"drafter only the last layer's hidden states: train one with features=last")
        self.head, self.state = head, HeadState()
        self.vocab = head.spec.vocab
        self.hidden: torch.Tensor | None = None  # [1, P, H] the target's hidden states of positions 0..P−1
        self.known: list[int] = []  # the tokens the held hidden states and fed slots read (positions 0..)
        self.stats_ = ModelStats()

    def _forget_changed(self, ids: list[int]) -> None:
        """Drop the hidden states and slots that read a token ``ids`` (the sequence now) no longer has:
        hidden state ``p`` read tokens ``≤ p``, slot ``i`` tokens ``≤ i + 1``."""
        same = 0
        for a, b in zip(self.known, ids):
            if a != b:
                break
            same += 1
        if self.hidden is not None and self.hidden.shape[1] > same:
            self.hidden = self.hidden[:, :same]
        slots = min(self.state.true, max(0, same - 1))
        if slots < self.state.true:  # re-feed at least the last slot: its output starts the chain
            self.state.crop(max(0, min(slots, len(ids) - 2)))
        self.known = self.known[:same]

    def _take(self, features: Features | None) -> None:
        """Append the newly verified positions (a rewrite of held ones replaces them and the slots that read them)."""
        if features is None or not features.hidden.shape[1]:
            return
        have = 0 if self.hidden is None else self.hidden.shape[1]
        if features.start > have:
            raise RuntimeError(f"eagle drafter: features start at position {features.start}, it holds {have}")
        if features.start < have:
            self.state.crop(min(self.state.true, max(0, features.start - 1)))
        h = features.hidden.to(self.head.fc.weight.dtype)
        self.hidden = h if self.hidden is None or features.start == 0 else torch.cat([self.hidden[:, :features.start], h], 1)

    def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
        L = seq.shape[1]
        ids = list(host) if host is not None and len(host) == L else seq[0].tolist()  # one read without host ids
        self._forget_changed(ids)
        self._take(features)
        have = 0 if self.hidden is None else self.hidden.shape[1]
        self.known = ids[: max(have, self.state.true + 1)]
        upto = min(have, L - 1)  # true slots 0..upto−1; the committed tokens after seq[upto] are pending
        if k <= 0 or L < 2 or max(upto, self.state.true) < 1:
            return Proposal.empty(seq, self.vocab)
        t0 = time.perf_counter()
        start = self.state.true
        new_feats = self.hidden[:, start:upto]
        new_tokens = seq[:, start + 1:upto + 1]
        pending = seq[:, upto + 1:L] if upto + 1 < L else None
        greedy = gen.temperature == 0
        probs: list[torch.Tensor] = []

        def pick(logits: torch.Tensor) -> torch.Tensor:
            p = probs_from_logits(logits, gen)
            probs.append(p)
            return sample(p, rng, greedy)

        stop = (lambda logits: float(confidence(logits)) < min_confidence) if min_confidence > 0 else None
        with torch.no_grad():
            tokens, logits = propose(self.head, self.state, new_feats, new_tokens, k, pick, stop, pending)
        self.known = ids[: max(have, self.state.true + 1)]
        self.stats_.calls += 1
        self.stats_.tokens += (L - 1 - start) + len(tokens)
        self.stats_.layer_tokens += (L - 1 - start) + len(tokens)
        self.stats_.seconds += time.perf_counter() - t0
        return Proposal(tokens, torch.stack(probs[: len(tokens)]), logits)

    def stats(self):
        return {"eagle": self.stats_}


def eagle_drafter(pair, prompt_ids: torch.Tensor, cfg: DrafterConfig) -> Drafter:
    """The ``eagle`` drafter of ``pair``'s target with the head folder ``method.drafter.path``."""
    path = getattr(cfg, "path", None)
    if not path:
        raise ConfigError("drafter=eagle needs its head folder: method.drafter.path=<head> (train one with "
                          "`python -m experiments.train_eagle pair=<pair> out=<head>`)")
    if pair.is_encoder_decoder:
        raise ConfigError(f"drafter=eagle drafts for decoder-only targets; pair {pair.name!r} is encoder-decoder")
    head = cached_head(str(path), pair.target)
    return EagleDrafter(head, int(pair.target.config.num_hidden_layers))
