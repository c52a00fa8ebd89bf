"""Run ids of existing configs survive the typed configs (ConfigStore schemas, conf/drafter).

A run's id hashes its resolved config (:func:`viasd.harness.runner.identity`), and finished runs
are found again by it, so the ids below were recorded before the method/drafter/generation
schemas existed and must not change. The ``inputs`` node (input-file hashes) is left empty here:
it does not depend on the config schemas, and the test must not depend on the data folder.
"""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from viasd.config import GenerationConfig, to_dataclass
from viasd.engine.drafters import DrafterConfig
from viasd.errors import ConfigError
from viasd.harness import runner
from viasd.methods.api import METHODS, method_config
from viasd.methods.sd import SDConfig
from viasd.paths import PROJECT_ROOT
from viasd.tracking.store import run_id_for

CONF = PROJECT_ROOT / "conf"

#: ``overrides`` -> run id, recorded on the commit before the schemas.
EXPECTED = {
    'pair=smollm2 task=prompts method=ar': 'smollm2__ar__prompts__61f403bb35',
    'pair=smollm2 task=prompts method=sd': 'smollm2__sd__prompts__66f65726b4',
    'pair=smollm2 task=prompts method=sd_ngram': 'smollm2__sd_ngram__prompts__e3c5b2aa6d',
    'pair=smollm2 task=prompts method=sd_hybrid': 'smollm2__sd_hybrid__prompts__58806cdbc9',
    'pair=smollm2 task=prompts method=cascade_sd': 'smollm2__cascade_sd__prompts__7a25a85cd2',
    'pair=smollm2 task=prompts method=faster_cascades': 'smollm2__faster_cascades__prompts__c673ec1d81',
    'pair=smollm2 task=prompts method=via_sd': 'smollm2__via_sd__prompts__11b5bc693d',
    'pair=smollm2 task=prompts method=viasd': 'smollm2__via_sd__prompts__11b5bc693d',
    'pair=smollm2 task=prompts method=hf_assisted': 'smollm2__hf_assisted__prompts__b5634bc6f2',
    'pair=smollm2 task=humaneval method=ar': 'smollm2__ar__humaneval__883b4c0fb0',
    'pair=smollm2 task=humaneval method=sd': 'smollm2__sd__humaneval__c8ece7181c',
    'pair=smollm2 task=humaneval method=sd_ngram': 'smollm2__sd_ngram__humaneval__b5ba20f398',
    'pair=smollm2 task=humaneval method=sd_hybrid': 'smollm2__sd_hybrid__humaneval__57e8cffb67',
    'pair=smollm2 task=humaneval method=cascade_sd': 'smollm2__cascade_sd__humaneval__ffcee0c0ad',
    'pair=smollm2 task=humaneval method=faster_cascades': 'smollm2__faster_cascades__humaneval__754007035b',
    'pair=smollm2 task=humaneval method=via_sd': 'smollm2__via_sd__humaneval__efd379a4b8',
    'pair=smollm2 task=humaneval method=viasd': 'smollm2__via_sd__humaneval__efd379a4b8',
    'pair=smollm2 task=humaneval method=hf_assisted': 'smollm2__hf_assisted__humaneval__b78ef93eba',
    'pair=tiny-llama task=prompts method=ar': 'tiny-llama__ar__prompts__376bac6524',
    'pair=tiny-llama task=prompts method=sd': 'tiny-llama__sd__prompts__1f8fd63e4d',
    'pair=tiny-llama task=prompts method=sd_ngram': 'tiny-llama__sd_ngram__prompts__edde4e2ea5',
    'pair=tiny-llama task=prompts method=sd_hybrid': 'tiny-llama__sd_hybrid__prompts__411a7f6441',
    'pair=tiny-llama task=prompts method=cascade_sd': 'tiny-llama__cascade_sd__prompts__c39bd1fa1e',
    'pair=tiny-llama task=prompts method=faster_cascades': 'tiny-llama__faster_cascades__prompts__63f2e3ccfb',
    'pair=tiny-llama task=prompts method=via_sd': 'tiny-llama__via_sd__prompts__2d3375ce83',
    'pair=tiny-llama task=prompts method=viasd': 'tiny-llama__via_sd__prompts__2d3375ce83',
    'pair=tiny-llama task=prompts method=hf_assisted': 'tiny-llama__hf_assisted__prompts__25f270aca2',
    'pair=tiny-llama task=humaneval method=ar': 'tiny-llama__ar__humaneval__555bf3806d',
    'pair=tiny-llama task=humaneval method=sd': 'tiny-llama__sd__humaneval__7153690190',
    'pair=tiny-llama task=humaneval method=sd_ngram': 'tiny-llama__sd_ngram__humaneval__3645238ea8',
    'pair=tiny-llama task=humaneval method=sd_hybrid': 'tiny-llama__sd_hybrid__humaneval__f95fa80e3b',
    'pair=tiny-llama task=humaneval method=cascade_sd': 'tiny-llama__cascade_sd__humaneval__62431d8571',
    'pair=tiny-llama task=humaneval method=faster_cascades': 'tiny-llama__faster_cascades__humaneval__9207fd1f97',
    'pair=tiny-llama task=humaneval method=via_sd': 'tiny-llama__via_sd__humaneval__b3747872e8',
    'pair=tiny-llama task=humaneval method=viasd': 'tiny-llama__via_sd__humaneval__b3747872e8',
    'pair=tiny-llama task=humaneval method=hf_assisted': 'tiny-llama__hf_assisted__humaneval__51b6cb3a86',
    '': 'smollm2__sd_ngram__prompts__e3c5b2aa6d',
    'pair=tiny-llama': 'tiny-llama__sd_ngram__prompts__edde4e2ea5',
    'method=sd method.drafter.name=model pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__sd__xsum__2e37078087',
    'method=via_sd method.drafter.name=model pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__via_sd__xsum__20b9f6de29',
    'method=faster_cascades method.drafter.name=model pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__faster_cascades__xsum__4c0161c10d',
    'method=sd method.drafter.name=ngram pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__sd_ngram__xsum__72bffc7c4c',
    'method=via_sd method.drafter.name=ngram pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__via_sd__xsum__7f293de3c7',
    'method=faster_cascades method.drafter.name=ngram pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__faster_cascades__xsum__bd10e11119',
    'method=sd method.drafter.name=hybrid pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__sd_hybrid__xsum__3035303822',
    'method=via_sd method.drafter.name=hybrid pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__via_sd__xsum__c8a637c20b',
    'method=faster_cascades method.drafter.name=hybrid pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__faster_cascades__xsum__7ca78047fd',
    'method=sd method.drafter.name=self pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__sd_self__xsum__ab7d5619ff',
    'method=via_sd method.drafter.name=self pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__via_sd__xsum__b8ce17a246',
    'method=faster_cascades method.drafter.name=self pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__faster_cascades__xsum__35c1192dad',
    'method=sd_ngram method.drafter.name=hybrid': 'smollm2__sd_hybrid__prompts__da457d28c1',
    'method=sd_ngram method.drafter.ngram_max=4': 'smollm2__sd_ngram__prompts__f36f9f5777',
    'method=sd method.gamma=1 pair=tiny-llama task.n_examples=2 generation.max_new_tokens=8': 'tiny-llama__sd__prompts__b3690afd5a',
    'method=via_sd method.tau_accept=1.1 method.tau_slim=0.3 method.tau_escalate=0.5 method.slim.mask=every_other': 'smollm2__via_sd__prompts__bfeeb9697d',
    'method=via_sd method.slim.mask=[0,1,2] method.slim.keep_ratio=0.5': 'smollm2__via_sd__prompts__02e7eaf12a',
    'method=viasd method.drafter.name=ngram method.tau_accept=0.9 task=xsum': 'smollm2__via_sd__xsum__942fb3578d',
    'method=faster_cascades method.rule=chow method.alpha=0.1': 'smollm2__faster_cascades__prompts__4eab8d9d8f',
    'method=cascade_sd method.gamma=6': 'smollm2__cascade_sd__prompts__d6ab00e0e0',
    'method=sd method.drafter.length_policy=confidence method.drafter.min_confidence=0.3': 'smollm2__sd__prompts__41853a9095',
    'method=sd generation.temperature=0.7 generation.top_p=0.9 seed=3': 'smollm2__sd__prompts__93fb45ccc8',
}


