"""Cascade Speculative Drafting's drafters (Chen et al. 2023, "Cascade Speculative Drafting for Even
Faster LLM Inference"): the ``cascade`` drafter of every method and the one ``cascade_sd`` drafts with.

* **Vertical cascade** (:class:`VerticalDrafter`): a neural drafter's own autoregressive drafting
  is itself speculative — a smaller drafter (down to the statistical ``ngram`` model, which has
  no neural cost) proposes tokens, the neural drafter scores them in one forward and keeps them
  with the SD rules (:func:`~viasd.core.rules.verify_block`), adding its own correction or
  bonus token. Chains of any depth (``self`` ← ``model`` ← ``ngram``) nest.
* **Horizontal cascade** (:class:`CascadeDrafter`): the block is split by position — larger
  drafters propose the earlier positions (whose acceptance matters most), smaller ones the later
  positions (``levels[i].tokens`` each; the last level drafts any surplus).
* **Statistical bottom level** (:class:`MaxGramDrafter`, CS-Drafting's "Max-Gram"): the
  ``ngram`` member looks up the longest earlier match of the context's suffix and, where the
  lookup finds nothing (or its match runs out), falls back to a bigram model so it always
  proposes the tokens asked of it. CS-Drafting's bigram comes from Wikipedia; offline, ours is
  counted on the decoding context itself (prompt + generated tokens, plus what it has just
  proposed): the most frequent successor of the last token, else the context's most frequent
  token. ``bigram_fallback: false`` restores plain prompt lookup (which may propose nothing).

Registered as the ``cascade`` drafter (:data:`DEFAULT_LEVELS`), so ``sd``/``faster_cascades``/``via_sd``
can draft with the default cascade; the method ``cascade_sd`` (:mod:`viasd.methods.cascade_sd`) takes
its levels from ``method.levels``.

Why it is lossless w.r.t. the target: the target's SD verification needs, for each drafted
position, the distribution the token was actually drawn from given the tokens before it. A
level's plain drafter returns exactly that. A vertical level emits tokens accepted by SD
(distributed as the verifying model's ``p`` — speculative sampling is exact), residual samples
(which complete the accepted part to ``p``) and bonus samples from ``p``: whatever the smaller
drafter proposed, each emitted token is distributed as ``p(· | prefix)``, so the vertical drafter
returns ``p`` of the verifying (top) model at that position — never the smaller drafter's
proposal distribution. Early stops depend only on the prefix (stopping times), so they do not
bias the kept tokens. Greedy: every ``p`` is one-hot and a vertical level emits exactly its top
model's greedy tokens.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from viasd.config import to_dataclass
from viasd.core.rules import lenient_distribution, verify_block, verify_greedy
from viasd.core.sampling import confidence, probs_from_logits
from viasd.engine.drafters import (
    DRAFTERS,
    Drafter,
    DrafterConfig,
    ModelDrafter,
    NgramDrafter,
    Proposal,
    make_drafter,
)
from viasd.engine.stream import ModelStats
from viasd.engine.syncs import to_host
from viasd.errors import ConfigError


@dataclass
class CascadeLevel:
    """One horizontal level of the cascade.

    ``name`` drafts ``tokens`` consecutive block positions. ``vertical`` lists smaller drafters
    below it (vertical cascade): ``vertical[0]`` proposes ``vertical_tokens[0]`` tokens per inner
    round and ``name`` verifies them; ``vertical[1]`` does the same for ``vertical[0]``; and so on.
    Every member but the last must be a model drafter (``model`` or ``self``). ``leniency``
    (``l ∈ [0, 1)``, default 0 = exact) makes every vertical link of this level lenient: a
    proposal is accepted with ``min(1, p_up(x) / ((1 − l)·p_low(x)))`` (Leviathan et al. 2023,
    App. A.5), and the level reports the distribution its tokens then actually follow
    (:func:`~viasd.core.rules.lenient_distribution`), so the target's verification stays
    exact. It acts in sampling mode; greedy one-hot distributions make it a no-op.
    """

    name: str = "model"
    tokens: int = 3
    vertical: Any = field(default_factory=list)  # list of drafter names (or one name)
    vertical_tokens: Any = 2  # list of counts, one per vertical drafter (or one count for all)
    leniency: float = 0.0


#: The cascade the ``cascade`` drafter uses under other methods, and ``cascade_sd``'s default:
#: the draft model (accelerated by the n-gram model) for the first 3 positions, the n-gram
#: model for the rest.
DEFAULT_LEVELS = (
    {"name": "model", "tokens": 3, "vertical": ["ngram"], "vertical_tokens": [2], "leniency": 0.0},
    {"name": "ngram", "tokens": 2, "vertical": [], "vertical_tokens": [], "leniency": 0.0},
)

_NON_NEURAL = ("ngram",)  # registered drafters that cannot score proposals


def cascade_levels(levels, where: str = "method.levels") -> list[CascadeLevel]:
    """Validate and type a cascade description (list of dicts / :class:`CascadeLevel`)."""
    if not isinstance(levels, (list, tuple)) or not levels:
        raise ConfigError(f"{where} must be a non-empty list of levels like "
                          f"{{name: model, tokens: 3, vertical: [ngram]}} (got {levels!r})")
    out = []
    for i, raw in enumerate(levels):
        at = f"{where}[{i}]"
        lv = to_dataclass(CascadeLevel, raw, where=at)
        vertical = [lv.vertical] if isinstance(lv.vertical, str) else list(lv.vertical or [])
        vt = lv.vertical_tokens
        vt = [vt] * len(vertical) if isinstance(vt, int) else list(vt or [])
        if len(vt) != len(vertical):
            raise ConfigError(f"{at}.vertical_tokens needs one count per vertical drafter "
                              f"({len(vertical)} for {vertical}), got {lv.vertical_tokens!r}")
        if not isinstance(lv.tokens, int) or lv.tokens < 1:
            raise ConfigError(f"{at}.tokens must be an integer >= 1 (got {lv.tokens!r})")
        if any(not isinstance(t, int) or t < 1 for t in vt):
            raise ConfigError(f"{at}.vertical_tokens must be integers >= 1 (got {vt})")
        chain = [lv.name, *vertical]
        for name in chain:
            if name == "cascade" or name not in DRAFTERS:
                known = [n for n in DRAFTERS.names() if n != "cascade"]
                raise ConfigError(f"{at}: unknown cascade drafter {name!r}; use one of {', '.join(known)}")
        if len(set(chain)) != len(chain):
            raise ConfigError(f"{at}: a drafter appears twice in the vertical chain {chain}")
        for name in chain[:-1]:
            if name in _NON_NEURAL:
                raise ConfigError(f"{at}: {name!r} cannot verify proposals of a smaller drafter "
                                  f"(chain {chain}); only model drafters (model, self) can sit above another")
        if not 0 <= lv.leniency < 1:
            raise ConfigError(f"{at}.leniency must be a number in [0, 1) (got {lv.leniency!r}); 0 is exact")
        out.append(CascadeLevel(lv.name, lv.tokens, vertical, vt, float(lv.leniency)))
    return out


def bigram_next(context: list[int]) -> int:
    """Most frequent successor of ``context[-1]`` in ``context`` (token ids on the host, ``L ≥ 1``);
    the most frequent token of ``context`` when ``context[-1]`` has no successor (ties: lowest id)."""
    pool = [b for a, b in zip(context, context[1:]) if a == context[-1]] or context
    return max(sorted(counts := Counter(pool)), key=counts.get)  # ties: the lowest id


def level_quota(i: int, n_levels: int, tokens: int, k: int, done: int) -> int:
    """Horizontal cascade: positions level ``i`` (of ``n_levels``, drafting ``tokens``) proposes
    when ``done`` of the block's ``k`` are drafted; the last level drafts whatever is left."""
    return k - done if i == n_levels - 1 else min(tokens, k - done)


