"""Where an EAGLE head lives on disk: a fresh head for a target, and the folder it is saved in and loaded from.

**The folder** (:func:`save_head` / :func:`load_head`): the EAGLE-3 layout — ``config.json``
(a Llama config with ``draft_vocab_size`` and ``target_hidden_size``, plus a ``viasd_eagle`` block
this project writes: feature layers, whether it has its own LM head, the target's fingerprint) and
``model.safetensors`` (or ``pytorch_model.bin``, read with ``weights_only=True``) with keys
``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``. Nothing in a
head folder is executed. Every bad folder is one :class:`~viasd.errors.ConfigError` naming the fix.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from viasd.engine.eagle import EagleHead, HeadSpec, feature_layers_of, same_target, target_fingerprint
from viasd.errors import ConfigError

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
TORCH_BIN = "pytorch_model.bin"
TRAIN_HINT = "python -m experiments.train_eagle pair=<pair> out=<head>"


def new_head(target, feature_layers: list[int] | None = None, draft_ids: torch.Tensor | None = None,
             intermediate: int | None = None, seed: int = 0) -> EagleHead:
    """A freshly initialised head for ``target`` (attention shape, norms and rotary base from its config).

    ``feature_layers``: ``hidden_states`` indices (default ``[-1]``: the last layer's output);
    ``draft_ids``: ``LongTensor[Vd]`` the target ids of a reduced head's rows (default: the full
    vocabulary through the target's shared LM head). Its decoder layer starts as a copy of the
    target's last layer where shapes allow (attention over ``[emb ; hidden]``: the hidden half gets
    the copy), its norm and LM-head rows as the target's.
    """
    c = target.config
    V = target.get_input_embeddings().weight.shape[0]
    H = int(c.hidden_size)
    draft_vocab = None if draft_ids is None else int(draft_ids.numel())
    heads = int(c.num_attention_heads)
    spec = HeadSpec(hidden=H, target_hidden=H, vocab=V, draft_vocab=int(draft_vocab or V), heads=heads,
                    kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
                    intermediate=int(intermediate or getattr(c, "intermediate_size", 4 * H)),
                    rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
                    rope_theta=float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
                    max_positions=int(getattr(c, "max_position_embeddings", 16384)),
                    feature_layers=list(feature_layers or [-1]),
                    own_lm_head=draft_ids is not None,
                    meta={"target": target_fingerprint(target)})
    torch.manual_seed(seed)
    head = EagleHead(spec).to(target.get_input_embeddings().weight.device)
    with torch.no_grad():
        if draft_ids is not None:
            head.set_vocab(draft_ids.to(head.d2t.device))
        F = len(spec.feature_layers)
        head.fc.weight.zero_()
        for f in range(F):  # start as the mean of the feature layers (the last one alone: identity)
            head.fc.weight[:, f * H:(f + 1) * H] += torch.eye(H, device=head.fc.weight.device) / F
        _init_from_target(head, target)
    return head.bind(target)


def _init_from_target(head: EagleHead, target) -> None:
    """Start the head's layer, norm and LM-head rows from the target's last layer, final norm and
    LM head wherever the shapes match (the attention's hidden half gets the target's projections, the
    embedding half starts at zero): the head begins near "run the target's last layer again"."""
    src = getattr(getattr(target, "model", None), "layers", None)
    last = src[-1] if src is not None and len(src) else None
    H = head.spec.hidden

    def put(dst: torch.Tensor, w: torch.Tensor | None) -> None:
        if w is not None and tuple(w.shape) == tuple(dst.shape):
            dst.copy_(w.detach().float())

    attn, mlp = head.midlayer.self_attn, head.midlayer.mlp
    if last is not None:
        for proj in ("q_proj", "k_proj", "v_proj"):
            w = getattr(getattr(getattr(last, "self_attn", None), proj, None), "weight", None)
            dst = getattr(attn, proj).weight
            dst.zero_()
            put(dst[:, H:], w)
        put(attn.o_proj.weight, getattr(getattr(last.self_attn, "o_proj", None), "weight", None))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            put(getattr(mlp, proj).weight, getattr(getattr(getattr(last, "mlp", None), proj, None), "weight", None))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w = getattr(getattr(last, norm, None), "weight", None)
            if w is not None and type(getattr(last, norm)).__name__.startswith(("Llama", "Qwen2", "Mistral")):
                put(getattr(head.midlayer, norm).weight, w)
                if norm == "input_layernorm":
                    put(head.midlayer.hidden_norm.weight, w)
    final = getattr(getattr(target, "model", None), "norm", None)
    if final is not None and type(final).__name__ in ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm"):
        put(head.norm.weight, final.weight)
    if head.lm_head is not None:
        out = target.get_output_embeddings().weight.detach().float()
        head.lm_head.weight.copy_(out[head.target_ids.to(out.device)].to(head.lm_head.weight.device))


def save_head(head: EagleHead, folder: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of ``head`` into ``folder`` (created); returns it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    save_file(state, str(folder / SAFETENSORS), metadata={"format": "pt"})
    (folder / CONFIG).write_text(json.dumps(head.spec.to_config(), indent=2, sort_keys=True) + "\n")
    return folder


def head_sha256(folder: str | Path) -> str:
    """sha256 over the head's ``config.json`` and weight file (what a run id records)."""
    folder = Path(folder)
    h = hashlib.sha256()
    for name in (CONFIG, SAFETENSORS, TORCH_BIN):
        p = folder / name
        if p.is_file():
            h.update(name.encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weight file's tensors, read without executing code (one error line when missing/truncated)."""
    retrain = f"re-download the head or retrain it: {TRAIN_HINT}"
    if (folder / SAFETENSORS).is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(folder / SAFETENSORS))
        except (SafetensorError, OSError, ValueError) as e:
            raise ConfigError(f"head weights {folder / SAFETENSORS} are unreadable or truncated ({e}); {retrain}") from None
    if (folder / TORCH_BIN).is_file():
        try:
            return torch.load(folder / TORCH_BIN, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001  (truncated zip, pickle that is not plain tensors)
            raise ConfigError(f"head weights {folder / TORCH_BIN} are unreadable, truncated or not plain tensors "
                              f"({type(e).__name__}); {retrain}") from None
    raise ConfigError(f"no head weights in {folder} (expected {SAFETENSORS} or {TORCH_BIN}); {retrain}")


def load_head(path: str | Path, target) -> EagleHead:
    """Load a head folder for ``target`` (fp32 weights moved to the target's device), checked.

    Errors (one line each, naming the fix): a missing folder or ``config.json``, a missing or
    truncated weight file, a head for another hidden size or vocabulary (another target or
    tokenizer), a head this project trained for another target, a vocabulary map that does not fit
    the target (``d2t`` pointing outside it, ``t2d`` of another size or not matching ``d2t``).
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"method.drafter.path={path}: no such head folder; train one with {TRAIN_HINT} "
                          f"or point drafter.path at an EAGLE-3 head folder")
    if not (folder / CONFIG).is_file():
        raise ConfigError(f"head folder {folder} has no {CONFIG}; it is not an EAGLE head (or is incomplete): "
                          f"retrain it with {TRAIN_HINT}")
    try:
        cfg = json.loads((folder / CONFIG).read_text())
    except ValueError as e:
        raise ConfigError(f"{folder / CONFIG} is not valid JSON ({e}); retrain the head: {TRAIN_HINT}") from None
    tc = target.config
    n_layers = int(tc.num_hidden_layers)
    V = target.get_input_embeddings().weight.shape[0]
    Ht = int(tc.hidden_size)
    try:
        spec = HeadSpec.from_config(cfg, n_layers)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{folder / CONFIG} lacks a head field ({e}); retrain the head: {TRAIN_HINT}") from None
    if spec.target_hidden != Ht or spec.hidden != Ht:
        raise ConfigError(f"head {folder} reads hidden size {spec.target_hidden} (width {spec.hidden}) but the "
                          f"target's is {Ht}: it was trained for another target; train one for this pair: {TRAIN_HINT}")
    if spec.vocab != V:
        raise ConfigError(f"head {folder} is for a {spec.vocab}-token vocabulary but the target has {V}: another "
                          f"tokenizer; train one for this pair: {TRAIN_HINT}")
    bad = [i for i in feature_layers_of(spec, n_layers) if not 0 <= i <= n_layers]
    if bad:
        raise ConfigError(f"head {folder} reads feature layers {spec.feature_layers} but the target has {n_layers} "
                          f"layers: another target; train one for this pair: {TRAIN_HINT}")
    mine = spec.meta.get("target")
    if mine and not same_target(mine, target_fingerprint(target)):
        raise ConfigError(f"head {folder} was trained on another target of the same shape (its fingerprint differs); "
                          f"train one for this pair: {TRAIN_HINT}")
    weights = _read_weights(folder)
    spec.own_lm_head = "lm_head.weight" in weights
    if not spec.own_lm_head and spec.draft_vocab != V:
        raise ConfigError(f"head {folder} has draft_vocab_size {spec.draft_vocab} but no lm_head.weight; "
                          f"re-download or retrain it: {TRAIN_HINT}")
    head = EagleHead(spec)
    _check_vocab_map(weights, spec, folder)
    weights = {k: v for k, v in weights.items() if not k.startswith(("embed_tokens.", "rotary."))}
    if "t2d" not in weights:
        weights["t2d"] = head.t2d
    if "d2t" not in weights:
        weights["d2t"] = head.d2t
    result = head.load_state_dict(weights, strict=False)
    if result.missing_keys or result.unexpected_keys:
        what = result.missing_keys[:3] or result.unexpected_keys[:3]
        raise ConfigError(f"head {folder} does not match the EAGLE-3 layout (keys {what} missing or unexpected, "
                          f"or of another shape); retrain it: {TRAIN_HINT}")
    device = target.get_input_embeddings().weight.device
    return head.float().to(device).eval().bind(target)


def _check_vocab_map(weights: dict[str, torch.Tensor], spec: HeadSpec, folder: Path) -> None:
    """The ``d2t``/``t2d`` map of a head file fits the target (one error line naming the fix otherwise)."""
    fix = f"the head's vocabulary map does not fit this target; retrain the head for it: {TRAIN_HINT}"
    lm = weights.get("lm_head.weight")
    if lm is not None and tuple(lm.shape) != (spec.draft_vocab, spec.hidden):
        raise ConfigError(f"head {folder}: lm_head.weight is {tuple(lm.shape)}, config says "
                          f"({spec.draft_vocab}, {spec.hidden}); {fix}")
    d2t, t2d = weights.get("d2t"), weights.get("t2d")
    if d2t is None:
        if spec.draft_vocab != spec.vocab:
            raise ConfigError(f"head {folder} has a reduced vocabulary ({spec.draft_vocab} tokens) but no d2t map; {fix}")
        return
    if d2t.ndim != 1 or d2t.numel() != spec.draft_vocab:
        raise ConfigError(f"head {folder}: d2t has {d2t.numel()} entries, draft_vocab_size is {spec.draft_vocab}; {fix}")
    ids = torch.arange(d2t.numel()) + d2t.long()
    if d2t.numel() and (int(ids.min()) < 0 or int(ids.max()) >= spec.vocab):
        raise ConfigError(f"head {folder}: d2t maps draft tokens to target ids up to {int(ids.max())} outside the "
                          f"target's {spec.vocab}-token vocabulary; {fix}")
    if ids.unique().numel() != ids.numel():
        raise ConfigError(f"head {folder}: d2t maps two draft tokens to one target token; {fix}")
    if t2d is not None:
        if t2d.numel() != spec.vocab:
            raise ConfigError(f"head {folder}: t2d has {t2d.numel()} entries but the target has {spec.vocab} tokens; {fix}")
        if int(t2d.bool().sum()) != spec.draft_vocab or not bool(t2d.bool()[ids].all()):
            raise ConfigError(f"head {folder}: t2d does not mark exactly the target tokens d2t maps to; {fix}")