@pytest.fixture(scope="module")
def run_ids():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "input_files", lambda cfg: {})
        yield {k: run_id(*k.split()) for k in EXPECTED}


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_id(*overrides: str) -> str:
    return run_id_for(runner.identity(_compose(*overrides)))


@pytest.mark.parametrize("overrides", list(EXPECTED))
def test_run_ids_unchanged(overrides, run_ids):
    assert run_ids[overrides] == EXPECTED[overrides]


@pytest.mark.parametrize("method", sorted(p.stem for p in (CONF / "method").glob("*.yaml")))
def test_every_method_config_is_typed_by_its_schema(method):
    cfg = _compose(f"method={method}")
    cls = METHODS.get(cfg.method.name).config_cls  # sd_ngram, sd_hybrid: sd; viasd: via_sd
    assert OmegaConf.get_type(cfg.method).__name__ == cls.__name__ + "Schema"
    assert OmegaConf.get_type(cfg.generation) is GenerationConfig
    assert isinstance(method_config(cfg.method.name, cfg.method), cls)
    if "drafter" in cfg.method:
        assert OmegaConf.get_type(cfg.method.drafter) is DrafterConfig


def test_method_yamls_select_a_drafter_instead_of_copying_it():
    for path in (CONF / "method").glob("*.yaml"):
        assert "drafter" not in (yaml.safe_load(path.read_text()) or {}), f"{path.name}: use /drafter@drafter: NAME"