def inner_quota(lower_tokens: int, k: int, have: int) -> int:
    """Vertical cascade: tokens the smaller drafter proposes in an inner round when the level has
    ``have`` of its ``k`` tokens (one position is left for the verifying model's own token)."""
    return min(lower_tokens, k - have - 1)


class MaxGramDrafter(Drafter):
    """Prompt lookup (``lookup``, an :class:`~viasd.engine.drafters.NgramDrafter`) with a bigram
    fallback: always proposes ``k`` tokens (one-hot, no neural cost)."""

    name = "ngram"

    def __init__(self, lookup: NgramDrafter):
        self.lookup, self.vocab = lookup, lookup.vocab
        self.fallback_tokens = 0  # tokens the bigram proposed

    def tokens(self, seq: torch.Tensor, k: int, host: list[int] | None = None) -> list[int]:
        """The ``k`` tokens after ``seq`` ``[1, L]`` (``host``: on the host): the lookup's, then the bigram's."""
        context = self.lookup.context_ids + (list(host) if host is not None else seq[0].tolist())
        tokens = self.lookup.lookup_ids(context, k)
        found = len(tokens)
        while len(tokens) < k:
            tokens.append(bigram_next(context + tokens))
        self.fallback_tokens += k - found
        return tokens

    def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
        """``k`` tokens after ``seq`` ``[1, L]`` with one-hot distributions and host copies (no logits)."""
        ids = self.tokens(seq, k, host if host is not None and len(host) == seq.shape[1] else None)
        out = torch.tensor(ids, dtype=torch.long, device=seq.device)
        return Proposal(out, torch.nn.functional.one_hot(out, self.vocab).float(), None, ids)


