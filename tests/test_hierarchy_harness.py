"""The harness over a ``via_sd`` hierarchy (``method.verifiers``, issue 61): every verifier's pair-shipped
``auto`` mask enters the run id, the dry run and the DIMR prerequisite check see every verifier, and the
replay table's "forward calls" column shows every verifier's calls (depth 1: as before)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf, open_dict

from experiments.replay import call_models, table
from viasd.errors import ConfigError
from viasd.harness import identity as ident_mod
from viasd.harness import prereq
from viasd.harness.grid import compose_cells
from viasd.harness.identity import layers_sha256, shipped_mask_input
from viasd.harness.runner import identity
from viasd.tracking.store import run_id_for

TWO_AUTO = "method.verifiers=[{mask: 'auto@0.5'}, {mask: 'every_other@0.75'}]"
TWO_ABLATIONS = "method.verifiers=[{mask: 'every_other@0.5'}, {mask: 'first_k@0.75'}]"
L50, L80 = [0, 2, 4], [0, 1, 2, 3]


def _cfg(**method):
    return OmegaConf.create({"pair": {"options": {"slim_layers": {"0.50": L50, "0.80": L80}}},
                             "method": {"slim": {"mask": "auto", "keep_ratio": 0.8}, **method}})


def test_every_verifiers_shipped_auto_mask_is_an_input_and_no_list_is_unchanged():
    assert shipped_mask_input(_cfg(), {}) == {"method.slim.mask": layers_sha256(L80)}  # today's single verifier
    got = shipped_mask_input(_cfg(verifiers=[{"mask": "auto@0.5"}, {"mask": "first_k@0.75"},
                                             {"mask": "auto", "keep_ratio": 0.8}, {"mask": "auto@0.33"}]), {})
    assert got == {"method.slim.mask": layers_sha256(L80), "method.verifiers.0.mask": layers_sha256(L50),
                   "method.verifiers.2.mask": layers_sha256(L80)}  # first_k: no mask read; 0.33: none shipped
    cached = {"method.verifiers.0.mask": "a published or cached file's hash"}
    assert "method.verifiers.0.mask" not in shipped_mask_input(_cfg(verifiers=[{"mask": "auto@0.5"}]), cached)
    other = _cfg(verifiers=[{"mask": "auto@0.5", "objective": "tv"}, {"mask": "auto@0.5", "space": "sublayers"},
                            {"mask": "auto@abc"}])
    assert set(shipped_mask_input(other, {})) == {"method.slim.mask"}  # pairs ship whole-layer KL masks only


def test_a_hierarchys_run_id_follows_the_shipped_mask_each_verifier_reads(monkeypatch):
    monkeypatch.setattr(ident_mod, "input_files", lambda cfg: {})  # no published/cached mask file: the shipped list
    monkeypatch.setattr(ident_mod, "draft_prompts_identity", lambda options: {})

    def rid(*extra, edit=None):
        cfg = compose_cells(["pair=smollm2", "task=prompts", "method=via_sd", *extra])[0]
        if edit:
            with open_dict(cfg):
                cfg.pair.options.slim_layers[edit] = [0, 1, 29]
        return run_id_for(identity(cfg))

    assert rid() == rid(edit="0.50")  # no list: reads the 0.80 list only, as before
    assert rid(TWO_AUTO) != rid(TWO_AUTO, edit="0.50")  # verifier 1 reads the 0.50 list
    assert rid(TWO_AUTO) == rid(TWO_AUTO, edit="0.40")


def _no_fallback(*overrides):
    cfg = compose_cells(["pair=tiny-llama", "task=prompts", "method=via_sd", "dry_run=true", *overrides])[0]
    with open_dict(cfg):
        cfg.pair.options.slim_fallback = None  # mask: auto has nothing to read
    return cfg


def test_the_prerequisite_check_and_the_dry_run_see_every_verifier(capsys):
    ablations = _no_fallback(TWO_ABLATIONS)
    # before: method.slim's unused auto@0.8 stopped the grid ("search first") though no verifier reads a mask
    assert prereq.not_ready([ablations]) is None and prereq.missing_masks([ablations]) == {}
    prereq.require_mask(ablations)
    assert prereq.describe_masks(ablations) == ["v1 (method.verifiers[0]): explicit ablation: every_other",
                                                "v2 (method.verifiers[1]): explicit ablation: first_k"]
    searched = _no_fallback(TWO_AUTO)
    need = prereq.missing_masks([searched])
    assert len(need) == 1 and "search.keep_ratio=0.5" in next(iter(need))  # verifier 1's budget, not 0.8
    with pytest.raises(ConfigError, match=r"^method\.verifiers\[0\]: no DIMR mask .* keep_ratio=0\.50") as e:
        prereq.require_mask(searched)
    assert "\n" not in str(e.value)
    assert prereq.describe_masks(_no_fallback()) == [prereq.cell_mask_source(_no_fallback()).describe()]

    import viasd.harness.dryrun as dr

    dr.dry_run([ablations], None)
    out = capsys.readouterr().out
    assert "    slim mask    v1 (method.verifiers[0]): explicit ablation: every_other\n" \
           "    slim mask    v2 (method.verifiers[1]): explicit ablation: first_k\n" in out


def test_the_forward_calls_column_shows_every_verifier_and_depth_one_as_before():
    one = {"method": "via_sd", "target_calls": 10, "slim_calls": 5, "draft_calls": 7, "exact": True}
    deep = {**one, "method": "via_sd_2", "slim2_calls": 3, "slim10_calls": 1}
    assert call_models(one) == ["target", "slim", "draft", "self_draft"]
    assert call_models(deep) == ["target", "slim", "slim2", "slim10", "draft", "self_draft"]
    out = table([one, deep])
    assert "| target 10 / slim 5 / draft 7 " in out  # the depth-1 cell, as the table printed it before
    assert "| target 10 / slim 5 / slim2 3 / slim10 1 / draft 7 " in out
