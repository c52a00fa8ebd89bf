"""The one KV-cache helper every method uses: a model's view of the token sequence.

A :class:`Stream` owns one model's KV cache over a prefix of the decoding sequence. Methods
never touch caches directly: they ask a stream for logits at the end of the current sequence
(:meth:`Stream.logits`), and the stream rolls its cache back to the longest prefix that is
still valid (the common prefix of what it cached and the new sequence) before feeding the rest.

**Shared prefix.** A slim verifier ``q'`` (the target routed through a plan) and the full target
``q`` compute the same thing for every sub-layer before the first one the plan skips: same
inputs, same KV entries, same hidden states. A :class:`SharedPrefix` holds the KV cache of those
sub-layers and their output hidden states (the *boundary* hidden states) for the positions some
stream attached to it has not yet consumed. Each attached stream keeps its own cache for the
sub-layers it runs after the boundary: the slim pass extends the prefix over the block, and an
escalation resumes the full model from the boundary hidden states of the block and of every
lagging committed token the slim pass already processed.

**Host syncs.** Finding the valid prefix compares token values on the host where both sides are
known there (:class:`HostTokens`: the values a caller passed as ``host``, and queued host copies of
the tokens a stream fed from the device), so a stream call reads nothing off the device in the
loops; only a comparison over values neither side knows falls back to the device (one sync).
Forward time is measured without a sync per forward: with CUDA events on a single-GPU model
(read once, when :attr:`Stream.stats` is asked for), a synchronisation of every device per
forward only for a model split over several GPUs.

All transformers cache calls live here (transformers 5.x: forward takes ``cache=``, outputs carry
``.cache``; ``Cache.crop`` only removes a fixed count from every layer, so rollback crops each
layer — of each cache, the shared one included — to its own absolute length).

**Shared start.** Sequences that begin with the same tokens (prompts sharing few-shot exemplars)
need not prefill them each: :func:`prefix_kv` runs a stream once over the common prefix and
freezes its cache (:class:`PrefixKV`); a stream started from it (``Stream(..., start=kv)``) holds
copies of its layer objects over the same tensors — never written in place: a forward
concatenates new KV into new tensors and a rollback slices — and feeds only what follows.

Decoder-only models: the sequence is prompt + generated tokens. Encoder-decoder models (T5):
the encoder runs once on the prompt and the sequence is the decoder's, starting with
``decoder_start_token_id``; only the self-attention cache is rolled back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel, StaticCache

from viasd.engine.compiled import compiled, rewind
from viasd.engine.paths import embed, head, is_encoder_decoder, make_path, routed_forward, run_units
from viasd.engine.routing import all_units, unit_index
from viasd.engine.syncs import ForwardClock, HostTokens, common_prefix, cuda_devices, match_length  # noqa: F401
from viasd.errors import ConfigError


@dataclass
class ModelStats:
    """Forward calls, tokens processed, wall seconds and layer work of one model during a decode.

    ``layer_tokens``: Σ over forwards of tokens × decoder layers actually run (a layer of which
    only one sub-layer ran counts ½; shared-prefix sub-layers count for the stream that ran them).
    """

    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    layer_tokens: float = 0.0

    def add(self, other: ModelStats) -> None:
        self.calls += other.calls
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.layer_tokens += other.layer_tokens


def layer_count(model: PreTrainedModel) -> int:
    """Decoder layers of any model (T5: the decoder's), read from its config."""
    cfg = model.config
    if getattr(cfg, "is_encoder_decoder", False):
        return int(getattr(cfg, "num_decoder_layers", None) or cfg.num_layers)
    return int(cfg.num_hidden_layers)


def start_sequence(model: PreTrainedModel, prompt_ids: torch.Tensor) -> torch.Tensor:
    """The initial decoding sequence ``LongTensor[1, L0]`` for ``model`` and a prompt ``[1, P]``."""
    if getattr(model.config, "is_encoder_decoder", False):
        start = model.config.decoder_start_token_id
        return torch.tensor([[start]], dtype=torch.long, device=prompt_ids.device)
    return prompt_ids


def fresh_cache(model: PreTrainedModel):
    """An empty cache for ``model`` (``EncoderDecoderCache`` for encoder-decoders)."""
    if getattr(model.config, "is_encoder_decoder", False):
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    return DynamicCache()


def crop_cache(cache, length: int) -> None:
    """Crop every layer of ``cache`` (its self-attention part) to an absolute ``length`` tokens (a static
    cache: move its write position, :func:`~viasd.engine.compiled.rewind`)."""
    if isinstance(cache, StaticCache):
        return rewind(cache, length)
    for layer in getattr(cache, "self_attention_cache", cache).layers:
        if getattr(layer, "keys", None) is None or not getattr(layer, "is_initialized", True):
            continue
        if layer.keys.numel() and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


class SharedPrefix:
    """KV cache and boundary hidden states of a target's first ``boundary`` sub-layers (unit
    indices, :func:`~viasd.engine.routing.unit_index`), shared by the streams attached to it.

    Invariant: ``hidden`` ``[1, length − lo, H]`` holds the boundary hidden states of positions
    ``lo..length−1``, where ``lo`` is the shortest valid length of an attached stream (None when empty).
    """

    def __init__(self, model: PreTrainedModel, prompt_ids: torch.Tensor, boundary: int):
        self.model, self.boundary = model, boundary
        self.units = all_units(layer_count(model))[:boundary]
        self.cache = fresh_cache(model)
        self.tokens = prompt_ids.new_zeros((1, 0))
        self.host = HostTokens()
        self.hidden: torch.Tensor | None = None
        self.lo = 0
        self.streams: list[Stream] = []

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def crop(self, length: int) -> None:
        """Roll the prefix back to its first ``length`` positions (cache, tokens, hidden states)."""
        if length >= self.length:
            return
        crop_cache(self.cache, length)
        self.tokens = self.tokens[:, :length]
        self.host.crop(length)
        if self.hidden is None or length <= self.lo:
            self.hidden, self.lo = None, length
        else:
            self.hidden = self.hidden[:, : length - self.lo]

    def trim(self) -> None:
        """Drop boundary hidden states every attached stream has consumed (a stream's valid part is
        its common prefix with the prefix's tokens)."""
        mine = self.host.values(self.length, wait=False)  # a lower bound keeps more: no wait for the device
        lo = min([self.length if s.tokens is self.tokens else match_length(s.tokens, s.host, self.tokens, mine, False)
                  for s in self.streams] + [self.length])
        if self.hidden is not None and lo > self.lo:
            self.hidden = self.hidden[:, lo - self.lo:] if lo < self.length else None
        self.lo = max(self.lo, lo)

    def hidden_for(self, seq: torch.Tensor, keep: int, encoder_outputs=None,
                   host: list[int] | None = None) -> tuple[torch.Tensor, int]:
        """Boundary hidden states ``[1, L − keep, H]`` of positions ``keep..L−1`` of ``seq`` ``[1, L]``
        (``host``: the values of a prefix of ``seq`` the caller knows on the host).

        Rolls the prefix back to its valid prefix of ``seq`` (or to ``keep`` when the stored
        hidden states start after it) and runs the prefix sub-layers over the rest. Returns the
        hidden states and how many positions the prefix sub-layers ran on.
        """
        valid = match_length(self.tokens, self.host, seq, host)
        if keep < self.lo:
            valid = min(valid, keep)
        self.crop(valid)
        ran = seq.shape[1] - valid
        if ran:
            h = embed(self.model, seq[:, valid:])
            h = run_units(make_path(self.model, h, self.cache, valid, self.units, encoder_outputs), self.units, h)
            self.hidden = h if self.hidden is None else torch.cat([self.hidden, h], 1)
            self.host.fed(seq, valid, host)
            self.tokens = seq
        return self.hidden[:, keep - self.lo:], ran


class PrefixKV:
    """The frozen KV cache of one model (routed through one plan) over a token prefix ``[1, S]``,
    that streams of sequences starting with those tokens start from (decoder-only models).

    ``seconds``: the forward that computed it.
    """

    def __init__(self, stream: Stream, seconds: float = 0.0):
        if stream.is_encoder_decoder:
            raise ValueError("a prefix KV is for decoder-only models (an encoder-decoder's decoder shares no prompt)")
        self.model, self.plan, self.tokens, self.seconds = stream.model, stream.plan, stream.tokens, seconds
        self.host = list(stream.host.values(stream.length))
        self.layers = [copy.copy(layer) for layer in stream.cache.layers]

    def cache(self) -> DynamicCache:
        """A new cache holding the prefix: its own layer objects over the prefix's (shared) tensors."""
        cache = fresh_cache(self.model)
        cache.layers = [copy.copy(layer) for layer in self.layers]
        return cache


def prefix_kv(model: PreTrainedModel, prefix_ids: torch.Tensor, plan=None) -> PrefixKV:
    """The KV cache of ``model`` (routed through ``plan``) over ``prefix_ids`` ``[1, S]``: one forward."""
    stream = Stream(model, prefix_ids, "prefix", plan)
    stream.logits(prefix_ids)
    return PrefixKV(stream, stream.stats.seconds)


class Stream:
    """One model + its KV cache following the decoding sequence.

    Args:
        model: a causal LM or an encoder-decoder LM.
        prompt_ids: ``LongTensor[1, P]`` prompt (encoded once for encoder-decoders).
        name: label used in statistics (``"draft"``, ``"target"``, ``"slim"`` …).
        plan: optional :class:`~viasd.engine.routing.RoutingPlan`; the stream then runs only the
            kept sub-layers and its cache holds entries for those layers only.
        prefix: optional :class:`SharedPrefix` of ``model``; the stream then takes the sub-layers
            before ``prefix.boundary`` from it and runs (and caches) only its own units after it.
        start: optional :class:`PrefixKV` of ``model`` and ``plan`` whose tokens begin ``prompt_ids``:
            the stream starts with them cached (rolled back like its own where a sequence leaves them).
    """

    def __init__(self, model: PreTrainedModel, prompt_ids: torch.Tensor, name: str, plan=None,
                 prefix: SharedPrefix | None = None, start: PrefixKV | None = None):
        self.model = model
        self.name = name
        self.plan = plan  # a RoutingPlan: run only these sub-layers (slim verifier / self-draft)
        self.prefix = prefix
        self._stats = ModelStats()
        self.is_encoder_decoder = is_encoder_decoder(model)
        self.tokens = prompt_ids.new_zeros((1, 0))  # [1, n] tokens whose KV is cached
        self.host = HostTokens()  # their values on the host
        self.clock = ForwardClock(model)
        self.encoder_outputs = None
        self.compiled = compiled(model)  # +pair.compile=true: a static cache and the compiled forward
        self.cache = self.compiled.take(self) if self.compiled is not None else fresh_cache(model)
        if self.is_encoder_decoder:
            with torch.inference_mode():
                t0 = self.clock.start()
                self.encoder_outputs = model.get_encoder()(input_ids=prompt_ids)
                self.clock.stop(t0)
            self._stats.calls += 1
            self._stats.tokens += prompt_ids.shape[1]
        if prefix is not None:
            prefix.streams.append(self)
        if start is not None:
            if start.model is not model or start.plan != plan or prefix is not None or self.compiled is not None:
                raise ValueError("a stream starts from a prefix KV of its own model and plan (and no shared prefix)")
            self.cache, self.tokens = start.cache(), start.tokens
            self.host.known, self.host.length = list(start.host), len(start.host)

    @property
    def stats(self) -> ModelStats:
        """Forward calls, tokens, seconds and layer work so far (reads the forward clock)."""
        self._stats.seconds = self.clock.seconds()
        return self._stats

    def synchronize(self) -> None:
        """Wait for the work queued on every device of the model (a timed section's end)."""
        self.clock.synchronize()

    @property
    def length(self) -> int:
        """Number of tokens currently cached."""
        return self.tokens.shape[1]

    def rollback(self, length: int) -> None:
        """Crop the cache to its first ``length`` tokens (an absolute length, every layer)."""
        if length >= self.length:
            return
        crop_cache(self.cache, length)
        self.tokens = self.tokens[:, :length]
        self.host.crop(length)

    def valid_prefix(self, seq: torch.Tensor, host: list[int] | None = None) -> int:
        """Length of the common prefix of the cached tokens and ``seq`` (``[1, L]``; ``host``: the
        values of a prefix of ``seq`` known on the host, compared there without a sync)."""
        return match_length(self.tokens, self.host, seq, host)

    def _forward(self, seq: torch.Tensor, keep: int, last: int,
                 host: list[int] | None = None, hidden: bool = False) -> tuple[torch.Tensor, float, torch.Tensor | None]:
        """Logits ``[1, last, V]`` after feeding ``seq[:, keep:]``, the layer-tokens it ran and (``hidden``)
        the last decoder layer's hidden states ``[1, last, H]`` of the same rows (before the final norm)."""
        new = seq[:, keep:]
        n = new.shape[1]
        if hidden:
            return self._hidden_forward(new, last, n)
        if self.compiled is not None:
            return self._compiled_forward(seq, new, last), float(n * layer_count(self.model)), None
        if self.prefix is not None:
            units = [u for u in (self.plan.units() if self.plan is not None else all_units(layer_count(self.model)))
                     if unit_index(u) >= self.prefix.boundary]
            hidden, ran = self.prefix.hidden_for(seq, keep, self.encoder_outputs, host)
            if units:
                path = make_path(self.model, hidden, self.cache, keep, units, self.encoder_outputs)
                hidden = run_units(path, units, hidden)
            return head(self.model, hidden, last), (ran * len(self.prefix.units) + n * len(units)) / 2, None
        if self.plan is not None:
            logits = routed_forward(self.model, new, self.cache, self.plan, last, self.encoder_outputs, past=keep)
            return logits, n * self.plan.sublayers() / 2, None
        if self.is_encoder_decoder:
            out = self.model(encoder_outputs=self.encoder_outputs, decoder_input_ids=new, cache=self.cache,
                             use_cache=True)
            return out.logits[:, -last:], float(n * layer_count(self.model)), None
        out = self.model(input_ids=new, cache=self.cache, use_cache=True, logits_to_keep=last)
        return out.logits, float(n * layer_count(self.model)), None

    def _hidden_forward(self, new: torch.Tensor, last: int, n: int) -> tuple[torch.Tensor, float, torch.Tensor]:
        """The model's own forward over ``new`` ``[1, n]`` returning its logits and last decoder layer's hidden
        states (``[1, last, ·]`` each): what a drafter that reads the verifier's features is given."""
        if self.compiled is not None or self.plan is not None or self.prefix is not None:
            raise ConfigError(f"a drafter that reads the target's hidden states needs the {self.name} stream's own "
                              "forward: set +pair.compile=false and use a verifier without a routing plan")
        if self.is_encoder_decoder:
            out = self.model(encoder_outputs=self.encoder_outputs, decoder_input_ids=new, cache=self.cache,
                             use_cache=True, output_hidden_states=True)
            states = out.decoder_hidden_states[-1]
        else:
            out = self.model(input_ids=new, cache=self.cache, use_cache=True, logits_to_keep=last,
                             output_hidden_states=True)
            states = out.hidden_states[-1]
        return out.logits[:, -last:], float(n * layer_count(self.model)), states[:, -last:]

    def _compiled_forward(self, seq: torch.Tensor, new: torch.Tensor, last: int) -> torch.Tensor:
        """Logits ``[1, last, V]`` of the compiled forward over ``new`` (the static cache holds the rest)."""
        if self.plan is not None or self.prefix is not None:
            raise ConfigError(f"+pair.compile=true runs the model's own forward; the {self.name} stream routes it "
                              "(a slim verifier or self drafter): use ar, sd or cascade_sd, or set +pair.compile=false")
        self.compiled.check(self)
        if seq.shape[1] > self.compiled.cache_len:
            raise ConfigError(f"the sequence ({seq.shape[1]} tokens) outgrows the static cache of "
                              f"{self.compiled.cache_len}: set +pair.compile_cache_len={2 * seq.shape[1]}")
        forward = self.compiled.forward if self.length else self.model.forward  # the prefill runs eager
        return forward(input_ids=new, cache=self.cache, use_cache=True, logits_to_keep=last).logits

    @torch.inference_mode()
    def logits(self, seq: torch.Tensor, last: int = 1, host: list[int] | None = None,
               hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits at the last ``last`` positions of ``seq`` (and, with ``hidden``, the hidden states there).

        Rolls the cache back to the valid prefix of ``seq`` (leaving at least ``last`` tokens
        to feed), runs one forward over the uncached suffix and caches it.

        Args:
            seq: ``LongTensor[1, L]`` the full decoding sequence.
            last: how many trailing positions to return (``1 ≤ last ≤ L``).
            host: the values of a prefix of ``seq`` the caller knows on the host (the committed
                tokens): the valid prefix is then found without a host sync.
            hidden: also return the model's last decoder layer's hidden states at those positions
                (before the final norm: :func:`~viasd.engine.paths.head` turns them into these logits):
                what a drafter with ``needs_hidden`` reads
                (:class:`~viasd.engine.drafters.Features`). Needs the model's own forward (no routing
                plan, shared prefix or compiled forward: one error line otherwise).

        Returns:
            ``[1, last, V]`` float32 logits; row ``j`` predicts ``seq[L − last + j + 1]``. With
            ``hidden``: ``(logits, states)``, ``states`` ``[1, last, H]`` at the same positions
            (row ``j`` is position ``L − last + j``).
        """
        return self._run(seq, min(self.valid_prefix(seq, host), seq.shape[1] - last), last, host, hidden)

    @torch.inference_mode()
    def feed(self, new: torch.Tensor, last: int = 1, host: list[int] | None = None) -> torch.Tensor:
        """:meth:`logits` of the cached tokens followed by ``new`` ``[1, m]`` (``1 ≤ last ≤ m``): nothing to
        compare, so no host sync even when the new tokens are known only on the device (a drafter's
        own samples). ``host``: as in :meth:`logits`."""
        return self._run(torch.cat([self.tokens, new], 1), self.length, last, host)

    def _run(self, seq: torch.Tensor, keep: int, last: int, host: list[int] | None, hidden: bool = False):
        """Roll back to ``keep``, feed ``seq[:, keep:]`` and return the last ``last`` logits rows
        (and hidden states rows, with ``hidden``)."""
        self.rollback(keep)
        t0 = self.clock.start()
        logits, layer_tokens, states = self._forward(seq, keep, last, host, hidden)
        logits = logits.float()
        self.clock.stop(t0)
        self._stats.calls += 1
        self._stats.tokens += seq.shape[1] - keep
        self._stats.layer_tokens += layer_tokens
        self.host.fed(seq, keep, host)
        self.tokens = seq
        if self.prefix is not None:
            self.prefix.trim()
        return (logits, states) if hidden else logits
