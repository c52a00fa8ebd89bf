"""The public Python API: decode with viasd's methods from models already in memory.

What this module owns: the notebook entry points, thin wrappers over the harness's own pieces
(:func:`viasd.methods.api.decode`, :class:`viasd.models.pairs.ModelPair`, the trace writer and the
replay engine), so a result here is the result ``python -m experiments.run`` records for the same
models, prompt and config.

* :func:`pair_from_models` — a :class:`~viasd.models.pairs.ModelPair` from a target, an optional draft
  (and intermediate) and their tokenizer, no YAML and no run store;
* :func:`generate` — one prompt through any registered method (``ar``, ``sd``, ``cascade_sd``,
  ``faster_cascades``, ``via_sd``/``viasd``, ``hf_assisted``, ``hf_prompt_lookup``, or a method file's
  name such as ``sd_ngram``) with its knobs as keyword arguments → a
  :class:`~viasd.engine.result.DecodeResult` (``.text``, ``.tokens``, ``.counters``, ``.summary()``);
* :func:`trace` / :func:`replay_policy` — teacher-force the pair along what was decoded, then replay
  another policy (``via_sd`` thresholds, ``sd`` at another γ, …) on those traces without decoding again.

Method defaults are the method files' (``conf/method/<name>.yaml``, composed as ``experiments.run``
composes ``method=<name>``), so ``generate(pair, p, "cascade_sd")`` decodes what
``experiments.run method=cascade_sd`` decodes. **Batch size is 1**: one prompt per call, like every
method of the harness.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path
from typing import Any

import torch

from viasd.config import GenerationConfig
from viasd.engine.result import DecodeResult
from viasd.errors import ConfigError
from viasd.methods.api import METHODS, decode, method_config
from viasd.models.pairs import ModelPair, check_vocab, vocab_size_of
from viasd.paths import PROJECT_ROOT

__all__ = ["pair_from_models", "generate", "trace", "replay_policy", "method_defaults", "split_knobs",
           "GEN_KNOBS"]

#: Keyword arguments of :func:`generate` that set :class:`~viasd.config.GenerationConfig` fields.
GEN_KNOBS = tuple(f.name for f in dataclasses.fields(GenerationConfig))


def pair_from_models(target, tokenizer, draft=None, *, intermediate=None, name: str = "in_memory",
                     slim_layers: dict[str, list[int]] | None = None) -> ModelPair:
    """A pair from models already loaded (no YAML, no run store); the models are put in eval mode.

    Args:
        target: the verifier, a transformers causal LM (or encoder-decoder) whose logits are ``[1, T, V]``.
        tokenizer: the tokenizer the target was trained with (draft and intermediate share it).
        draft: the draft model (``None``: only model-free drafters — ``method.drafter.name=ngram``,
            ``self``, ``cascade`` — and ``ar`` work).
        intermediate: an optional independent slim verifier (``slim={"mask": "independent"}``).
        name: the pair's name (``via_sd``'s ``slim.mask=auto`` looks up searched masks under it).
        slim_layers: shipped DIMR masks by keep ratio, ``{"0.50": [0, 2, …]}`` (``mask=auto`` reads them).

    Raises one :class:`ConfigError` line when the models' output widths differ or the tokenizer has
    more tokens than the target predicts.
    """
    for role, m in (("target", target), ("draft", draft), ("intermediate", intermediate)):
        if m is not None and not (isinstance(m, torch.nn.Module) and hasattr(m, "config")):
            raise ConfigError(f"{role} must be a loaded transformers model (AutoModelForCausalLM.from_pretrained(...)), "
                              f"got {type(m).__name__}")
    if not callable(tokenizer) or not hasattr(tokenizer, "decode"):
        raise ConfigError(f"tokenizer must be a transformers tokenizer (AutoTokenizer.from_pretrained(...)), "
                          f"got {type(tokenizer).__name__}")
    pair = ModelPair(name=name, target=target.eval(), draft=None if draft is None else draft.eval(),
                     tokenizer=tokenizer, intermediate=None if intermediate is None else intermediate.eval())
    check_vocab(pair)
    if len(tokenizer) > vocab_size_of(target):
        raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the target predicts {vocab_size_of(target)}: "
                          "pass the tokenizer the target was trained with")
    dtype = next(target.parameters()).dtype
    pair.extras["runtime"] = {"dtype": str(dtype).removeprefix("torch."), "backend": "as loaded"}
    if slim_layers:
        pair.extras["slim_layers"] = {f"{float(k):.2f}": list(v) for k, v in slim_layers.items()}
    return pair


@functools.cache
def _composed(name: str) -> dict[str, Any] | None:
    """``conf/method/<name>.yaml`` composed as ``experiments.run method=<name>`` does (None: no such file)."""
    conf = PROJECT_ROOT / "conf"
    if not (conf / "method" / f"{name}.yaml").is_file():
        return None
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from omegaconf import OmegaConf

    import viasd.harness  # noqa: F401  (registers the schemas the method files extend)

    outer = get_gh_backup()  # inside a Hydra app (e.g. experiments.bench): set its GlobalHydra aside, then restore
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            node = compose(config_name="config", overrides=[f"method={name}"]).method
    finally:
        if outer is not None:
            restore_gh_from_backup(outer)
    return OmegaConf.to_container(node, resolve=True)


def method_defaults(method: str) -> tuple[str, dict[str, Any]]:
    """``(registered method name, default knobs)`` of ``method``: a method file's name (``sd``,
    ``sd_ngram``, ``viasd``, …) or a registered method without one (its config class's defaults)."""
    node = _composed(method)
    if node is None:
        spec = METHODS.get(method)  # unknown names: the registry's "Did you mean" line
        return spec.name, dataclasses.asdict(spec.config_cls())
    node = dict(node)  # the composed file is cached: never mutated
    name = str(node.pop("name"))
    return METHODS.get(name).name, node


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def split_knobs(method: str, knobs: dict[str, Any], allow_gen: bool = True) -> tuple[str, Any, dict[str, Any]]:
    """``(method name, typed method config, generation knobs)`` from keyword knobs.

    Top-level method fields (``gamma=3``; nested ones as dicts, ``drafter={"name": "ngram"}``) are
    merged over :func:`method_defaults`; :data:`GEN_KNOBS` go to the generation config. Anything else is
    one ConfigError line listing both sets.
    """
    name, defaults = method_defaults(method)
    fields = [f.name for f in dataclasses.fields(METHODS.get(name).config_cls)]
    unknown = [k for k in knobs if k not in fields and (not allow_gen or k not in GEN_KNOBS)]
    if unknown:
        gen = f"; generation knobs: {', '.join(GEN_KNOBS)}" if allow_gen else ""
        raise ConfigError(f"unknown knob{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for method "
                          f"{method!r}; method knobs: {', '.join(fields)}{gen}")
    mknobs = {k: v for k, v in knobs.items() if k in fields}
    gknobs = {k: v for k, v in knobs.items() if k not in fields}
    return name, method_config(name, _merge(defaults, mknobs)), gknobs


def _prompt_ids(pair: ModelPair, prompt: Any) -> str | torch.Tensor:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) == 1:
            return prompt[0]
        raise ConfigError(f"batch size is 1: got {len(prompt)} prompts; call generate once per prompt")
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
        prompt = torch.tensor([list(prompt)], dtype=torch.long)
    if isinstance(prompt, torch.Tensor):
        if prompt.ndim == 1:
            prompt = prompt[None]
        if prompt.ndim != 2 or prompt.shape[0] != 1:
            raise ConfigError(f"batch size is 1: prompt ids have shape {tuple(prompt.shape)}; pass one row "
                              "(LongTensor[1, P]) per generate call")
        return prompt.to(pair.device)
    raise ConfigError(f"prompt must be text, a list of token ids or LongTensor[1, P], got {type(prompt).__name__}")


