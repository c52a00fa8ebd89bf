"""External references: transformers' own speculative generation, counted like our methods.

* ``hf_assisted`` — ``generate(assistant_model=…)`` with the pair's draft (constant ``γ``
  schedule, no confidence stop);
* ``hf_prompt_lookup`` — ``generate(prompt_lookup_num_tokens=…)``, transformers' prompt-lookup
  decoding (no draft model: candidates are copied from the context after an n-gram match).

Both count forward calls and tokens with forward hooks (a public torch API), so their rows in a
benchmark table are comparable with ours. Per-token acceptance is not exposed by transformers:
``accepted`` is derived as ``new_tokens − target verification calls``; for prompt lookup the
drafted count is read off the target's inputs (every call after the first feeds the one
uncached committed token plus the candidates).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig as HFGenerationConfig
from transformers import StoppingCriteriaList, StopStringCriteria

from viasd.engine.result import Counters, DecodeResult, Output
from viasd.engine.stream import ModelStats, layer_count
from viasd.errors import ConfigError, no_draft_model
from viasd.methods.registry import register_method


@dataclass
class HFAssistedConfig:
    """Assisted generation knobs: ``gamma`` assistant tokens per round (constant schedule)."""

    gamma: int = 4

    def validate(self) -> None:
        if int(self.gamma) < 1:
            raise ConfigError(f"gamma must be >= 1 (got {self.gamma}); set method.gamma")


@dataclass
class HFPromptLookupConfig:
    """Prompt-lookup knobs: ``gamma`` candidate tokens per round (``prompt_lookup_num_tokens``)
    after a match of at most ``max_ngram`` tokens (``max_matching_ngram_size``)."""

    gamma: int = 4
    max_ngram: int = 3

    def validate(self) -> None:
        if int(self.gamma) < 1:
            raise ConfigError(f"gamma must be >= 1 (got {self.gamma}); set method.gamma")
        if int(self.max_ngram) < 1:
            raise ConfigError(f"max_ngram must be >= 1 (got {self.max_ngram}); set method.max_ngram")


def _count(model: torch.nn.Module, stats: ModelStats):
    """Forward hooks accumulating calls, input tokens and seconds into ``stats``."""

    def pre(_mod, args, kwargs):
        stats.calls += 1
        ids = kwargs.get("input_ids", kwargs.get("decoder_input_ids"))
        if ids is None and args:
            ids = args[0]
        stats.tokens += int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0
        stats.layer_tokens += int(ids.shape[-1]) * layer_count(model) if isinstance(ids, torch.Tensor) else 0
        stats.seconds -= time.perf_counter()

    def post(_mod, _args, _kwargs, _out):
        stats.seconds += time.perf_counter()

    return [model.register_forward_pre_hook(pre, with_kwargs=True), model.register_forward_hook(post, with_kwargs=True)]


def _stop_criteria(pair, gen) -> StoppingCriteriaList | None:
    """The task's stop strings as a stopping criterion of the target's ``generate`` (transformers'
    ``StopStringCriteria``, what ``stop_strings=`` builds). Not as ``stop_strings=`` in the generation
    config: assisted generation hands that config to the assistant's own ``generate`` without the
    tokenizer, which then refuses it (transformers 5.x); a criterion passed here stops the target only."""
    if not gen.stop_strings:
        return None
    return StoppingCriteriaList([StopStringCriteria(pair.tokenizer, list(gen.stop_strings))])


def _generate(pair, prompt_ids, gen, rng, models: dict[str, torch.nn.Module], **speculation):
    """``pair.target.generate`` of one prompt ``[1, P]`` with ``speculation`` (assistant or lookup
    settings), counting every model of ``models``; → (new tokens, ``{name: ModelStats}``, seconds)."""
    eos = gen.eos_ids(pair)
    hf_gen = HFGenerationConfig(
        max_new_tokens=gen.max_new_tokens,
        do_sample=gen.temperature > 0,
        temperature=gen.temperature if gen.temperature > 0 else None,
        top_k=gen.top_k if gen.temperature > 0 else None,
        top_p=gen.top_p if gen.temperature > 0 else None,
        eos_token_id=eos or [-1],  # [-1]: no token stops generation (ignore_eos) without suppressing EOS
        pad_token_id=pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else (eos or [0])[0],
        decoder_start_token_id=getattr(pair.target.config, "decoder_start_token_id", None),
        **{k: v for k, v in speculation.items() if k != "assistant_model"},
    )
    stats = {name: ModelStats() for name in models}
    hooks = [h for name, m in models.items() for h in _count(m, stats[name])]
    t0 = time.perf_counter()
    try:
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng, device=rng.device)))
        with torch.inference_mode():
            out = pair.target.generate(
                input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                assistant_model=speculation.get("assistant_model"), generation_config=hf_gen,
                stopping_criteria=_stop_criteria(pair, gen))
    finally:
        for h in hooks:
            h.remove()
    skip = 1 if pair.is_encoder_decoder else prompt_ids.shape[1]
    return out[0, skip:].tolist(), stats, time.perf_counter() - t0


def _committed(pair, prompt_ids, gen, tokens: list[int]) -> tuple[list[int], str]:
    """``(tokens, stop reason)`` of transformers' output cut by our stop rules (:class:`Output`, token by token):
    its assisted loop checks stopping criteria once per verified block, so a block that completes a stop
    string returns the tokens after it, which ``ar`` never emits."""
    out = Output(prompt_ids, gen, gen.eos_ids(pair), pair.tokenizer)
    out.commit(tokens)
    return out.new, out.stop_reason or "max_new_tokens"


@register_method("hf_assisted", HFAssistedConfig, lossless=True, description="transformers assisted generation")
def hf_assisted(pair, prompt_ids, cfg: HFAssistedConfig, gen, rng) -> DecodeResult:
    """Assisted generation of one prompt ``[1, P]`` through ``transformers``."""
    if pair.draft is None:
        raise no_draft_model("method=hf_assisted", pair.name)
    raw, stats, wall = _generate(
        pair, prompt_ids, gen, rng, {"draft": pair.draft, "target": pair.target}, assistant_model=pair.draft,
        num_assistant_tokens=int(cfg.gamma), num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0)
    c = Counters(rounds=stats["target"].calls)
    c.drafted = stats["draft"].calls - (1 if pair.is_encoder_decoder else 0)
    c.accepted = max(0, len(raw) - c.rounds)  # of what the target verified, before our stop rules cut it
    c.rejected = max(0, c.drafted - c.accepted)
    if pair.is_encoder_decoder:  # the encoder call of each model is not a decoding step
        c.rounds = max(0, c.rounds - 1)
    tokens, stop = _committed(pair, prompt_ids, gen, raw)
    return DecodeResult("hf_assisted", prompt_ids.shape[1], tokens, [], c, stats, wall, stop)


@register_method("hf_prompt_lookup", HFPromptLookupConfig, lossless=True,
                 description="transformers prompt-lookup decoding")
def hf_prompt_lookup(pair, prompt_ids, cfg: HFPromptLookupConfig, gen, rng) -> DecodeResult:
    """Prompt-lookup decoding of one prompt ``[1, P]`` through ``transformers`` (no draft model)."""
    if pair.is_encoder_decoder:
        raise ConfigError("method=hf_prompt_lookup runs decoder-only targets (transformers' prompt lookup "
                          "reads candidates from the decoder input); use method=sd_ngram for encoder-decoder pairs")
    raw, stats, wall = _generate(pair, prompt_ids, gen, rng, {"target": pair.target},
                                    prompt_lookup_num_tokens=int(cfg.gamma), max_matching_ngram_size=int(cfg.max_ngram))
    t = stats["target"]
    c = Counters(rounds=t.calls)
    # every call feeds the uncached committed token (the first: the prompt) plus the candidates
    c.drafted = max(0, t.tokens - prompt_ids.shape[1] - max(0, t.calls - 1))
    c.accepted = max(0, len(raw) - c.rounds)
    c.rejected = max(0, c.drafted - c.accepted)
    tokens, stop = _committed(pair, prompt_ids, gen, raw)
    return DecodeResult("hf_prompt_lookup", prompt_ids.shape[1], tokens, [], c, stats, wall, stop)
