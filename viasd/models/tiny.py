"""Tiny randomly initialized model pairs for tests and smoke runs (no download).

Each builder makes a draft and a target of one architecture family (Llama, Mistral, Qwen2,
Qwen3, Gemma2, Gemma3 text, Phi-3, T5) that share a byte-level tokenizer. The target contains the draft: its first layers are the
draft's layers and its extra layers add a damped residual update, so the pair agrees often
(like a real draft/target pair) while the target costs several times more per forward.
"""

from __future__ import annotations

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from viasd.errors import ConfigError

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)
FAMILIES = ("llama", "gemma2", "qwen2", "t5", "mistral", "qwen3", "gemma3", "phi3")


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A 260-token byte-level tokenizer (4 specials + 256 bytes) built offline."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    return fast


def _causal_config(family: str, layers: int, hidden: int, vocab: int) -> transformers.PretrainedConfig:
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,  # byte-level tokens: the real tasks' longest prompts (XSum ~9k) fit
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=hidden // 4)
    if family == "phi3":
        return Phi3Config(**common)
    # Short sliding windows so tests exercise sliding-window layers with long prompts.
    if family == "mistral":
        return MistralConfig(**common, sliding_window=32)
    if family == "gemma2":
        return Gemma2Config(**common, head_dim=hidden // 4, sliding_window=32, final_logit_softcapping=None)
    if family == "gemma3":
        # Local (sliding, own rotary base) and global layers alternate, as in Gemma-3's 5:1 pattern.
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        return Gemma3TextConfig(**common, head_dim=hidden // 4, sliding_window=32, layer_types=types)
    raise ConfigError(f"unknown tiny family {family!r}; choose one of {', '.join(FAMILIES)}")


def _t5_config(layers: int, hidden: int, vocab: int) -> T5Config:
    return T5Config(
        vocab_size=vocab,
        d_model=hidden,
        d_kv=hidden // 4,
        d_ff=hidden * 2,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=4,
        decoder_start_token_id=PAD,
        pad_token_id=PAD,
        eos_token_id=EOS,
        tie_word_embeddings=False,
        initializer_factor=3.0,
    )


_CAUSAL = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "gemma2": Gemma2ForCausalLM,
           "mistral": MistralForCausalLM, "qwen3": Qwen3ForCausalLM, "gemma3": Gemma3ForCausalLM,
           "phi3": Phi3ForCausalLM}


def build_model(family: str, layers: int, hidden: int, vocab: int = 260, seed: int = 0) -> PreTrainedModel:
    """One seeded random model of ``family`` with ``layers`` decoder layers of width ``hidden``."""
    torch.manual_seed(seed)
    if family == "t5":
        model = T5ForConditionalGeneration(_t5_config(layers, hidden, vocab))
    else:
        model = _CAUSAL[family](_causal_config(family, layers, hidden, vocab))
    return model.eval()


def _damp_extra_layers(target: PreTrainedModel, family: str, first_extra: int, damp: float) -> None:
    """Scale the residual contribution of target layers ``>= first_extra`` by ``damp``."""
    with torch.no_grad():
        for name, p in target.named_parameters():
            parts = name.split(".")
            if "layers" in parts:
                idx = int(parts[parts.index("layers") + 1])
            elif "block" in parts:
                idx = int(parts[parts.index("block") + 1])
            else:
                continue
            if idx < first_extra:
                continue
            if family in ("gemma2", "gemma3"):
                # Gemma norms scale by (1 + w): post-norms set the residual branch's scale.
                if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
                    p.fill_(damp - 1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight", ".o.weight", ".wo.weight")):
                p.mul_(damp)


def build_tiny_pair(
    family: str,
    draft_layers: int = 1,
    target_layers: int = 4,
    hidden: int = 64,
    damp: float = 0.3,
    seed: int = 0,
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast]:
    """A (draft, target, tokenizer) triple of one family; the target extends the draft.

    The target's first ``draft_layers`` layers (and embeddings, norms, head) are copies of the
    draft's; its remaining layers are random with their residual branch scaled by ``damp``
    (0 makes target == draft in function, 1 leaves them unrelated beyond shared weights).
    """
    if family not in FAMILIES:
        raise ConfigError(f"unknown tiny family {family!r}; choose one of {', '.join(FAMILIES)}")
    tok = byte_tokenizer()
    vocab = len(tok)
    draft = build_model(family, draft_layers, hidden, vocab, seed)
    target = build_model(family, target_layers, hidden, vocab, seed + 1)
    missing = target.load_state_dict(draft.state_dict(), strict=False)
    if missing.unexpected_keys:
        raise RuntimeError(f"tiny pair construction bug: unexpected keys {missing.unexpected_keys}")
    _damp_extra_layers(target, family, draft_layers, damp)
    if family == "t5":
        target.tie_weights()
    return draft, target, tok