def generate(pair: ModelPair, prompt: str | list[int] | torch.Tensor, method: str = "sd", *, seed: int = 0,
             **knobs: Any) -> DecodeResult:
    """Decode one prompt (batch size 1) with ``method`` and its knobs.

    Args:
        pair: from :func:`pair_from_models` (or :func:`viasd.models.pairs.load_pair`).
        prompt: text (encoded as the harness encodes it: no special tokens added when the tokenizer
            has a chat template), a list of token ids, or ``LongTensor[1, P]``.
        method: a registered method or a method file's name (``sd_ngram``).
        seed: seeds the sampling generator (greedy decoding ignores it).
        knobs: method knobs (``gamma=3``, ``tau_accept=0.9``, ``drafter={"name": "ngram"}``,
            ``slim={"mask": "mask.json"}``) and generation knobs (``max_new_tokens``, ``temperature``,
            ``top_k``, ``top_p``, ``stop_strings``, ``ignore_eos``, ``eos_token_ids``).

    Returns:
        The :class:`DecodeResult`: ``.text``, ``.tokens`` (new token ids), ``.counters``
        (drafted/accepted/rounds and the method's own, ``.counters.tiers``), ``.models`` (forward calls
        and seconds per model), ``.summary()`` (the flat dict ``examples.jsonl`` records).
    """
    name, cfg, gknobs = split_knobs(method, knobs)
    gen = GenerationConfig(**gknobs)
    return decode(pair, _prompt_ids(pair, prompt), name, cfg, gen, seed=seed)


