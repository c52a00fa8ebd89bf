"""The draft side as an interface: who proposes the next block of tokens.

**The seam.** A :class:`Drafter` has one method, :meth:`Drafter.propose`, which returns a
:class:`Proposal`: up to ``k`` tokens after the current sequence, the distributions they were drawn
from (one-hot for deterministic drafters), and — where the drafter has them — its raw logits (the
temperature-1 decisions of ``via_sd``'s gate and ``faster_cascades``' rules read them) and the tokens'
host copies (a lookup knows its tokens without reading the device). Every method verifies a proposal
with the same rules; nothing is left in side attributes for a method to pick up later.

A drafter that reads the **verifier's hidden states** (EAGLE-style feature-level heads) sets
``needs_hidden = True``. ``sd`` (:class:`~viasd.engine.world.LiveWorld`) then asks the target's
:class:`~viasd.engine.stream.Stream` for its last decoder layer's hidden states
(:meth:`~viasd.engine.stream.Stream.logits` with ``hidden=True``; before the final norm:
:func:`~viasd.engine.paths.head` maps them to the target's logits) and hands each call of ``propose`` a
:class:`Features`: the target's hidden states ``[1, m, H]`` at the sequence positions
``start .. start + m − 1`` it verified since the previous call, each position handed over once — the
whole initial sequence on the first call (one pre-fill forward of the target, whose cache the first
round reuses), then the last committed position before each block and the block tokens the target
accepted. Positions are absolute indices into the decoding sequence ``seq`` ``[1, L]``; after a round
the target has not run on the last committed token (its correction or bonus), so ``start + m = L − 1``:
a head fuses ``hidden[i]`` with the embedding of ``seq[i + 1]`` to predict what follows, EAGLE's input.
The drafter keeps the features of earlier calls itself. ``faster_cascades`` hands them over the same way
(its target scores every block). ``via_sd``'s target lags behind the committed tokens (tier-1/2 tokens are
committed without it): their features arrive, in order, with the next escalation's forward, which runs the
target over every committed token it has not seen, so ``start + m`` may then be well below ``L − 1``; a
drafter drafts past the positions it has no features for on its own (``eagle``: the head's predicted
features, :mod:`viasd.engine.eagle_drafter`), never on another model's hidden states. The target then
runs its own forward (no shared prefix with the slim verifier). Replay has no hidden states: it has no
such drafter.

Minimal example (a toy feature-level drafter, see ``tests/test_drafter_seam.py``)::

    class HeadDrafter(Drafter):
        needs_hidden = True

        def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
            h = features.hidden[:, -1:]                      # [1, 1, H] the last verified position
            logits = self.head(h)[0]                         # [1, V]
            p = probs_from_logits(logits, gen)
            y = sample(p[0], rng, gen.greedy).view(1)
            return Proposal(y[:k], p[:k], logits[:k])

Registered drafters:

* ``model`` — an independent small model (the pair's draft).
* ``ngram`` — prompt lookup: copy the continuation of the latest earlier match of the last
  n tokens (no neural cost; Saxena 2023 / transformers' prompt lookup decoding).
* ``hybrid`` — prompt lookup when the last ``lookup_min``..``ngram_max`` tokens recur in the
  context, otherwise the draft model (the lookup block costs nothing; the model drafts the
  rest). Lossless like the others: each block is verified against the distribution it was
  drawn from (one-hot for a lookup block).
* ``self`` — the target itself run with a routing plan (kept layers), as in Draft & Verify /
  SWIFT.
* ``cascade`` — a Cascade-SD cascade of the above (vertical + horizontal):
  :mod:`viasd.engine.cascade`.

Draft-length policies (:class:`LengthPolicy`, built by :meth:`DrafterConfig.length_policy_for`):
``constant``; ``heuristic`` (+2 after a fully accepted block, −1 otherwise, as transformers does);
``confidence`` (stop drafting once the draft's top probability falls below ``min_confidence``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from viasd.config import GenerationConfig
from viasd.core.sampling import confidence, probs_from_logits, sample
from viasd.engine.routing import RoutingPlan, default_self_layers, num_layers, vocab_size_of
from viasd.engine.stream import ModelStats, Stream
from viasd.errors import ConfigError, no_draft_model
from viasd.registry import Registry

DRAFTERS: Registry = Registry("drafter")


@dataclass
class DrafterConfig:
    """Which drafter proposes tokens, and its options."""

    name: str = "model"
    ngram_max: int = 3  # ngram: longest suffix to match
    ngram_min: int = 1  # ngram: shortest suffix to match
    # hybrid: shortest suffix match that makes the lookup draft the block (None: unset, i.e. 2 —
    # conf/drafter/ngram.yaml leaves it unset, so the ngram runs keep their ids: viasd.harness.config)
    lookup_min: int | None = 2
    layers: list[int] | None = None  # self: kept target layers (None: the pair's default)
    length_policy: str = "constant"  # constant | heuristic | confidence
    min_confidence: float = 0.4  # confidence policy threshold
    max_gamma: int = 16  # heuristic policy cap
    path: str | None = None  # eagle: the head folder (viasd.engine.eagle_drafter)

    def __post_init__(self) -> None:
        if self.lookup_min is None:
            self.lookup_min = 2

    def length_policy_for(self, gamma: int) -> LengthPolicy:
        """This drafter's draft-length policy (``length_policy``, ``min_confidence``, ``max_gamma``)
        starting at ``gamma`` tokens per round."""
        return LengthPolicy(self.length_policy, gamma, self.min_confidence, self.max_gamma)


@dataclass
class Proposal:
    """What a drafter proposes for one round.

    ``tokens``: ``LongTensor[k]``; ``probs``: ``[k, V]`` the (processed: temperature / top-k / top-p)
    distributions they were drawn from, one-hot for deterministic drafters; ``logits``: ``[k, V]``
    the raw logits behind them (``None``: the drafter has none, e.g. a lookup — rules deciding on
    the temperature-1 distribution then read ``probs``); ``host``: the tokens on the host when the
    drafter knows them without a device read (``None``: known only on the device); ``levels``: per
    token, the cascade level that drafted it (:mod:`viasd.engine.cascade`; ``None`` elsewhere). A replayed
    proposal (:meth:`viasd.analysis.replay.Episode.propose`) holds its tokens as a host list and no ``probs``.

    Unpacks as the pair ``(tokens, probs)``.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    logits: torch.Tensor | None = None
    host: list[int] | None = None
    levels: list[int] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def __iter__(self):
        return iter((self.tokens, self.probs))

    @staticmethod
    def empty(seq: torch.Tensor, vocab: int, logits: bool = True) -> Proposal:
        """No tokens (``k = 0``) on ``seq``'s device; with ``logits``: an empty ``[0, V]`` logits tensor too."""
        none = torch.zeros(0, vocab, device=seq.device)
        return Proposal(seq.new_zeros(0), none, none if logits else None, [])


