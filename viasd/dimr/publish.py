"""Published DIMR masks: the searched masks committed runs read, in the results store.

A run of ``method.slim.mask: auto`` records the sha256 of the mask file it read among its inputs
(its run id follows it), so a mask is published as its exact bytes, at
``results/runs/_masks/<pair>/<mask name>`` (:func:`~viasd.dimr.masks.published_mask_path`), where
``mask: auto`` reads it on a fresh clone (:func:`~viasd.dimr.masks.find_mask`), beside the search
run that made it — the search's identity: pair, model revisions, search config and seed, every
trial, the kept layers, KL, search seconds. :func:`publish_masks` is what ``python -m
experiments.store publish`` runs after copying the runs:

* a DIMR search run publishes its mask: the file the search wrote, else the cache's file of that
  name, else the artifact rebuilt from the run's own records (:func:`rebuilt_artifact`) — each
  taken only when its sha256 is the one the run's summary recorded;
* a run that read a ``mask: auto`` artifact publishes that artifact (the sha256 its meta records:
  the file it read, the cache's, or rebuilt from the search run that recorded that sha256) and
  that search run.

A published mask is never replaced by other bytes: the runs that read it would change id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from viasd.config import to_dataclass
from viasd.dimr.masks import mask_name, mask_path, published_mask_path
from viasd.dimr.search import SearchConfig
from viasd.errors import ConfigError
from viasd.models.pairs import store_name
from viasd.tracking.proof import CHAIN_KEY
from viasd.tracking.results import publish
from viasd.tracking.store import RunStores
from viasd.utils.fs import atomic_write_bytes, json_text

#: Keys a search run's summary has and its mask artifact has not (``viasd.harness.dimr_runs``, the store).
SUMMARY_ONLY = ("path", "method", "task", "n_examples", "mask_sha256", "run_id", "examples_lines", "examples_sha256",
                "record_sha256")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rebuilt_artifact(folder: Path) -> bytes | None:
    """The mask artifact a finished DIMR search run wrote, rebuilt from its folder: the summary (less
    :data:`SUMMARY_ONLY`), the search config and the trials (``examples.jsonl``, less the store's checksum
    chain links), written as the
    search writes it. None unless the bytes hash to the summary's ``mask_sha256`` (e.g. a
    :class:`SearchConfig` field added since the search ran)."""
    summary = json.loads((folder / "summary.json").read_text())
    config = yaml.safe_load((folder / "config.yaml").read_text())
    trials = [{k: v for k, v in json.loads(line).items() if k != CHAIN_KEY}  # the store's link, not the trial's
              for line in (folder / "examples.jsonl").read_text().splitlines() if line.strip()]
    art: dict[str, Any] = {k: v for k, v in summary.items() if k not in SUMMARY_ONLY}
    art["config"] = asdict(to_dataclass(SearchConfig, config.get("search") or {}, where="search"))
    art["trials"] = trials
    data = json_text(art).encode()
    return data if _sha(data) == summary.get("mask_sha256") else None


def _mask_bytes(sha: str, files: list[Path], search: Path | None) -> bytes | None:
    """The bytes of sha256 ``sha``: the first of ``files`` that has them, else rebuilt from ``search``."""
    for f in files:
        if f.is_file() and _sha(data := f.read_bytes()) == sha:
            return data
    return rebuilt_artifact(search) if search is not None else None


def _write(target: Path, data: bytes) -> str:
    if target.is_file():
        if target.read_bytes() == data:
            return f"its DIMR mask already published at {target}"
        raise ConfigError(f"{target} is published with other contents (the runs that read it would change id); "
                          "remove it first to replace it")
    atomic_write_bytes(target, data)
    return f"its DIMR mask published to {target}"


def search_run_of(stores: RunStores, pair: str, sha: str) -> dict[str, Any] | None:
    """The finished DIMR search run of ``pair`` whose summary records mask sha256 ``sha`` (None: none read)."""
    for store in stores.stores:
        for folder in sorted(store.root.glob(f"{pair}__dimr_search__*")):
            try:
                recorded = json.loads((folder / "summary.json").read_text()).get("mask_sha256")
            except (OSError, ValueError):
                continue
            if recorded == sha and (found := stores.find(folder.name)) is not None:
                return found
    return None


def _publish_search(found: dict[str, Any], dest: Path) -> str | None:
    s = found["summary"]
    key = (str(s["pair"]), float(s["keep_ratio"]), str(s["objective"]), str(s.get("space", "layers")))
    if Path(str(s.get("path", ""))).name != mask_name(*key[1:]):
        return f"its mask was written to {s.get('path')} (search.out), not where mask: auto reads: not published"
    data = _mask_bytes(s["mask_sha256"], [Path(str(s["path"])), mask_path(*key)], found["path"])
    if data is None:
        raise ConfigError(f"cannot publish the DIMR mask of {found['path'].name}: no file here has its sha256 "
                          f"{s['mask_sha256'][:12]}… and its records do not rebuild it")
    return _write(published_mask_path(*key, root=dest), data)


def _publish_read(found: dict[str, Any], stores: RunStores, dest: Path) -> tuple[str | None, str | None]:
    """Publish the ``mask: auto`` artifact a decoding run read: ``(what happened, its search run id)``."""
    config = found["config"] or {}
    meta = json.loads((found["path"] / "meta.json").read_text()) if (found["path"] / "meta.json").is_file() else {}
    slim = (config.get("method") or {}).get("slim") or {}
    read = (meta.get("inputs") or {}).get("method.slim.mask") or {}
    if str(slim.get("mask")) != "auto" or not read.get("path"):  # no artifact read (a shipped list, an ablation)
        return None, None
    key = (store_name(config["pair"]), float(slim.get("keep_ratio", 0.5)), str(slim.get("objective", "kl")),
           str(slim.get("space", "layers")))
    search = search_run_of(stores, key[0], read["sha256"])
    data = _mask_bytes(read["sha256"], [Path(read["path"]), mask_path(*key)], search["path"] if search else None)
    if data is None:
        raise ConfigError(f"cannot publish the DIMR mask {found['path'].name} read ({read['path']}, sha256 "
                          f"{read['sha256'][:12]}…): no file here has it and no search run here records it; "
                          "a fresh clone cannot make this run")
    return _write(published_mask_path(*key, root=dest), data), search["run_id"] if search else None


def publish_masks(run_ids: list[str], stores: RunStores, dest: Path) -> list[tuple[str, str]]:
    """Publish into the results store ``dest`` the DIMR masks of ``run_ids`` (search runs: theirs;
    runs that read a ``mask: auto`` artifact: it and its search run); returns ``(run id, what happened)``."""
    out = []
    for run_id in run_ids:
        found = stores.find(run_id)
        if found is None:
            continue
        if (found["summary"] or {}).get("method") == "dimr_search" and found["summary"].get("mask_sha256"):
            what, search = _publish_search(found, dest), None
        else:
            what, search = _publish_read(found, stores, dest)
        out += [(run_id, what)] if what else []
        if search is not None:
            out += publish([search], stores, dest)
    return out
