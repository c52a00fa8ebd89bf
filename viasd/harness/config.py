"""Typed configs for Hydra: the structured-config schemas registered in its ConfigStore.

The ``method``, ``drafter`` and ``generation`` YAMLs extend a schema registered here (Hydra's
structured config schema pattern, e.g. ``conf/method/sd.yaml``:
``defaults: [base_sd, /drafter@drafter: model, _self_]``), so composition is typed: a value of
the wrong type (``method.gamma=abc``) or an unknown key (``method.gama=4``) fails at compose time
with Hydra's error naming the key, and :func:`~viasd.config.to_dataclass` /
``OmegaConf.to_object`` turn a composed node into its dataclass. Range checks stay in the
classes' ``validate()``.

Schemas (config group / name):

* ``method/base_<name>`` for every built-in method: its config class plus the ``name`` key;
* ``drafter/base_drafter``: :class:`~viasd.engine.drafters.DrafterConfig`, extended by
  ``conf/drafter/{model,ngram,hybrid,self,cascade}.yaml``;
* ``generation/base_generation``: :class:`~viasd.config.GenerationConfig`.

Importing :mod:`viasd.harness` registers them (before any composition of ``conf/config.yaml``).

Run ids hash the resolved config (:func:`viasd.harness.runner.identity`). A schema fills in keys
that the YAMLs did not write before the schemas existed; :data:`IDENTITY_UNSET` lists them with
the value they then hold, and :func:`drop_unset` leaves them out of the identity at that value,
so every run id recorded before the schemas stays valid (``tests/test_config_schema.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra.core.config_store import ConfigStore

from viasd.config import GenerationConfig
from viasd.engine.drafters import DrafterConfig
from viasd.methods.registry import BUILTIN, METHODS

#: ``dotted key -> value``: keys a schema adds that older composed configs lacked, left out of a
#: run's identity while they hold this value (``lookup_min: null`` is conf/drafter/ngram.yaml's).
IDENTITY_UNSET: dict[str, Any] = {
    "generation.stop_strings": [],
    "generation.eos_token_ids": None,
    "method.drafter.lookup_min": None,
    # The slim verifier's sub-layer masks and shared prefix (issue 27): defaults reproduce the older runs.
    "method.slim.space": "layers",
    "method.slim.share_prefix": True,
    # DIMR search: sub-layer space, in-domain calibration, held-out split, confident top-1, streaming bounds.
    "search.space": "layers",
    "search.calibration_runs": [],
    "search.held_out": 0.0,
    "search.tau_slim": 0.6,
    "search.memo_mib": 1024,
    "search.stat_mib": 64,
    "search.keep_first": 1,
    "search.cache_mib": 0,
}


def drop_unset(resolved: dict[str, Any]) -> dict[str, Any]:
    """``resolved`` (a resolved config dict, changed in place) without the :data:`IDENTITY_UNSET` keys
    that hold their unset value."""
    for dotted, unset in IDENTITY_UNSET.items():
        *path, key = dotted.split(".")
        node = resolved
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node and node[key] == unset:
            del node[key]
    return resolved


def method_schema(name: str) -> type:
    """The schema of ``conf/method/<name>.yaml``: method ``name``'s config class plus its ``name`` key."""
    cls = METHODS.get(name).config_cls
    return dataclasses.make_dataclass(f"{cls.__name__}Schema", [("name", str, dataclasses.field(default=name))],
                                      bases=(cls,))


def register_configs() -> None:
    """Store the method, drafter and generation schemas in Hydra's ConfigStore."""
    cs = ConfigStore.instance()
    for name in BUILTIN:
        cs.store(group="method", name=f"base_{name}", node=method_schema(name))
    cs.store(group="drafter", name="base_drafter", node=DrafterConfig)
    cs.store(group="generation", name="base_generation", node=GenerationConfig)