@dataclass
class Features:
    """The verifier's hidden states handed to a drafter that declares ``needs_hidden``.

    ``hidden``: ``[1, m, H]`` the target's last decoder layer's hidden states (before the final norm) at the decoding
    sequence's positions ``start .. start + m − 1``, those it verified since the drafter's previous
    proposal (``m`` may be 0 when the target has not run since).
    """

    hidden: torch.Tensor
    start: int

    @property
    def end(self) -> int:
        """One past the last position covered."""
        return self.start + int(self.hidden.shape[1])

    def after(self, states: torch.Tensor, start: int) -> Features:
        """The next features: ``states`` ``[1, m, H]`` at positions ``start..`` without those this one
        already covered (a verifier's forward may repeat its last position)."""
        skip = min(max(0, self.end - start), int(states.shape[1]))
        return Features(states[:, skip:], start + skip)


class Drafter:
    """Base drafter. Subclasses implement :meth:`propose`."""

    name = "base"
    #: whether :meth:`propose` reads the verifier's hidden states (its ``features`` argument; see the module docstring)
    needs_hidden: bool = False

    def propose(
        self, seq: torch.Tensor, k: int, gen: GenerationConfig, rng: torch.Generator | None, min_confidence: float = 0.0,
        host: list[int] | None = None, features: Features | None = None,
    ) -> Proposal:
        """Propose up to ``k`` tokens after ``seq``.

        Args:
            seq: ``LongTensor[1, L]`` the committed decoding sequence.
            k: maximum number of tokens to propose (may be 0).
            gen: sampling settings (the same processors as the verifier).
            rng: random generator for sampling.
            min_confidence: stop early once the top probability (temperature 1) is below it.
            host: ``seq``'s tokens on the host (``Output.ids``) when the caller has them: streams
                and lookups then read no token off the device.
            features: the verifier's hidden states since the previous call (only for a drafter
                with ``needs_hidden``; ``None`` otherwise).

        Returns:
            a :class:`Proposal` of ``k' ≤ k`` tokens.
        """
        raise NotImplementedError

    def stats(self) -> dict[str, ModelStats]:
        """Per-model statistics of the neural parts of this drafter."""
        return {}


