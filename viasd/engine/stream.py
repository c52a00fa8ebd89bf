"""The one KV-cache helper every method uses: a model's view of the token sequence.

A :class:`Stream` owns one model's KV cache over a prefix of the decoding sequence. Methods
never touch caches directly: they ask a stream for logits at the end of the current sequence
(:meth:`Stream.logits`), and the stream rolls its cache back to the longest prefix that is
still valid (the common prefix of what it cached and the new sequence) before feeding the rest.

All transformers cache calls live here (transformers 5.x: forward takes ``cache=``, outputs carry
``.cache``; positions come from layer 0's cache length; ``Cache.crop`` only removes a fixed
count from every layer, so rollback crops each layer to an absolute length).

Decoder-only models: the sequence is prompt + generated tokens. Encoder-decoder models (T5):
the encoder runs once on the prompt and the sequence is the decoder's, starting with
``decoder_start_token_id``; only the self-attention cache is rolled back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel

from viasd.engine.routing import routed_forward


@dataclass
class ModelStats:
    """Forward calls, tokens processed and wall seconds of one model during a decode."""

    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, other: ModelStats) -> None:
        self.calls += other.calls
        self.tokens += other.tokens
        self.seconds += other.seconds


def start_sequence(model: PreTrainedModel, prompt_ids: torch.Tensor) -> torch.Tensor:
    """The initial decoding sequence ``LongTensor[1, L0]`` for ``model`` and a prompt ``[1, P]``."""
    if getattr(model.config, "is_encoder_decoder", False):
        start = model.config.decoder_start_token_id
        return torch.tensor([[start]], dtype=torch.long, device=prompt_ids.device)
    return prompt_ids


def _crop_layer(layer, length: int) -> None:
    """Crop one cache layer to an absolute ``length`` tokens."""
    if getattr(layer, "keys", None) is None or not getattr(layer, "is_initialized", True):
        return
    if layer.keys.numel() and layer.keys.shape[-2] > length:
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


class Stream:
    """One model + its KV cache following the decoding sequence.

    Args:
        model: a causal LM or an encoder-decoder LM.
        prompt_ids: ``LongTensor[1, P]`` prompt (encoded once for encoder-decoders).
        name: label used in statistics (``"draft"``, ``"target"``, ``"slim"`` …).
        plan: optional :class:`~viasd.engine.routing.RoutingPlan`; the stream then runs only the
            kept layers and its cache holds entries for those layers only.
    """

    def __init__(self, model: PreTrainedModel, prompt_ids: torch.Tensor, name: str, plan=None):
        self.model = model
        self.name = name
        self.plan = plan  # a RoutingPlan: run only these decoder layers (slim verifier / self-draft)
        self.stats = ModelStats()
        self.is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.tokens = prompt_ids.new_zeros((1, 0))  # [1, n] tokens whose KV is cached
        self._sync = model.device.type == "cuda"
        self.encoder_outputs = None
        if self.is_encoder_decoder:
            self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            with torch.inference_mode():
                t0 = time.perf_counter()
                self.encoder_outputs = model.get_encoder()(input_ids=prompt_ids)
                self.stats.seconds += time.perf_counter() - t0
            self.stats.calls += 1
            self.stats.tokens += prompt_ids.shape[1]
        else:
            self.cache = DynamicCache()

    @property
    def length(self) -> int:
        """Number of tokens currently cached."""
        return self.tokens.shape[1]

    def _self_attention_cache(self):
        return self.cache.self_attention_cache if self.is_encoder_decoder else self.cache

    def rollback(self, length: int) -> None:
        """Crop the cache to its first ``length`` tokens (an absolute length, every layer)."""
        if length >= self.length:
            return
        for layer in self._self_attention_cache().layers:
            _crop_layer(layer, length)
        self.tokens = self.tokens[:, :length]

    def valid_prefix(self, seq: torch.Tensor) -> int:
        """Length of the common prefix of the cached tokens and ``seq`` (``[1, L]``)."""
        n = min(self.length, seq.shape[1])
        if n == 0:
            return 0
        diff = (self.tokens[0, :n] != seq[0, :n]).nonzero()
        return int(diff[0, 0]) if diff.numel() else n

    @torch.inference_mode()
    def logits(self, seq: torch.Tensor, last: int = 1) -> torch.Tensor:
        """Logits at the last ``last`` positions of ``seq``.

        Rolls the cache back to the valid prefix of ``seq`` (leaving at least ``last`` tokens
        to feed), runs one forward over the uncached suffix and caches it.

        Args:
            seq: ``LongTensor[1, L]`` the full decoding sequence.
            last: how many trailing positions to return (``1 ≤ last ≤ L``).

        Returns:
            ``[1, last, V]`` float32 logits; row ``j`` predicts ``seq[L − last + j + 1]``.
        """
        keep = min(self.valid_prefix(seq), seq.shape[1] - last)
        self.rollback(keep)
        new = seq[:, keep:]
        t0 = time.perf_counter()
        if self.plan is not None:
            logits = routed_forward(self.model, new, self.cache, self.plan, last, self.encoder_outputs)
        elif self.is_encoder_decoder:
            out = self.model(
                encoder_outputs=self.encoder_outputs, decoder_input_ids=new, cache=self.cache, use_cache=True
            )
            logits = out.logits[:, -last:]
        else:
            out = self.model(input_ids=new, cache=self.cache, use_cache=True, logits_to_keep=last)
            logits = out.logits
        logits = logits.float()
        if self._sync:
            torch.cuda.synchronize()
        self.stats.seconds += time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.tokens += new.shape[1]
        self.tokens = seq
        return logits
