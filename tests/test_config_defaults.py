"""One source of defaults: a method built from Python (``decode(..., method_cfg=None)``) and from the CLI
(Hydra's composition of ``conf/method/<name>.yaml``) is the same method.

The dataclasses (``viasd.methods.*Config``, :class:`~viasd.engine.drafters.DrafterConfig`) own every
default; a YAML file only selects its schema, its drafter and what makes it a variant (``sd_ngram`` is
``sd`` with the ``ngram`` drafter), and never restates a default (which would be a second source).
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hydra import compose, initialize_config_dir

import viasd.harness  # noqa: F401  (registers the schemas the YAMLs extend)
from viasd.engine.drafters import DrafterConfig
from viasd.methods.api import method_config
from viasd.methods.via_sd import SlimConfig, VIASDConfig
from viasd.paths import PROJECT_ROOT

CONF = PROJECT_ROOT / "conf"
METHOD_FILES = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
DRAFTER_FILES = sorted(p.stem for p in (CONF / "drafter").glob("*.yaml"))


@pytest.fixture(scope="module")
def composed():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield {m: compose(config_name="config", overrides=[f"method={m}"]).method for m in METHOD_FILES} | {
            f"drafter/{d}": compose(config_name="config", overrides=["method=sd", f"drafter@method.drafter={d}"]
                                    ).method.drafter for d in DRAFTER_FILES}


@pytest.mark.parametrize("name", METHOD_FILES)
def test_cli_and_python_build_the_same_method(name, composed):
    node = composed[name]
    from_cli = method_config(str(node.name), node)
    python_side = {"drafter": {"name": str(node.drafter.name)}} if "drafter" in node else None  # the variant's drafter
    from_python = method_config(str(node.name), python_side)
    assert dataclasses.asdict(from_cli) == dataclasses.asdict(from_python)


@pytest.mark.parametrize("name", DRAFTER_FILES)
def test_every_drafter_file_is_its_dataclass(name, composed):
    assert method_config("sd", {"drafter": composed[f"drafter/{name}"]}).drafter == DrafterConfig(name=name)


def _restated(node: dict, default, at: str) -> list[str]:
    out = []
    for key, value in node.items():
        if key in ("defaults", "name"):
            continue
        own = getattr(default, key, None)
        if dataclasses.is_dataclass(own) and isinstance(value, dict):
            out += _restated(value, own, f"{at}.{key}")
        elif value == own:
            out.append(f"{at}.{key}")
    return out


@pytest.mark.parametrize("name", METHOD_FILES)
def test_method_files_do_not_restate_a_default(name, composed):
    raw = yaml.safe_load((CONF / "method" / f"{name}.yaml").read_text()) or {}
    default = method_config(str(composed[name].name), None)
    assert not _restated(raw, default, "method"), "the dataclass owns these defaults: drop them from the YAML"


def test_the_slim_verifier_default_is_the_clis():
    """Issue 61: SlimConfig.keep_ratio was 0.5 in Python and 0.8 in conf/method/via_sd.yaml."""
    assert SlimConfig().keep_ratio == 0.8 == VIASDConfig().slim.keep_ratio