def trace(pair: ModelPair, prompts: list[str | torch.Tensor], results: list[DecodeResult],
          folder: str | Path | None = None, *, slim: list[dict[str, Any]] | dict[str, Any] | None = None,
          draft: bool = True, topk: int = 32, temperatures: tuple[float, ...] = (1.0,), max_new_tokens: int | None = None):
    """Teacher-force the pair along what :func:`generate` decoded → a :class:`~viasd.analysis.replay.TraceSet`.

    Args:
        prompts: the prompts given to :func:`generate`, one per result (text or ``LongTensor[1, P]``).
        results: their :class:`DecodeResult` (greedy decodes; a sampled one replays in expectation).
        folder: where the trace files go (default: a new temporary folder).
        slim: ``via_sd`` slim-verifier configs to trace (``{"mask": "every_other", "keep_ratio": 0.5}``);
            the default traces none (``via_sd`` policies then need one).
        draft: trace the draft model too (``sd`` with the model drafter needs it).
        topk: logits kept per row (``>= V``: exact for every gate).
        max_new_tokens: the decodes' limit (default: the longest decode).
    """
    from viasd.analysis.replay import TraceSet
    from viasd.analysis.trace import Example, TraceSettings, subjects_for, trace_run
    from viasd.config import to_dataclass
    from viasd.methods.via_sd import SlimConfig

    if len(prompts) != len(results) or not results:
        raise ConfigError(f"trace needs one prompt per result (got {len(prompts)} prompts, {len(results)} results)")
    slims = [to_dataclass(SlimConfig, s, where="slim") for s in ([slim] if isinstance(slim, dict) else slim or [])]
    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="viasd-trace-"))
    folder.mkdir(parents=True, exist_ok=True)
    examples = [Example(pair.encode(p) if isinstance(p, str) else _prompt_ids(pair, p), list(r.tokens))
                for p, r in zip(prompts, results)]
    settings = TraceSettings(topk, sorted(set(map(float, temperatures))))
    meta = {"run_id": folder.name, "max_new_tokens": int(max_new_tokens or max(len(r.tokens) for r in results)),
            "temperature": 0.0, "top_k": 0, "top_p": 1.0, "encoder_decoder": pair.is_encoder_decoder,
            "method": results[0].method, "task": "api"}
    trace_run(folder, pair, examples, subjects_for(pair, slims, draft and pair.draft is not None), settings, meta,
              log=lambda _msg: None)
    return TraceSet(folder)


def replay_policy(traces, method: str = "via_sd", *, cost=None, **knobs: Any) -> dict[str, Any]:
    """Replay ``method`` with ``knobs`` on :func:`trace`'s traces → a run-like summary (counters,
    ``tier_share/*``, ``exact``; ``predicted_*`` with ``cost``, a :class:`~viasd.analysis.cost.CostModel`).
    Generation knobs do not apply: the trajectory is the traced decode's."""
    from viasd.analysis.replay import Policy, replay

    name, cfg, _ = split_knobs(method, knobs, allow_gen=False)
    return replay(traces, Policy(name, cfg, method), cost)
