"""Run ids: what names a run folder of the store, and the content hashes that go into it.

``run_id_for(cfg)`` is ``<pair>__<method label>__<task>__<hash>``, the hash being the first 10
hex digits of the SHA-256 of the resolved identity config without the volatile keys
(:data:`VOLATILE_KEYS`). The identity config itself — resolved config plus the SHA-256 of every
input file — is built by :func:`viasd.harness.runner.identity`; a run folder's ``config.yaml``
holds it, so :func:`run_ids_of` of that file names the folder (``viasd.tracking.proof``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: Config keys that do not change a run's result (excluded from its identity hash).
VOLATILE_KEYS = ("tracking", "hydra", "threads", "exp")

# Method names runs were stored under before a rename (docs/migration.md): read as the new name.
RENAMED_METHODS = {"viasd": "via_sd"}


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (the content part of a run's identity)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def config_hash(cfg: dict[str, Any]) -> str:
    """Stable 10-hex-digit hash of a resolved config without volatile keys."""
    ident = {k: v for k, v in cfg.items() if k not in VOLATILE_KEYS}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:10]


def method_label(method: dict[str, Any] | None, renamed: bool = True) -> str:
    """The method as configured: ``sd`` with a non-model drafter is ``sd_<drafter>`` (``sd_ngram``…).

    ``renamed=False``: the label as runs made before a method rename wrote it (``viasd``).
    """
    method = method or {}
    name = str(method.get("name", "method"))
    name = RENAMED_METHODS.get(name, name) if renamed else name
    drafter = (method.get("drafter") or {}).get("name") if isinstance(method.get("drafter"), dict) else None
    return f"sd_{drafter}" if name == "sd" and drafter and drafter != "model" else name


def run_id_for(cfg: dict[str, Any], renamed: bool = True) -> str:
    """``<pair>__<method label>__<task>__<hash>`` for a resolved config dict."""
    parts = [str((cfg.get("pair") or {}).get("name", "pair")), method_label(cfg.get("method"), renamed),
             str((cfg.get("task") or {}).get("name", "task"))]
    return "__".join(parts + [config_hash(cfg)])


def run_ids_of(cfg: dict[str, Any]) -> set[str]:
    """Every id a folder holding ``cfg`` as its ``config.yaml`` may carry: today's, the one it was
    written under for a method renamed since, and the one of the code before method labels (the
    bare method name: ``sd`` for every drafter)."""
    bare = "__".join([str((cfg.get("pair") or {}).get("name", "pair")), str((cfg.get("method") or {}).get("name")),
                      str((cfg.get("task") or {}).get("name", "task")), config_hash(cfg)])
    return {run_id_for(cfg), run_id_for(cfg, renamed=False), bare}
