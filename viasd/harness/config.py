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
* ``generation/base_generation``: :class:`~viasd.config.GenerationConfig`;
* ``base_config``: :class:`RunConfig`, the schema of ``conf/config.yaml`` itself: its top-level
  scalars (``seed``, ``dry_run``, ``threads``) are typed, so ``seed=abc`` fails at compose time,
  before a model loads or a run folder opens; the groups under it keep their own schemas.

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
    "method.drafter.path": None,  # drafter=eagle's head folder (issue 65): no other drafter reads one
    "exp": None,  # RunConfig's node for +exp=NAME; a single run has none
    "task.truncate": None,  # over-long prompts are refused (viasd.tasks.length)
    "dry_run_strict": False,  # conf/config.yaml: only a dry run reads it (issue 43)
    "schedule": "sequential",  # conf/config.yaml; interleaved cells carry "interleaved" (viasd.harness.interleave)
    # via_sd's gate variants and free audit (issue 26): at these values a run is what it was before them.
    "method.tier1_needs_slim_argmax": False,
    "method.tier1_min_draft_confidence": 0.0,
    "method.audit": True,
    # The slim verifier's sub-layer masks and shared prefix (issue 27): defaults reproduce the older runs.
    "method.slim.space": "layers",
    "method.slim.share_prefix": True,
    # VIA-SD's gate choice and the learned gate (issue 44): thresholds is the gate every older run used.
    "method.gate": "thresholds",
    "method.gate_path": None,
    "method.gate_threshold": 0.5,
    # A hierarchy of routed verifiers (issue 61): without a list, method.slim is the one verifier every older run used.
    "method.verifiers": [],
    "search.margin_alpha": 0.5,
    "search.margin_beta": 0.3,
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


#: ``hub dataset -> commit``: hub revisions pinned (issue 28) after runs that read these tasks' offline
#: files had recorded ``revision: main``. A run that reads its offline file (hashed in ``inputs``; the hub
#: revision is not one of its inputs) keeps ``main`` in its identity at these pins, so its run id stays valid.
PINNED_AFTER_RUNS: dict[str, str] = {
    "abisee/cnn_dailymail": "3adf6249f0cc8409a97a4d38471529ef5f7dc496",
    "wmt/wmt14": "b199e406369ec1b7634206d3ded5ba45de2fe696",
    "google-research-datasets/nq_open": "5dd9790a83002ad084ddeb7c420dc716852c6f28",
    "google-research-datasets/mbpp": "4bb6404fdc6cacfda99d4ac4205087b89d32030c",
}


def unpin_local_hub(resolved: dict[str, Any]) -> dict[str, Any]:
    """``resolved`` (changed in place) with ``task.hub.revision`` back at ``main`` where it holds a
    :data:`PINNED_AFTER_RUNS` pin; call it only for a run that reads the task's offline file."""
    hub = (resolved.get("task") or {}).get("hub")
    if isinstance(hub, dict) and PINNED_AFTER_RUNS.get(hub.get("path")) == hub.get("revision"):
        hub["revision"] = "main"
    return resolved


@dataclasses.dataclass
class RunConfig:
    """Schema of ``conf/config.yaml``: the typed top-level scalars and one node per config group
    (each group's node is typed by its own schema, or not at all)."""

    seed: int = 0
    dry_run: bool = False
    dry_run_strict: bool = False  # with dry_run: a cell that does not fit the visible GPUs fails the dry run
    threads: int | None = 1
    schedule: str = "sequential"  # interleaved cells: "interleaved" (viasd.harness.interleave)
    pair: Any = None
    method: Any = None
    task: Any = None
    tracking: Any = None
    search: Any = None
    generation: Any = None
    exp: Any = None


def drop_unset(resolved: dict[str, Any]) -> dict[str, Any]:
    """``resolved`` (a resolved config dict, changed in place) without the :data:`IDENTITY_UNSET` keys
    that hold their unset value."""
    for dotted, unset in IDENTITY_UNSET.items():
        *path, key = dotted.split(".")  # a top-level key has an empty path
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
    """Store the top-level, method, drafter and generation schemas in Hydra's ConfigStore."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=RunConfig)
    for name in BUILTIN:
        cs.store(group="method", name=f"base_{name}", node=method_schema(name))
    cs.store(group="drafter", name="base_drafter", node=DrafterConfig)
    cs.store(group="generation", name="base_generation", node=GenerationConfig)
