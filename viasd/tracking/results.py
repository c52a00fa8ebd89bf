"""The results store committed in the repository (``results/runs/``): :func:`publish` copies
finished runs into it — the only writer; a normal run never writes there. It is read beside the
local store by :class:`~viasd.tracking.store.RunStores`, under the same validity rules."""

from __future__ import annotations

import shutil
from pathlib import Path

from viasd.errors import ConfigError
from viasd.tracking.proof import FINISHED, RECORD_FILES, inspect
from viasd.tracking.store import RunStore, RunStores, as_stores, find_run


def publish(run_ids: list[str], source: RunStore | RunStores, dest: str | Path) -> list[tuple[str, str]]:
    """Copy finished valid runs (their record files only: no locks, W&B or traces) into the results
    store ``dest``; returns ``(run_id, what happened)``. A run already there with the same files is
    left as it is; one that differs is a :class:`ConfigError` (remove it first to replace it)."""
    dest = Path(dest)
    out = []
    for run_id in run_ids:
        found = find_run(run_id, source)
        if found is None:
            v = as_stores(source).verdict(run_id)
            why = f"it is {v.state}: {v.reason}" if v is not None else "no such folder"
            raise ConfigError(f"cannot publish {run_id}: not a finished valid run ({why})")
        target = dest / run_id
        if target.exists():
            same = all((target / f).is_file() and (target / f).read_bytes() == (found["path"] / f).read_bytes()
                       for f in RECORD_FILES if (found["path"] / f).is_file())
            if not same:
                raise ConfigError(f"{target} exists with other contents; remove it first to replace it")
            out.append((run_id, f"already in {dest}"))
            continue
        tmp = dest / f".{run_id}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in RECORD_FILES:
            if (found["path"] / f).is_file():
                shutil.copy2(found["path"] / f, tmp / f)
        tmp.rename(target)
        if inspect(target).state != FINISHED:
            raise ConfigError(f"{target} does not prove itself after copying: {inspect(target).reason}")
        out.append((run_id, f"published to {target}"))
    return out
