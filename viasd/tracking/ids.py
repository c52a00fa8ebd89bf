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
import re
from pathlib import Path
from typing import Any

from viasd.errors import ConfigError

#: Config keys that do not change a run's result (excluded from its identity hash). ``threads``
#: enters the hash only when it is not :data:`DEFAULT_THREADS` (see :func:`config_hash`).
VOLATILE_KEYS = ("tracking", "hydra", "threads", "exp")

#: The thread count of ``conf/config.yaml``: a run at this count keeps the id it had before threads
#: entered the identity; any other count (``threads=2``, ``threads=null``) is another run.
DEFAULT_THREADS = 1

#: What a part of a run folder's name (pair, method label, task) may be: letters, digits, ``.``,
#: ``_``, ``+``, ``-``, starting with a letter or digit, no ``..``, at most :data:`NAME_MAX` characters.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
NAME_MAX = 100

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
    if "threads" in cfg and cfg["threads"] != DEFAULT_THREADS:  # the ar match reads threads: so does the id
        ident["threads"] = cfg["threads"]
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


def name_problem(name: str) -> str:
    """Why ``name`` cannot be a part of a run folder's name ("" when it can): the one rule of
    :data:`NAME_RE` / :data:`NAME_MAX`, so no name reaches outside the store (``..``, ``/``, an
    absolute path, NUL) or past the file system's name length."""
    if len(name) > NAME_MAX:
        return f"is {len(name)} characters long (at most {NAME_MAX})"
    if not NAME_RE.fullmatch(name) or ".." in name:
        return ("is not a plain name (letters, digits and . _ + -, starting with a letter or digit, no '..'; "
                "no '/', absolute path, space or control character)")
    return ""


def safe_name(name: str, what: str) -> str:
    """``name`` when it may be a part of a run folder's name, else one :class:`ConfigError` line
    naming ``what`` (the config key) and the rule."""
    problem = name_problem(name)
    if problem:
        raise ConfigError(f"{what}={name[:60]!r}{'…' if len(name) > 60 else ''} {problem}; choose another {what}")
    return name


def run_id_for(cfg: dict[str, Any], renamed: bool = True) -> str:
    """``<pair>__<method label>__<task>__<hash>`` for a resolved config dict; a part that is not a
    plain name (:func:`name_problem`) is a :class:`ConfigError`."""
    parts = [safe_name(str((cfg.get("pair") or {}).get("name", "pair")), "pair.name"),
             safe_name(method_label(cfg.get("method"), renamed), "method.name"),
             safe_name(str((cfg.get("task") or {}).get("name", "task")), "task.name")]
    return "__".join(parts + [config_hash(cfg)])


def run_ids_of(cfg: dict[str, Any]) -> set[str]:
    """Every id a folder holding ``cfg`` as its ``config.yaml`` may carry: today's, the one it was
    written under for a method renamed since, and the one of the code before method labels (the
    bare method name: ``sd`` for every drafter)."""
    bare = "__".join([str((cfg.get("pair") or {}).get("name", "pair")), str((cfg.get("method") or {}).get("name")),
                      str((cfg.get("task") or {}).get("name", "task")), config_hash(cfg)])
    return {run_id_for(cfg), run_id_for(cfg, renamed=False), bare}  # run_id_for checked each part of bare


def run_id_problem(run_id: str) -> str:
    """Why ``run_id`` cannot name a folder of a run store ("" when it can): each ``__``-separated
    part a plain name (:func:`name_problem`), the whole at most 255 characters (a file name)."""
    if len(run_id) > 255:
        return f"is {len(run_id)} characters long (a run folder name is at most 255)"
    return next((p for part in run_id.split("__") if (p := name_problem(part))), "")
