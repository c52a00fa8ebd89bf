"""Reading a task's rows: the offline file under the data folder or the pinned hub parquet files.

This module owns ``source: auto | local | hub`` (:func:`resolve_source`), loading rows
through ``datasets`` (:func:`load_rows`, :func:`hub_data_files`; every failure one
:class:`~viasd.errors.ConfigError` line naming the fix), the check that a local prompt or data
file is UTF-8 text (:func:`check_text_file`: a binary or undecodable file is named with the
byte offset of its first bad byte, before anything parses it), what the hub path read
(:func:`resolve_hub`) and the order-free rank of a row in the seeded example subset
(:func:`subset_rank`). :class:`viasd.tasks.base.Task` uses it.

**What the hub path read.** A hub revision is a commit in every ``conf/task/*.yaml`` except
XSum's ``refs/convert/parquet``, a branch the hub's parquet converter may rewrite. Before
reading, :func:`resolve_hub` turns the revision into a record ``{path, revision, commit,
files: {name: sha256}}`` (the hub API's commit and LFS hashes; for a ``hub_root`` mirror, the
files' own sha256 and no commit), memoized per process; the rows are then read *at that
commit*, and the runner writes the record into the run's ``meta.json`` (``task_hub``). The
resolver is replaceable (:func:`use_hub_resolver`: tests, air-gapped mirrors of the API).
"""

from __future__ import annotations

import codecs
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from viasd.errors import ConfigError
from viasd.paths import data_dir, data_file, default_data_dir

__all__ = ["SOURCES", "check_text_file", "hub_data_files", "is_commit", "load_rows", "resolve_hub", "resolve_source",
           "subset_rank", "use_hub_resolver"]


SOURCES = ("auto", "local", "hub")
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")
_ALIASES = {"offline": "local"}


_COMMIT = re.compile(r"[0-9a-f]{40}")


def is_commit(revision: Any) -> bool:
    """Whether a hub revision is a full commit hash (not a branch or tag that can move)."""
    return bool(_COMMIT.fullmatch(str(revision or "")))


def hub_data_files(hub: Mapping[str, Any], hub_root: str | None = None, commit: str | None = None) -> str:
    """The parquet ``data_files`` pattern of a hub dataset spec.

    ``hub`` is ``{path, name, split, revision, files}``; ``files`` is a glob inside the
    dataset repository at ``revision`` (e.g. ``default/test/*.parquet`` on XSum's
    ``refs/convert/parquet``), or at ``commit`` when given (what the revision resolved to).
    Without ``hub_root`` the pattern is an ``hf://`` URL (revision URL-encoded); with it,
    ``<hub_root>/<path>/<files>`` on disk — a local mirror of the hub layout (air-gapped
    machines, tests).
    """
    files = str(hub["files"])
    if hub_root:
        return str(Path(hub_root).expanduser() / str(hub["path"]) / files)
    rev = quote(str(commit or hub.get("revision") or "main"), safe="")
    return f"hf://datasets/{hub['path']}@{rev}/{files}"


#: ``resolver(hub spec) -> {"commit": str | None, "files": {name: sha256}}`` (see :func:`resolve_hub`).
HubResolver = Callable[[Mapping[str, Any]], dict[str, Any]]


def hf_api_resolver(hub: Mapping[str, Any]) -> dict[str, Any]:
    """The hub API's answer for a spec: the commit its revision points at and the LFS sha256 (git
    blob id for non-LFS files) of every file matching ``hub["files"]``. Needs the network."""
    from huggingface_hub import HfApi

    info = HfApi().dataset_info(str(hub["path"]), revision=str(hub.get("revision") or "main"), files_metadata=True)
    pattern = str(hub.get("files") or "*")
    files = {s.rfilename: (s.lfs.sha256 if s.lfs else s.blob_id) for s in info.siblings or []
             if fnmatch.fnmatch(s.rfilename, pattern)}
    return {"commit": info.sha, "files": dict(sorted(files.items()))}


