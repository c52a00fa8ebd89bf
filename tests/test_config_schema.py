"""Run ids of existing configs survive the typed configs (ConfigStore schemas, conf/drafter).

A run's id hashes its resolved config (:func:`viasd.harness.runner.identity`), and finished runs
are found again by it, so the ids below were recorded before the method/drafter/generation
schemas existed and must not change — except once, on purpose: a pair's shipped DIMR masks
(``pair.options.slim_layers``) left the pair's identity for the ``inputs`` of the methods that read
one (docs/migration.md), which gave the SmolLM2 runs new ids. The ``inputs`` node (input-file hashes) is left empty here:
it does not depend on the config schemas, and the test must not depend on the data folder.
"""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf, open_dict

from viasd.config import GenerationConfig, to_dataclass
from viasd.engine.drafters import DrafterConfig
from viasd.errors import ConfigError
from viasd.harness import identity as ident_mod
from viasd.harness import runner
from viasd.methods.api import METHODS, method_config
from viasd.methods.sd import SDConfig
from viasd.paths import PROJECT_ROOT
from viasd.tracking.store import run_id_for

CONF = PROJECT_ROOT / "conf"

#: ``overrides`` -> run id, recorded on the commit before the schemas (SmolLM2: after the mask move).
EXPECTED = {
    'pair=smollm2 task=prompts method=ar': 'smollm2__ar__prompts__3e358a48d6',
    'pair=smollm2 task=prompts method=sd': 'smollm2__sd__prompts__fa0a0e4270',
    'pair=smollm2 task=prompts method=sd_ngram': 'smollm2__sd_ngram__prompts__c204bfdcd9',
    'pair=smollm2 task=prompts method=sd_hybrid': 'smollm2__sd_hybrid__prompts__08c6fcbfdc',
    'pair=smollm2 task=prompts method=cascade_sd': 'smollm2__cascade_sd__prompts__54901d7d8f',
    'pair=smollm2 task=prompts method=faster_cascades': 'smollm2__faster_cascades__prompts__de2626a87f',
    'pair=smollm2 task=prompts method=via_sd': 'smollm2__via_sd__prompts__54e076e409',
    'pair=smollm2 task=prompts method=viasd': 'smollm2__via_sd__prompts__54e076e409',
    'pair=smollm2 task=prompts method=hf_assisted': 'smollm2__hf_assisted__prompts__8620962b53',
    'pair=smollm2 task=humaneval method=ar': 'smollm2__ar__humaneval__3c3d36f9ab',
    'pair=smollm2 task=humaneval method=sd': 'smollm2__sd__humaneval__dcfcecac3d',
    'pair=smollm2 task=humaneval method=sd_ngram': 'smollm2__sd_ngram__humaneval__a6fa6b7384',
    'pair=smollm2 task=humaneval method=sd_hybrid': 'smollm2__sd_hybrid__humaneval__e2833321c9',
    'pair=smollm2 task=humaneval method=cascade_sd': 'smollm2__cascade_sd__humaneval__52c061de9b',
    'pair=smollm2 task=humaneval method=faster_cascades': 'smollm2__faster_cascades__humaneval__28334177c9',
    'pair=smollm2 task=humaneval method=via_sd': 'smollm2__via_sd__humaneval__afe627ee65',
    'pair=smollm2 task=humaneval method=viasd': 'smollm2__via_sd__humaneval__afe627ee65',
    'pair=smollm2 task=humaneval method=hf_assisted': 'smollm2__hf_assisted__humaneval__b0ec4320ad',
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
    '': 'smollm2__sd_ngram__prompts__c204bfdcd9',
    'pair=tiny-llama': 'tiny-llama__sd_ngram__prompts__edde4e2ea5',
    'method=sd method.drafter.name=model pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__sd__xsum__2e6f1ce1fb',
    'method=via_sd method.drafter.name=model pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__via_sd__xsum__2f736a56ac',
    'method=faster_cascades method.drafter.name=model pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__faster_cascades__xsum__6cf0974847',
    'method=sd method.drafter.name=ngram pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__sd_ngram__xsum__6a4e15329e',
    'method=via_sd method.drafter.name=ngram pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__via_sd__xsum__fcdfd88691',
    'method=faster_cascades method.drafter.name=ngram pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__faster_cascades__xsum__463f105e07',
    'method=sd method.drafter.name=hybrid pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__sd_hybrid__xsum__9802b01808',
    'method=via_sd method.drafter.name=hybrid pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__via_sd__xsum__86e499f1fe',
    'method=faster_cascades method.drafter.name=hybrid pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__faster_cascades__xsum__f8f1a164f2',
    'method=sd method.drafter.name=self pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__sd_self__xsum__02758c0196',
    'method=via_sd method.drafter.name=self pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__via_sd__xsum__58dbbfed42',
    'method=faster_cascades method.drafter.name=self pair=smollm2 pair.options.draft=trained task=xsum task.n_examples=6 generation.max_new_tokens=48': 'smollm2__faster_cascades__xsum__e199216b7c',
    'method=sd_ngram method.drafter.name=hybrid': 'smollm2__sd_hybrid__prompts__a1b0f0b915',
    'method=sd_ngram method.drafter.ngram_max=4': 'smollm2__sd_ngram__prompts__18fc537a2b',
    'method=sd method.gamma=1 pair=tiny-llama task.n_examples=2 generation.max_new_tokens=8': 'tiny-llama__sd__prompts__b3690afd5a',
    'method=via_sd method.tau_accept=1.1 method.tau_slim=0.3 method.tau_escalate=0.5 method.slim.mask=every_other': 'smollm2__via_sd__prompts__d738feb4f7',
    'method=via_sd method.slim.mask=[0,1,2] method.slim.keep_ratio=0.5': 'smollm2__via_sd__prompts__0ea54da708',
    'method=viasd method.drafter.name=ngram method.tau_accept=0.9 task=xsum': 'smollm2__via_sd__xsum__bd56f75d15',
    'method=faster_cascades method.rule=chow method.alpha=0.1': 'smollm2__faster_cascades__prompts__44ec17f62f',
    'method=cascade_sd method.gamma=6': 'smollm2__cascade_sd__prompts__dbf9b37fc3',
    'method=sd method.drafter.length_policy=confidence method.drafter.min_confidence=0.3': 'smollm2__sd__prompts__4cb9ebd2c8',
    'method=sd generation.temperature=0.7 generation.top_p=0.9 seed=3': 'smollm2__sd__prompts__5299c6ceb9',
}