class ModelDrafter(Drafter):
    """Autoregressive drafting with a model (the pair's draft, or the routed target)."""

    name = "model"

    def __init__(self, model, prompt_ids: torch.Tensor, label: str = "draft"):
        self.stream = Stream(model, prompt_ids, label)
        self.vocab = vocab_size_of(model)

    def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []
        greedy = gen.temperature == 0
        for _ in range(k):  # each sample is fed on the device: no host sync (confidence policy aside)
            step = self.stream.feed(tokens[-1].view(1, 1), host=host) if tokens else self.stream.logits(seq, host=host)
            logits = step[0, -1]
            if min_confidence > 0 and tokens and float(confidence(logits)) < min_confidence:
                break
            p = probs_from_logits(logits, gen)
            x = sample(p, rng, greedy)
            tokens.append(x)
            probs.append(p)
            raw.append(logits)
        if not tokens:
            return Proposal.empty(seq, self.vocab)
        return Proposal(torch.stack(tokens), torch.stack(probs), torch.stack(raw))

    def stats(self):
        return {self.stream.name: self.stream.stats}


class NgramDrafter(Drafter):
    """Prompt-lookup drafting: propose the tokens that followed the last n-gram's latest match."""

    name = "ngram"

    def __init__(self, vocab: int, ngram_max: int = 3, ngram_min: int = 1, context: torch.Tensor | None = None):
        if not 1 <= ngram_min <= ngram_max:
            raise ConfigError(f"ngram drafter needs 1 <= ngram_min <= ngram_max (got {ngram_min}, {ngram_max})")
        self.vocab, self.ngram_max, self.ngram_min = vocab, ngram_max, ngram_min
        # Encoder-decoder models: the prompt is not in the decoder sequence, so search it too.
        self.context = context if context is not None else torch.zeros(0, dtype=torch.long)
        self.context_ids: list[int] = self.context.tolist()  # read once, at set-up

    def lookup(self, seq: torch.Tensor, k: int) -> torch.Tensor:
        """The up to ``k`` tokens that followed the latest earlier match of the longest matching
        suffix n-gram of ``seq`` (``LongTensor[1, L]``); ``LongTensor[k']``, empty without a match."""
        s = torch.cat([self.context.to(seq.device), seq[0]])
        L = s.shape[0]
        if k > 0:
            for n in range(min(self.ngram_max, L - 1), self.ngram_min - 1, -1):
                windows = s.unfold(0, n, 1)[:-1]  # all earlier n-grams (exclude the suffix itself)
                hits = (windows == s[L - n:]).all(-1).nonzero()
                if hits.numel():
                    start = int(hits[-1, 0]) + n
                    return s[start:start + k]
        return s.new_zeros(0)

    def lookup_ids(self, s: list[int], k: int) -> list[int]:
        """:meth:`lookup` over host token ids ``s`` (the context included): the same match, read
        without a host sync."""
        L = len(s)
        if k > 0:
            for n in range(min(self.ngram_max, L - 1), self.ngram_min - 1, -1):
                suffix = s[L - n:]
                for i in range(L - n - 1, -1, -1):  # the latest earlier n-gram (not the suffix itself)
                    if s[i:i + n] == suffix:
                        return s[i + n:i + n + k]
        return []

    def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
        if host is not None and len(host) == seq.shape[1]:
            ids = self.lookup_ids(self.context_ids + list(host), k)
            found = torch.tensor(ids, dtype=torch.long, device=seq.device)
        else:
            found, ids = self.lookup(seq, k), None
        return Proposal(found, torch.nn.functional.one_hot(found, self.vocab).float(), None, ids)