@pytest.mark.parametrize("drafter", sorted(p.stem for p in (CONF / "drafter").glob("*.yaml")))
def test_drafter_group_override(drafter):
    cfg = _compose("method=faster_cascades", f"drafter@method.drafter={drafter}")
    assert cfg.method.drafter.name == drafter
    typed = method_config("faster_cascades", cfg.method).drafter
    assert isinstance(typed, DrafterConfig) and typed.name == drafter and typed.lookup_min == 2


def test_group_override_and_name_override_keep_the_variants_meaning():
    """`drafter@method.drafter=X` on sd is the sd_X variant (same run); `method.drafter.name=X` keeps
    the method's drafter options (its run id as before the drafter group)."""
    assert run_id("method=sd", "drafter@method.drafter=ngram") == run_id("method=sd_ngram")
    assert run_id("method=sd", "drafter@method.drafter=hybrid") == run_id("method=sd_hybrid")
    assert _compose("method=sd", "method.drafter.name=ngram").method.drafter.lookup_min == 2
    assert _compose("method=viasd").method == _compose("method=via_sd").method


@pytest.mark.parametrize("override", ["method.gamma=abc", "method.gama=3", "method.drafter.max_gamma=x",
                                      "generation.temperature=hot", "method.drafter=ngram"])
def test_wrong_type_or_unknown_key_fails_at_compose_time(override):
    with pytest.raises(ConfigCompositionException):
        _compose("method=sd", override)


@pytest.mark.parametrize("node,match", [
    ({"gamma": "abc"}, r"method\.gamma must be an integer, got 'abc'"),
    ({"drafter": {"max_gamma": 1.5}}, r"method\.drafter\.max_gamma must be an integer"),
    ({"drafter": {"bogus": 1}}, r"unknown DrafterConfig keys \['bogus'\] at method\.drafter\.bogus; accepted: "),
    ({"drafter": "ngram"}, r"method: .*not a subclass of DrafterConfig"),
])
def test_to_dataclass_errors_are_one_line(node, match):
    with pytest.raises(ConfigError, match=match) as e:
        to_dataclass(SDConfig, node, where="method")
    assert "\n" not in str(e.value)
