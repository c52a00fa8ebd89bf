"""viasd's decoding methods behind transformers' ``generate(custom_generate=…)``.

transformers loads this file (``custom_generate/generate.py`` of the folder or hub repository named by
``custom_generate=``) and calls :func:`generate` with the model and every argument given to
``model.generate``::

    out = target.generate(**inputs, custom_generate="path/to/viasd", trust_remote_code=True,
                          assistant_model=draft, tokenizer=tok, viasd_method="cascade_sd", max_new_tokens=64)

What this module owns: translating a ``generate`` call into one :func:`viasd.api.generate` call and its
result back into what a ``generate`` caller expects (``LongTensor[1, P + N]``, or a
``GenerateDecoderOnlyOutput`` / ``GenerateEncoderDecoderOutput`` with ``return_dict_in_generate=True``).
Every ``viasd_<knob>=`` argument is a knob of the method (``viasd_gamma=3``, ``viasd_tau_accept=0.9``,
``viasd_drafter={"name": "ngram"}``); ``viasd_mask=FILE`` is ``via_sd``'s DIMR mask file
(``slim.mask``; without it ``slim.mask=auto`` finds the mask searched or published for ``viasd_pair``,
default ``hf-<target folder name>``, the name ``experiments.search pair=hf`` stores it under);
``viasd_seed`` seeds sampling. Batch size 1. Bad input is one :class:`viasd.errors.ConfigError` line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from viasd.api import GEN_KNOBS, pair_from_models
from viasd.api import generate as viasd_generate
from viasd.errors import ConfigError

#: ``generate`` arguments this adapter reads; any other non-``viasd_`` argument is refused by name.
READ = {"inputs", "input_ids", "attention_mask", "generation_config", "assistant_model", "tokenizer",
        "max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p", "eos_token_id",
        "pad_token_id", "bos_token_id", "return_dict_in_generate", "stop_strings", "use_cache", "num_beams",
        "num_return_sequences", "synced_gpus"}
#: Arguments transformers always passes (as ``None`` unless the caller set them); refused when set.
UNSUPPORTED = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "streamer",
               "negative_prompt_ids", "negative_prompt_attention_mask", "output_scores", "output_logits",
               "output_attentions", "output_hidden_states")


class _IdsOnly:
    """The tokenizer of a call without ``tokenizer=``: token ids in, no text out."""

    def __init__(self, vocab: int):
        self.vocab, self.chat_template = vocab, None

    def __len__(self) -> int:
        return self.vocab

    def __call__(self, *args: Any, **kwargs: Any):
        raise ConfigError("text prompts and stop_strings need the tokenizer: pass tokenizer=<the target's tokenizer> "
                          "to generate")

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return ""


def _setting(name: str, kwargs: dict[str, Any], gc) -> Any:
    return kwargs[name] if kwargs.get(name) is not None else getattr(gc, name, None)


def _gen_knobs(kwargs: dict[str, Any], gc, prompt_len: int) -> dict[str, Any]:
    """viasd's generation knobs from the ``generate`` arguments and the generation config."""
    if (_setting("num_beams", kwargs, gc) or 1) != 1 or (_setting("num_return_sequences", kwargs, gc) or 1) != 1:
        raise ConfigError("viasd decodes one sequence: drop num_beams / num_return_sequences (or set them to 1)")
    new = _setting("max_new_tokens", kwargs, gc)
    if new is None:
        length = _setting("max_length", kwargs, gc) or 20
        new = int(length) - prompt_len
    out: dict[str, Any] = {"max_new_tokens": int(new)}
    if _setting("do_sample", kwargs, gc):
        out["temperature"] = float(_setting("temperature", kwargs, gc) or 1.0)
        out["top_k"] = int(_setting("top_k", kwargs, gc) or 0)
        out["top_p"] = float(_setting("top_p", kwargs, gc) or 1.0)
    eos = _setting("eos_token_id", kwargs, gc)
    if eos is not None:
        out["eos_token_ids"] = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    if kwargs.get("stop_strings"):
        stops = kwargs["stop_strings"]
        out["stop_strings"] = [stops] if isinstance(stops, str) else list(stops)
    return out


