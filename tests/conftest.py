"""Shared fixtures: tiny pairs of the four families (built once per session), synthetic offline
data (written once per session), the real data folder when present, quiet logs."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

from tests.helpers.synthetic_data import write_synthetic_data
from viasd.models.pairs import load_pair
from viasd.paths import data_dir

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

FAMILIES = ("llama", "gemma2", "qwen2", "t5")

_PAIRS: dict = {}


def tiny_pair(family: str):
    """The session-cached tiny pair of ``family`` (fp32, CPU)."""
    if family not in _PAIRS:
        _PAIRS[family] = load_pair(f"tiny-{family}")
    return _PAIRS[family]


@pytest.fixture(params=FAMILIES)
def family_pair(request):
    return tiny_pair(request.param)


# The real offline data folder (VIASD_DATA_DIR, or ../shared/data), resolved before any test
# changes the environment; None on a fresh clone.
REAL_DATA_DIR = data_dir(required=False)
needs_real_data = pytest.mark.skipif(
    REAL_DATA_DIR is None,
    reason="real offline data folder not found (set VIASD_DATA_DIR or place it at ../shared/data); "
    "the synthetic-data tests cover the same code",
)


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory):
    """A folder of synthetic offline files in the real files' layout (tests/helpers/synthetic_data.py)."""
    return write_synthetic_data(tmp_path_factory.mktemp("synthetic_data"))


@pytest.fixture
def synthetic_data(synthetic_data_dir, monkeypatch):
    """Point ``VIASD_DATA_DIR`` at the synthetic data for one test."""
    monkeypatch.setenv("VIASD_DATA_DIR", str(synthetic_data_dir))
    return synthetic_data_dir


@pytest.fixture(params=["synthetic", pytest.param("real", marks=needs_real_data)])
def any_data(request, synthetic_data_dir, monkeypatch):
    """``VIASD_DATA_DIR`` set to the synthetic data, then to the real folder (skipped when absent)."""
    d = synthetic_data_dir if request.param == "synthetic" else REAL_DATA_DIR
    monkeypatch.setenv("VIASD_DATA_DIR", str(d))
    return d


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setenv("VIASD_RUNS_DIR", str(d))
    return d


# Varied-length prompts (byte-level tokenizer: roughly one token per character).
PROMPTS = [
    "Hi",
    "The cat sat on the mat.",
    "Once upon a time, in a land far away, there lived a king who loved numbers.",
    "def add(a, b):\n    return a + b\n",
    "Translate to English: Der Hund schläft im Garten.",
    "Q: What is 12 times 7?\nA:",
    "aaaaaaaaaaaaaaaaaaaa",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "Summarize: The council approved the new budget on Tuesday after a long debate about road repairs.",
    "x",
    "Paris is the capital of",
    "import torch\nimport numpy as np\n\nclass Model(torch.nn.Module):",
    "Wer reitet so spät durch Nacht und Wind? Es ist der Vater mit seinem Kind.",
    "<html><body><p>Hello</p></body></html>",
    "The answer is 42. The answer is 42. The answer is",
    "Long prompt: " + "lorem ipsum dolor sit amet " * 6,
    "émoji ✓ ünïcödé",
    "SELECT name FROM users WHERE age > 30",
    "To be, or not to be, that is the question:",
    "In 1969, Neil Armstrong",
]
