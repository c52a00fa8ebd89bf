"""experiments.build_draft's Hydra config: DraftBuildConfig fields as typed top-level keys, its flags."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from experiments.build_draft import draft_build_config
from viasd.distill.config import DraftBuildConfig
from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="build_draft", overrides=list(overrides))


def test_defaults_are_the_dataclass_defaults():
    cfg = composed()
    assert draft_build_config(cfg) == DraftBuildConfig()
    assert cfg.pair.name == "smollm2" and not (cfg.cost or cfg.no_data or cfg.rebuild or cfg.quiet)


def test_overrides_set_typed_fields():
    cfg = composed("pair=smollm2", "steps=200", "layers=2", "lr=1e-3", "init_from_target=false", "name=mine")
    want = dataclasses.replace(DraftBuildConfig(), steps=200, layers=2, lr=1e-3, init_from_target=False, name="mine")
    assert draft_build_config(cfg) == want


@pytest.mark.parametrize("override", ["steps=abc", "stepz=3", "init_from_target=maybe"])
def test_bad_overrides_are_refused(override):
    with pytest.raises(ConfigCompositionException):
        composed(override)


def test_other_pairs_are_refused():
    with pytest.raises(ConfigError, match="smollm2 pair's draft only"):
        draft_build_config(composed("pair=tiny-llama"))


def test_flags_become_overrides_and_errors_are_one_line():
    """`--cost` etc. still work; a refused pair ends with one line before any model loads."""
    out = subprocess.run([sys.executable, "-m", "experiments.build_draft", "pair=tiny-llama", "--cost", "--no-data"],
                         cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip() == "error: experiments.build_draft builds the smollm2 pair's draft only, got pair=tiny-llama"
