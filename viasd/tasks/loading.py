"""Reading a task's rows: the offline file under the data folder or the pinned hub parquet files.

This module owns ``source: auto | local | hub`` (:func:`resolve_source`), loading rows
through ``datasets`` (:func:`load_rows`, :func:`hub_data_files`; every failure one
:class:`~viasd.errors.ConfigError` line naming the fix), the check that a local prompt or data
file is UTF-8 text (:func:`check_text_file`: a binary or undecodable file is named with the
byte offset of its first bad byte, before anything parses it) and the order-free rank of a row
in the seeded example subset (:func:`subset_rank`). :class:`viasd.tasks.base.Task` uses it.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from viasd.errors import ConfigError
from viasd.paths import data_dir, data_file, default_data_dir

__all__ = ["SOURCES", "check_text_file", "hub_data_files", "load_rows", "resolve_source", "subset_rank"]


SOURCES = ("auto", "local", "hub")
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")
_ALIASES = {"offline": "local"}


def hub_data_files(hub: Mapping[str, Any], hub_root: str | None = None) -> str:
    """The parquet ``data_files`` pattern of a hub dataset spec.

    ``hub`` is ``{path, name, split, revision, files}``; ``files`` is a glob inside the
    dataset repository at ``revision`` (e.g. ``default/test/*.parquet`` on XSum's
    ``refs/convert/parquet``). Without ``hub_root`` the pattern is an ``hf://`` URL
    (revision URL-encoded); with it, ``<hub_root>/<path>/<files>`` on disk — a local
    mirror of the hub layout (air-gapped machines, tests).
    """
    files = str(hub["files"])
    if hub_root:
        return str(Path(hub_root).expanduser() / str(hub["path"]) / files)
    rev = quote(str(hub.get("revision") or "main"), safe="")
    return f"hf://datasets/{hub['path']}@{rev}/{files}"


def _load_hub(hub: Mapping[str, Any], task_name: str, hub_root: str | None, local: Path | None = None) -> Any:
    import datasets  # heavy (≈1 s): imported on the first load, not with the package

    where = hub_root or "the Hugging Face hub"
    missing = f"no offline file at {local} (VIASD_DATA_DIR) and " if local else ""
    try:
        if hub.get("files"):
            return datasets.load_dataset(
                "parquet", data_files={"rows": hub_data_files(hub, hub_root)}, split="rows",
                cache_dir=_datasets_cache_dir(),
            )
        return datasets.load_dataset(
            hub["path"], hub.get("name"), split=hub.get("split", "test"), revision=hub.get("revision")
        )
    except Exception as e:  # network, auth, missing files: one line, never a traceback
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(
            f"task {task_name!r}: {missing}could not load {hub['path']}@{hub.get('revision') or 'main'} from "
            f"{where} ({type(e).__name__}: {first}); on a machine with network run `python -m experiments.data "
            f"fetch {task_name}` and copy VIASD_DATA_DIR here, or use task.source=local"
        ) from None


def resolve_source(source: str, offline_file: str | None, hub: Mapping[str, Any] | None, task_name: str) -> str:
    """``local`` or ``hub``: what ``source`` (``auto | local | hub``; ``offline`` = ``local``) reads.

    ``auto`` reads the offline file when it exists under the data folder (or as an absolute
    path), else the hub when the task has a hub dataset, else ``local`` (whose missing-file
    error names both fixes).
    """
    source = _ALIASES.get(str(source), str(source))
    if source not in SOURCES:
        raise ConfigError(
            f"task {task_name!r}: source must be auto, local (offline) or hub, got {source!r}"
        )
    if source != "auto":
        return source
    if offline_file:
        p = Path(offline_file)
        base = data_dir(required=False)
        if (p.is_absolute() and p.is_file()) or (base is not None and (base / offline_file).is_file()):
            return "local"
    return "hub" if hub and hub.get("path") else "local"


def load_rows(
    source: str,
    offline_file: str | None,
    hub: Mapping[str, Any] | None,
    task_name: str,
    hub_root: str | None = None,
) -> list[dict[str, Any]]:
    """Rows of a task's dataset as plain dicts, through ``datasets.load_dataset``.

    ``source`` (after :func:`resolve_source`) ``local`` reads ``offline_file`` (relative to
    the data folder, see :func:`viasd.paths.data_file`, or absolute) with the ``json``
    builder, which needs no network. ``hub`` reads the pinned parquet files of ``hub``
    (see :func:`hub_data_files`), or ``load_dataset(path, name, split, revision)`` when
    the spec has no ``files``; rows are in the hub's schema (tasks map them with
    ``normalize_hub_row``). Every failure is a one-line ConfigError naming the fix.
    """
    import datasets  # heavy (≈1 s): imported on the first load, not with the package

    requested = _ALIASES.get(str(source), str(source))
    source = resolve_source(source, offline_file, hub, task_name)
    if source == "hub":
        if not hub or not hub.get("path"):
            raise ConfigError(
                f"task {task_name!r} has no hub dataset; read its offline file instead (source: offline or local)"
            )
        local = None
        if requested == "auto" and offline_file:
            local = Path(offline_file) if Path(offline_file).is_absolute() else default_data_dir() / offline_file
        return [dict(r) for r in _load_hub(hub, task_name, hub_root, local)]
    if not offline_file:
        raise ConfigError(f"task {task_name!r}: source is local but offline_file is not set")
    p = Path(offline_file)
    if p.is_absolute():
        if not p.is_file():
            raise ConfigError(
                f"task {task_name!r}: data file not found: {p}. Fix offline_file or set "
                "VIASD_DATA_DIR and use a path relative to it"
            )
    else:
        p = data_file(offline_file, task=task_name)
    if p.suffix.lower() not in _COMPRESSED:  # datasets reads compressed JSON lines itself
        check_text_file(p, f"task {task_name!r}: data file", "fix or fetch it again (python -m experiments.data)")
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset("json", data_files=str(p), split="train", cache_dir=_datasets_cache_dir())
    except Exception as e:  # not JSON lines: one line naming the file, never the builder's traceback
        cause = e.__cause__ or e
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
        raise ConfigError(f"task {task_name!r}: data file {p} is not JSON lines ({type(cause).__name__}: {first}); "
                          "fix or fetch it again (python -m experiments.data)") from None
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
    return [dict(r) for r in ds]


def check_text_file(path: Path, what: str = "data file", fix: str = "") -> None:
    """Raise a one-line ConfigError unless ``path`` is UTF-8 text: a NUL byte (a binary file) or
    an undecodable byte is named with its byte offset. Reads the file in 16 MiB chunks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    fix = f"; {fix}" if fix else ""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 24)
            pending = len(decoder.getstate()[0])
            nul = chunk.find(b"\0")
            if nul != -1:
                raise ConfigError(f"{what} {path} is binary, not text (NUL byte at byte offset {offset + nul}){fix}")
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                at = offset - pending + e.start
                raise ConfigError(f"{what} {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at byte offset "
                                  f"{at} cannot be decoded){fix}") from None
            if not chunk:
                return
            offset += len(chunk)


def subset_rank(seed: int, key: str) -> str:
    """Sort key of one row for the seeded subset: sha256 of ``"<seed>:<key>"`` (order-free)."""
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()



def _datasets_cache_dir() -> str:
    base = os.environ.get("VIASD_CACHE_DIR")
    root = Path(base) / "datasets" if base else Path(tempfile.gettempdir()) / "viasd-datasets-cache"
    root.mkdir(parents=True, exist_ok=True)
    return str(root)
