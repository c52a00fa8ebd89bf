"""Per-sample control groups: one memory, process and CPU budget for everything a sample starts.

This module owns creating, reading and removing the cgroup of one sandboxed program (used
by :mod:`viasd.tasks.sandbox`). A :class:`SampleCgroup` caps the memory of the whole sample
(every process, plus the tmpfs files, memfds and shared memory it creates, which are all
charged to it), its number of tasks and, where the ``cpu`` controller is offered too, its
CPU bandwidth (``cpu.max``, v1 ``cpu.cfs_quota_us``: a number of CPUs' worth, so eight busy
processes of one sample share one core). It uses cgroup v2 when the unified hierarchy
offers the ``memory`` and ``pids`` controllers to the harness's own cgroup, otherwise the v1
``memory`` and ``pids`` (and ``cpu``) hierarchies (a hybrid mount). The sample's cgroups are
created below the harness's own, so the harness's limits still apply to them.

The sandbox joins a sample by writing ``0`` (the writer itself) into each path of
:attr:`SampleCgroup.procs_files` before it drops privileges; children inherit membership.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["SampleCgroup", "cgroup_support"]

_ROOT = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000  # the CPU bandwidth period
_counter = itertools.count()
_lock = threading.Lock()


def _own_paths() -> dict[str, str]:
    """``{controller or "" (v2): path}`` of this process, from ``/proc/self/cgroup``."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for c in parts[1].split(",") if parts[1] else [""]:
                out[c] = parts[2]
    return out


def _fresh_tag(prefix: str = "") -> str:
    """A cgroup name suffix no other cgroup of this or another live process has: ``<prefix><pid>-<n>``."""
    with _lock:
        return f"{prefix}{os.getpid()}-{next(_counter)}"


def _write(path: Path, value: str) -> None:
    path.write_text(value)


@functools.lru_cache(maxsize=1)
def cgroup_support() -> tuple[str, dict[str, Path]] | None:
    """``("v2", {"": parent})`` or ``("v1", {"memory": parent, "pids": parent})``, or None.

    The parents are where per-sample cgroups are created; the answer comes from actually
    creating and removing a probe cgroup (with the limits written), so it reflects what
    works for this process, not what is mounted. A v1 answer has a ``"cpu"`` parent too, and
    a v2 answer the key ``"cpu"`` (the same parent), when a CPU limit can be written there.
    """
    own = _own_paths()
    candidates: list[tuple[str, dict[str, Path]]] = []
    v2 = _ROOT / "cgroup.controllers"
    if v2.is_file() and "" in own:
        candidates.append(("v2", {"": _ROOT / own[""].lstrip("/")}))
    unified = _ROOT / "unified"
    if (unified / "cgroup.controllers").is_file() and "" in own:
        candidates.append(("v2", {"": unified / own[""].lstrip("/")}))
    if "memory" in own and "pids" in own:
        candidates.append(("v1", {c: _ROOT / c / own[c].lstrip("/") for c in ("memory", "pids")}))
    # The probe has a name of its own: two harness processes probing at once (xdist workers, parallel jobs)
    # both made "viasd-sbx-probe", and the one that lost ran every sample without a cgroup (no fork, no
    # memory cgroup): 13 of 15 simultaneous pairs of probes here.
    tag = _fresh_tag("probe-")
    why: list[str] = []
    for version, parents in candidates:
        try:
            SampleCgroup._create(version, parents, 64 * 1024 * 1024, 8, None, tag).remove()
        except OSError as e:
            log.debug("cgroup %s unusable here: %s", version, e)
            why.append(f"{version}: {e}")
            continue
        if version == "v2" or "cpu" in own:
            cpu = {"cpu": parents[""] if version == "v2" else _ROOT / "cpu" / own["cpu"].lstrip("/")}
            try:
                SampleCgroup._create(version, {**parents, **cpu}, 64 * 1024 * 1024, 8, 1.0, tag).remove()
                parents = {**parents, **cpu}
            except OSError as e:
                log.debug("no cgroup CPU limit here (RLIMIT_CPU only): %s", e)
        return version, parents
    log.warning("no per-sample cgroup can be created here (%s): sandboxed samples may not fork or start threads, "
                "and their memory is bounded per process only", "; ".join(why) or "no cgroup hierarchy of this process")
    return None