class VerticalDrafter(Drafter):
    """Vertical cascade: ``upper`` (a model drafter) verifies ``lower``'s proposals with SD rules.

    Args:
        upper: the model whose distribution ``p`` the emitted tokens follow.
        lower: a smaller drafter (any :class:`Drafter`, possibly another vertical one).
        lower_tokens: tokens ``lower`` proposes per inner round.
        upper_name, lower_name: labels used in counter names.
        leniency: ``l ∈ [0, 1)`` of the lenient acceptance (0: exact SD).
    """

    def __init__(self, upper: ModelDrafter, lower: Drafter, lower_tokens: int, upper_name: str, lower_name: str,
                 leniency: float = 0.0):
        self.upper, self.lower, self.lower_tokens, self.leniency = upper, lower, lower_tokens, leniency
        self.upper_name, self.lower_name = upper_name, lower_name
        self.vocab = upper.vocab
        self.drafted = 0  # tokens ``lower`` proposed to ``upper``
        self.accepted = 0  # of those, accepted by ``upper``

    def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
        """Up to ``k`` tokens following ``upper``'s ``p``: ``(LongTensor[k'], p[k', V])``; one host read per inner round."""
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []
        cur, stop = seq, False
        while len(tokens) < k and not stop:
            # The smaller drafter proposes; ``upper`` scores them (+1 position) in one forward.
            at, quota = None if host is None else host + tokens, inner_quota(self.lower_tokens, k, len(tokens))
            low = self.lower.propose(cur, quota, gen, rng, min_confidence, host=at)
            y, p_low = low.tokens, low.probs
            m = y.shape[0]
            logits = self.upper.stream.logits(torch.cat([cur, y.view(1, -1)], 1), last=m + 1, host=at)[0]  # [m+1, V]
            p_up = probs_from_logits(logits, gen)
            if gen.temperature == 0:  # one read: the verdict and the proposal
                n, token, *y_host = to_host(torch.cat([verify_greedy(y, p_up), y]))
            else:
                n, token = verify_block(y, p_low, p_up, rng, self.leniency)
                y_host = low.host if low.host is not None else y[:n].tolist()
            self.drafted += m
            self.accepted += n
            for j, t in enumerate(y_host[:n] + [token]):
                if min_confidence > 0 and tokens and float(confidence(logits[j])) < min_confidence:
                    stop = True  # same stop rule as ModelDrafter: top probability (temperature 1)
                    break
                tokens.append(int(t))
                # the distribution this token follows: upper's p (exact), or the lenient mixture
                probs.append(p_up[j] if self.leniency == 0 or j == m else
                             lenient_distribution(p_low[j], p_up[j], self.leniency))
                raw.append(logits[j])
            cur = torch.cat([seq, seq.new_tensor(tokens).view(1, -1)], 1)
        if not tokens:
            return Proposal.empty(seq, self.vocab)
        return Proposal(seq.new_tensor(tokens), torch.stack(probs), torch.stack(raw), tokens)

    def counters(self) -> dict[str, int]:
        """``{lower}_drafted_for_{upper}`` / ``{lower}_accepted_by_{upper}`` down the chain."""
        out = {f"{self.lower_name}_drafted_for_{self.upper_name}": self.drafted,
               f"{self.lower_name}_accepted_by_{self.upper_name}": self.accepted}
        if isinstance(self.lower, VerticalDrafter):
            out.update(self.lower.counters())
        return out