def _prompt(kwargs: dict[str, Any]) -> torch.Tensor:
    ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs")
    if not isinstance(ids, torch.Tensor):
        raise ConfigError("pass the prompt as input_ids (model.generate(**tokenizer(text, return_tensors='pt'), …))")
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ConfigError(f"batch size is 1: input_ids has shape {tuple(ids.shape)}; call generate once per prompt")
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ConfigError("the attention_mask masks prompt tokens (padding): pass one unpadded prompt (batch size 1)")
    return ids


def generate(model, **kwargs: Any):
    """``model.generate(…, custom_generate=…)`` through viasd: ``viasd_method`` (default ``sd``) decodes
    with ``model`` as the target and ``assistant_model`` as the draft.

    Returns ``LongTensor[1, P + N]`` (decoder-only: the prompt then the new tokens; encoder-decoder:
    the decoder start token then the new tokens), or the matching ``Generate*Output`` when
    ``return_dict_in_generate`` is set (``sequences`` only: no scores are computed).
    """
    from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerateEncoderDecoderOutput

    knobs = {k.removeprefix("viasd_"): kwargs.pop(k) for k in list(kwargs) if k.startswith("viasd_")}
    method = str(knobs.pop("method", "sd"))
    seed = int(knobs.pop("seed", 0))
    pair_name = knobs.pop("pair", None)
    mask = knobs.pop("mask", None)
    if mask is not None:
        knobs["slim"] = {**(knobs.get("slim") or {}), "mask": str(mask)}
    bad = [k for k in knobs if k in GEN_KNOBS]
    if bad:
        raise ConfigError(f"set {', '.join(bad)} as generate's own argument (max_new_tokens=…, do_sample/temperature), "
                          f"not viasd_{bad[0]}")
    set_unsupported = [k for k in UNSUPPORTED if kwargs.get(k) not in (None, False, [])]
    unknown = [k for k in kwargs if k not in READ and k not in UNSUPPORTED]
    if set_unsupported or unknown:
        name = (set_unsupported or unknown)[0]
        raise ConfigError(f"generate argument {name!r} is not supported by viasd's custom_generate; method knobs go "
                          f"as viasd_<knob>= (e.g. viasd_gamma=3), generation ones as max_new_tokens, do_sample, "
                          f"temperature, top_k, top_p, eos_token_id, stop_strings")
    ids = _prompt(kwargs)
    gc = kwargs.get("generation_config") or model.generation_config
    draft = kwargs.get("assistant_model")
    tok = kwargs.get("tokenizer") or _IdsOnly(model.get_output_embeddings().out_features
                                              if model.get_output_embeddings() is not None else model.config.vocab_size)
    name = pair_name or "hf-" + Path(str(getattr(model.config, "_name_or_path", "") or "model").rstrip("/")).name
    pair = pair_from_models(model, tok, draft, name=str(name))
    gen = _gen_knobs(kwargs, gc, ids.shape[1])
    try:
        out = viasd_generate(pair, ids, method, seed=seed, **gen, **knobs)
    except ConfigError as e:
        if "needs a draft model" not in str(e):
            raise
        raise ConfigError(f"viasd_method={method!r} drafts with a draft model: pass assistant_model=<a small model "
                          "sharing the target's tokenizer>, or a model-free drafter: "
                          "viasd_drafter={'name': 'ngram'}") from None
    new = torch.tensor([out.tokens], dtype=ids.dtype, device=ids.device)
    if pair.is_encoder_decoder:
        start = int(model.generation_config.decoder_start_token_id if model.generation_config.decoder_start_token_id
                    is not None else model.config.decoder_start_token_id)
        seq = torch.cat([torch.full((1, 1), start, dtype=ids.dtype, device=ids.device), new], 1)
    else:
        seq = torch.cat([ids, new], 1)
    if not _setting("return_dict_in_generate", kwargs, gc):
        return seq
    cls = GenerateEncoderDecoderOutput if pair.is_encoder_decoder else GenerateDecoderOnlyOutput
    return cls(sequences=seq)