@pytest.fixture(scope="module")
def run_ids():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ident_mod, "input_files", lambda cfg: {})
        mp.setattr(ident_mod, "draft_prompts_identity", lambda options: {})  # the recipe's draft, data folder or not
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


def test_a_shipped_mask_names_only_the_runs_that_read_it(run_ids):
    """Shipping one more mask in a pair config keeps every run id, except those of runs that read it."""

    def with_new_mask(*overrides: str) -> str:
        cfg = _compose(*overrides)
        with open_dict(cfg):
            cfg.pair.options.slim_layers["0.40"] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 29]
        return run_id_for(runner.identity(cfg))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ident_mod, "input_files", lambda cfg: {})
        mp.setattr(ident_mod, "draft_prompts_identity", lambda options: {})  # the recipe's draft, data folder or not
        for base in ("pair=smollm2 task=prompts method=ar", "pair=smollm2 task=prompts method=sd"):
            assert with_new_mask(*base.split()) == run_ids[base]
        via = ("pair=smollm2", "task=prompts", "method=via_sd")
        assert with_new_mask(*via) == run_id(*via)  # reads the keep-0.8 mask, not the new one
        assert with_new_mask(*via, "method.slim.keep_ratio=0.4") != run_id(*via, "method.slim.keep_ratio=0.4")
