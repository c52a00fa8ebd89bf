"""Manifest-verified cache folders: the one way the project publishes and trusts cached artifacts.

This module owns how converted models, distilled drafts and their teacher data are written
to the cache and checked on every load: a folder is built in a temporary sibling,
``manifest.json`` (size and sha256 of every file plus provenance) is written last, the folder
is moved into place with ``os.replace``, and a folder whose manifest is missing or does not
match its files is reported, deleted and rebuilt — never loaded. Single files are written
and folders locked with :mod:`viasd.utils.fs`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import transformers

from viasd.utils.fs import atomic_write_text

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
VERIFIED = ".verified.json"  # stat of each file when it last hashed sound (not in the manifest)


def say(progress: bool, msg: str) -> None:
    """Print one ``[viasd]`` progress line to stderr when ``progress`` is set."""
    if progress:
        print(f"[viasd] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file (≈0.4 s for 540 MB with SHA extensions)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, extra: dict) -> dict:
    """Hash every file of ``folder`` and write ``manifest.json`` into it (call this last).

    The manifest records ``{"files": {relpath: {"size", "sha256"}}, "format", ...extra}``.
    """
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name not in (MANIFEST, VERIFIED):
            rel = p.relative_to(folder).as_posix()
            files[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    manifest = {"format": MANIFEST_FORMAT, "files": files, **extra}
    atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def _stat_key(p: Path) -> list[int]:
    st = p.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def verify_manifest(folder: Path) -> str | None:
    """Check ``folder`` against its manifest; return ``None`` if sound, else what is wrong.

    Checks: the manifest exists and parses, every listed file exists with the recorded size
    and sha256 (full hash of every file, not a sample). A file hashed sound before is not
    hashed again while its (size, mtime, inode) equal those recorded in ``.verified.json`` at
    that time, so cached multi-GB models load without re-reading them; any rewrite, truncation
    or replacement changes the stat and forces the full hash.
    """
    mpath = folder / MANIFEST
    if not folder.is_dir():
        return "missing"
    if not mpath.is_file():
        return f"no {MANIFEST} (interrupted or partial conversion)"
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable {MANIFEST}: {e}"
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"manifest format {manifest.get('format')} != {MANIFEST_FORMAT}"
    if not files:
        return "manifest lists no files"
    try:
        stamp = json.loads((folder / VERIFIED).read_text())
    except (OSError, ValueError):
        stamp = {}
    fresh = {}
    for rel, meta in files.items():
        p = folder / rel
        if not p.is_file():
            return f"file missing: {rel}"
        size = p.stat().st_size
        if size != meta["size"]:
            return f"size mismatch for {rel}: {size} bytes on disk, {meta['size']} in the manifest"
        key = _stat_key(p) + [meta["sha256"]]
        if stamp.get(rel) != key and sha256_file(p) != meta["sha256"]:
            return f"sha256 mismatch for {rel}"
        fresh[rel] = key
    if fresh != stamp:
        with contextlib.suppress(OSError):  # a read-only cache just hashes again next time
            atomic_write_text(folder / VERIFIED, json.dumps(fresh))
    return None


def read_manifest(folder: Path) -> dict:
    """The parsed ``manifest.json`` of a verified folder."""
    return json.loads((folder / MANIFEST).read_text())


def atomic_publish(tmp: Path, final: Path) -> None:
    """Move the finished folder ``tmp`` (same parent as ``final``) into place."""
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def remove_broken(folder: Path, reason: str, progress: bool) -> None:
    """Delete a cache folder that failed verification, saying why."""
    if folder.exists():
        say(progress, f"cached folder {folder} is unusable ({reason}); deleting and rebuilding it")
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Show or hide transformers' own progress bars for the duration of a block."""
    hf_logging = transformers.utils.logging
    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()