def _enable_v2_controllers(parent: Path, wanted: tuple[str, ...]) -> None:
    """Let ``parent``'s children use the ``wanted`` controllers (raises OSError when that is refused)."""
    have = (parent / "cgroup.controllers").read_text().split()
    if not set(wanted) <= set(have):
        raise OSError(f"{parent} does not offer the {' and '.join(wanted)} controllers")
    enabled = (parent / "cgroup.subtree_control").read_text().split()
    missing = [c for c in wanted if c not in enabled]
    if missing:
        _write(parent / "cgroup.subtree_control", " ".join("+" + c for c in missing))


@dataclass
class SampleCgroup:
    """The cgroup(s) of one sample. Create with :meth:`create`; always :meth:`remove`."""

    version: str
    dirs: list[Path]
    memory_dir: Path

    @classmethod
    def create(cls, memory_bytes: int, max_tasks: int, cpus: float = 1.0) -> SampleCgroup | None:
        """A fresh cgroup limited to ``memory_bytes`` (no swap), ``max_tasks`` and ``cpus`` CPUs' worth.

        None if cgroups are unsupported here; without the cpu controller, no CPU limit.
        """
        support = cgroup_support()
        if support is None:
            return None
        return cls._create(support[0], support[1], memory_bytes, max_tasks, cpus, _fresh_tag())

    @classmethod
    def _create(cls, version: str, parents: dict[str, Path], memory_bytes: int, max_tasks: int,
                cpus: float | None, tag: str) -> SampleCgroup:  # fmt: skip
        name = f"viasd-sbx-{tag}"
        made: list[Path] = []
        quota = None if cpus is None or "cpu" not in parents else str(max(1000, int(cpus * _PERIOD_US)))
        try:
            if version == "v2":
                _enable_v2_controllers(parents[""], ("memory", "pids") + (("cpu",) if quota else ()))
                d = parents[""] / name
                d.mkdir()
                made.append(d)
                _write(d / "memory.max", str(memory_bytes))
                if (d / "memory.swap.max").exists():
                    _write(d / "memory.swap.max", "0")
                _write(d / "pids.max", str(max_tasks))
                if quota:
                    _write(d / "cpu.max", f"{quota} {_PERIOD_US}")
                return cls(version, made, d)
            mem = parents["memory"] / name
            mem.mkdir()
            made.append(mem)
            _write(mem / "memory.limit_in_bytes", str(memory_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
            pids = parents["pids"] / name
            pids.mkdir()
            made.append(pids)
            _write(pids / "pids.max", str(max_tasks))
            if quota:
                cpu = parents["cpu"] / name
                cpu.mkdir()
                made.append(cpu)
                _write(cpu / "cpu.cfs_period_us", str(_PERIOD_US))
                _write(cpu / "cpu.cfs_quota_us", quota)
            return cls(version, made, mem)
        except OSError:
            cls(version, made, made[0] if made else Path()).remove()
            raise

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes ``0`` into to join the sample."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _read(self, name: str) -> str:
        try:
            return (self.memory_dir / name).read_text()
        except OSError:
            return ""

    def peak_bytes(self) -> int | None:
        """The sample's peak memory charge (v1 ``max_usage_in_bytes``, v2 ``memory.peak``)."""
        raw = self._read("memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak").strip()
        return int(raw) if raw.isdigit() else None

    def oom_killed(self) -> bool:
        """True when the kernel killed a process of the sample for exceeding its memory."""
        text = self._read("memory.oom_control" if self.version == "v1" else "memory.events")
        for line in text.splitlines():
            key, _, val = line.partition(" ")
            if key == "oom_kill" and val.strip().isdigit():
                return int(val) > 0
        return False

    def remove(self, wait_s: float = 2.0) -> bool:
        """Kill what is left in the sample, then delete its cgroups; never raises. False if one remains."""
        deadline = time.monotonic() + wait_s
        ok = True
        for d in reversed(self.dirs):
            while True:
                try:
                    for pid in (d / "cgroup.procs").read_text().split():
                        try:
                            os.kill(int(pid), 9)
                        except (OSError, ValueError):
                            pass
                except OSError:
                    pass
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        log.warning("could not remove sample cgroup %s: %s", d, e)
                        ok = False
                        break
                    time.sleep(0.02)
        return ok