class HybridDrafter(Drafter):
    """Prompt lookup first, the draft model when the lookup finds no match.

    Per block: if the last ``lookup.ngram_min``..``ngram_max`` tokens recur earlier in the
    context, propose what followed them (one-hot, no neural cost); otherwise let ``model``
    draft. Measured on SmolLM2's own continuations of held-out task prompts (teacher-forced,
    per position): lookup-when-≥2-tokens-match else the distilled draft agrees with the
    target's greedy token more often than either alone (see the draft's ``build_info.json``).
    """

    name = "hybrid"

    def __init__(self, lookup: NgramDrafter, model: ModelDrafter):
        self.lookup, self.model = lookup, model

    def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
        found = self.lookup.propose(seq, k, gen, rng, host=host)
        return found if len(found) else self.model.propose(seq, k, gen, rng, min_confidence, host)

    def stats(self):
        return self.model.stats()


def model_drafter(pair, prompt_ids, cfg: DrafterConfig) -> Drafter:
    if pair.draft is None:
        raise no_draft_model("method.drafter.name=model", pair.name, model_free_ok=True)
    return ModelDrafter(pair.draft, prompt_ids, "draft")


def ngram_drafter(pair, prompt_ids, cfg: DrafterConfig) -> Drafter:
    vocab = vocab_size_of(pair.target)
    context = prompt_ids[0] if pair.is_encoder_decoder else None
    return NgramDrafter(vocab, cfg.ngram_max, cfg.ngram_min, context)


def hybrid_drafter(pair, prompt_ids, cfg: DrafterConfig) -> Drafter:
    if not 1 <= cfg.lookup_min <= cfg.ngram_max:
        raise ConfigError(f"hybrid drafter needs 1 <= lookup_min <= ngram_max (got {cfg.lookup_min}, {cfg.ngram_max})")
    lookup = ngram_drafter(pair, prompt_ids, DrafterConfig(ngram_max=cfg.ngram_max, ngram_min=cfg.lookup_min))
    return HybridDrafter(lookup, model_drafter(pair, prompt_ids, cfg))


DRAFTERS.register("model")(model_drafter)
DRAFTERS.register("ngram")(ngram_drafter)
DRAFTERS.register("hybrid")(hybrid_drafter)
DRAFTERS.register_lazy("cascade", "viasd.engine.cascade:cascade_drafter")
DRAFTERS.register_lazy("eagle", "viasd.engine.eagle_drafter:eagle_drafter")


@DRAFTERS.register("self")
def self_drafter(pair, prompt_ids: torch.Tensor, cfg: DrafterConfig) -> ModelDrafter:
    """The target run with a routing plan (``cfg.layers``, else the pair's ``self_layers``, else every
    other layer) as its own drafter (Draft & Verify / SWIFT)."""
    n = num_layers(pair.target)
    layers = cfg.layers if cfg.layers is not None else pair.extras.get("self_layers") or default_self_layers(n)
    plan = RoutingPlan.build(layers, n, what="self-drafter plan (method.drafter.layers)")
    drafter = ModelDrafter(pair.target, prompt_ids, "self_draft")
    drafter.stream.plan = plan
    return drafter


def make_drafter(pair, prompt_ids: torch.Tensor, cfg: DrafterConfig) -> Drafter:
    """Build the configured drafter for one prompt."""
    return DRAFTERS.get(cfg.name)(pair, prompt_ids, cfg)


class LengthPolicy:
    """How many tokens to draft next round.

    ``constant``: always ``gamma``. ``heuristic``: +2 after a fully accepted block, −1 (min 1)
    otherwise (transformers' assisted generation). ``confidence``: ``gamma`` is a cap and the
    drafter stops early when its confidence drops below ``min_confidence``.
    """

    KINDS = ("constant", "heuristic", "confidence")

    def __init__(self, kind: str, gamma: int, min_confidence: float = 0.4, max_gamma: int = 16):
        if kind not in self.KINDS:
            raise ConfigError(f"unknown draft length policy {kind!r}; choose one of {', '.join(self.KINDS)}")
        self.kind, self.gamma, self.max_gamma = kind, gamma, max(max_gamma, gamma)
        self.min_confidence = min_confidence if kind == "confidence" else 0.0

    def next(self, remaining: int) -> int:
        """Draft length for the next round, never more than ``remaining − 1``."""
        return max(0, min(self.gamma, remaining - 1))

    def update(self, drafted: int, accepted: int) -> None:
        """Adapt after a round that drafted ``drafted`` and accepted ``accepted`` tokens."""
        if self.kind == "heuristic" and drafted:
            self.gamma = min(self.max_gamma, self.gamma + 2) if accepted == drafted else max(1, self.gamma - 1)