def mirror_resolver(hub: Mapping[str, Any], hub_root: str) -> dict[str, Any]:
    """A ``hub_root`` mirror's record: no commit (a mirror has none), the sha256 of each matching file."""
    root = Path(hub_root).expanduser() / str(hub["path"])
    files = {str(f.relative_to(root)): _file_sha256(f) for f in sorted(root.glob(str(hub.get("files") or "*")))}
    return {"commit": None, "files": files}


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_RESOLVER: list[HubResolver] = []  # set by use_hub_resolver (innermost last)
_RESOLVED: dict[str, dict[str, Any]] = {}


@contextlib.contextmanager
def use_hub_resolver(resolver: HubResolver) -> Iterator[None]:
    """Resolve hub specs with ``resolver`` inside the block (tests, an API mirror); clears the memo."""
    _RESOLVER.append(resolver)
    _RESOLVED.clear()
    try:
        yield
    finally:
        _RESOLVER.remove(resolver)
        _RESOLVED.clear()


def resolve_hub(hub: Mapping[str, Any], task_name: str, hub_root: str | None = None, why: str = "") -> dict[str, Any]:
    """What the hub path of a task reads: ``{path, revision, commit, files: {name: sha256}}``.

    Resolved once per process and spec (every cell of a grid reads the same commit of a
    branch); ``commit`` is None for a ``hub_root`` mirror. Failure is one ConfigError line
    (``why`` is put before it, e.g. that the offline file is missing).
    """
    key = json.dumps([dict(hub), hub_root], sort_keys=True, default=str)
    if key not in _RESOLVED:
        try:
            if _RESOLVER:
                got = _RESOLVER[-1](hub)
            elif hub_root:
                got = mirror_resolver(hub, hub_root)
            else:
                got = hf_api_resolver(hub)
            if not got.get("files"):
                raise FileNotFoundError(f"no file matches {hub.get('files')!r}")
        except Exception as e:  # network, auth, unknown revision: one line, never a traceback
            raise _hub_error(task_name, f"{why}could not resolve", hub, hub_root, e) from None
        _RESOLVED[key] = {"path": str(hub["path"]), "revision": str(hub.get("revision") or "main"),
                          "commit": got.get("commit"), "files": dict(got["files"])}
    return _RESOLVED[key]


def _load_hub(hub: Mapping[str, Any], task_name: str, hub_root: str | None, local: Path | None = None) -> Any:
    import datasets  # heavy (≈1 s): imported on the first load, not with the package

    missing = f"no offline file at {local} (VIASD_DATA_DIR) and " if local else ""
    commit = resolve_hub(hub, task_name, hub_root, missing)["commit"] if hub.get("files") else None
    try:
        if hub.get("files"):  # at the commit resolve_hub recorded
            return datasets.load_dataset(
                "parquet", data_files={"rows": hub_data_files(hub, hub_root, commit)}, split="rows",
                cache_dir=_datasets_cache_dir(),
            )
        return datasets.load_dataset(
            hub["path"], hub.get("name"), split=hub.get("split", "test"), revision=hub.get("revision")
        )
    except Exception as e:  # network, auth, missing files: one line, never a traceback
        raise _hub_error(task_name, f"{missing}could not load", hub, hub_root, e) from None


def _hub_error(task_name: str, what: str, hub: Mapping[str, Any], hub_root: str | None, e: Exception) -> ConfigError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return ConfigError(
        f"task {task_name!r}: {what} {hub['path']}@{hub.get('revision') or 'main'} from "
        f"{hub_root or 'the Hugging Face hub'} ({type(e).__name__}: {first}); on a machine with network run "
        f"`python -m experiments.data fetch {task_name}` and copy VIASD_DATA_DIR here, or use task.source=local"
    )


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
    """``datasets``' cache: under ``VIASD_CACHE_DIR``, else one folder per user in the temp dir (a folder
    another user created first is not writable: a shared one failed every second user)."""
    base = os.environ.get("VIASD_CACHE_DIR")
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    root = Path(base) / "datasets" if base else Path(tempfile.gettempdir()) / f"viasd-datasets-cache-{user}"
    root.mkdir(parents=True, exist_ok=True)
    return str(root)