class CascadeDrafter(Drafter):
    """Horizontal cascade over levels (each a plain or a :class:`VerticalDrafter`).

    Level ``i`` drafts ``min(tokens_i, what is left of k)`` positions after the previous levels'
    tokens; the last level drafts whatever is left. Under the confidence policy
    (``min_confidence > 0``) a level that stops early ends the block; otherwise the next level
    continues from where it stopped. A proposal's ``levels[j]`` is the level that drafted position
    ``j`` and its ``logits`` the raw logits (``log p`` for n-gram positions).
    """

    name = "cascade"

    def __init__(self, levels: list[tuple[Drafter, int]], members: dict[str, Drafter], vocab: int):
        self.levels = levels
        self.members = members
        self.vocab = vocab

    @classmethod
    def build(cls, pair, prompt_ids: torch.Tensor, levels: list[CascadeLevel], options: DrafterConfig,
              bigram_fallback: bool = True) -> CascadeDrafter:
        """Instantiate each named drafter once (levels share a drafter's stream) and wire the chains;
        with ``bigram_fallback`` the ``ngram`` member is a :class:`MaxGramDrafter`."""
        members: dict[str, Drafter] = {}

        def member(name: str) -> Drafter:
            if name == "model" and pair.draft is None:
                raise ConfigError(
                    f"pair {pair.name!r} has no draft model, but a cascade level uses `model`; use levels without "
                    "it, e.g. method.levels='[{name: self, tokens: 3, vertical: [ngram], vertical_tokens: [2]}, "
                    "{name: ngram, tokens: 2, vertical: [], vertical_tokens: []}]'")
            if name not in members:
                d = make_drafter(pair, prompt_ids, dataclasses.replace(options, name=name))
                members[name] = MaxGramDrafter(d) if bigram_fallback and isinstance(d, NgramDrafter) else d
            return members[name]

        built = []
        for i, lv in enumerate(levels):
            chain = [lv.name, *lv.vertical]
            d = member(chain[-1])
            for upper_name, lower_name, k_low in reversed(list(zip(chain[:-1], chain[1:], lv.vertical_tokens))):
                upper = member(upper_name)
                if not isinstance(upper, ModelDrafter):
                    raise ConfigError(f"method.levels[{i}]: {upper_name!r} cannot verify proposals of {lower_name!r}; "
                                      "only model drafters (model, self) can sit above another in a vertical cascade")
                d = VerticalDrafter(upper, d, k_low, upper_name, lower_name, lv.leniency)
            built.append((d, lv.tokens))
        return cls(built, members, int(pair.target.get_output_embeddings().weight.shape[0]))

    def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
        """Cascade draft of up to ``k`` tokens: a :class:`Proposal` with ``levels`` (no host copies)."""
        tokens, probs, raw, owner = [], [], [], []
        cur, done, at = seq, 0, host
        for i, (drafter, n_i) in enumerate(self.levels):
            want = level_quota(i, len(self.levels), n_i, k, done)
            if want <= 0:
                break
            part = drafter.propose(cur, want, gen, rng, min_confidence, host=at)
            t, p, logits = part.tokens, part.probs, part.logits
            if t.numel():
                at = None if at is None or part.host is None else at + part.host
                tokens.append(t)
                probs.append(p)
                raw.append(logits if logits is not None and logits.shape[0] == t.shape[0] else p.log())
                owner += [i] * t.shape[0]
                cur = torch.cat([cur, t.view(1, -1)], 1)
                done += t.shape[0]
            if min_confidence > 0 and t.shape[0] < want:
                break
        if not tokens:
            return dataclasses.replace(Proposal.empty(seq, self.vocab), host=None, levels=[])
        return Proposal(torch.cat(tokens), torch.cat(probs), torch.cat(raw), None, owner)

    def counters(self) -> dict[str, int]:
        """Vertical-cascade counters per level, e.g. ``level0_ngram_accepted_by_model``, and
        ``bigram_fallback_tokens`` (tokens the statistical level's bigram proposed)."""
        out: dict[str, int] = {}
        for d in self.members.values():
            if isinstance(d, MaxGramDrafter):
                out["bigram_fallback_tokens"] = d.fallback_tokens
        for i, (drafter, _) in enumerate(self.levels):
            if isinstance(drafter, VerticalDrafter):
                out.update({f"level{i}_{k}": v for k, v in drafter.counters().items()})
        return out

    def stats(self) -> dict[str, ModelStats]:
        out: dict[str, ModelStats] = {}
        for d in self.members.values():
            out.update(d.stats())
        return out


def cascade_drafter(pair, prompt_ids: torch.Tensor, cfg: DrafterConfig) -> Drafter:
    """The ``cascade`` drafter for other methods: :data:`DEFAULT_LEVELS` with ``cfg``'s options."""
    return CascadeDrafter.build(pair, prompt_ids, cascade_levels(list(DEFAULT_LEVELS), "the cascade drafter"), cfg)
