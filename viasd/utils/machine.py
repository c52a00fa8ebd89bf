"""What this machine is, as far as a forward's cost goes: the CPU model and the vector ISA torch
dispatches to. Recorded in every run's ``meta.json`` and every cost file, so a run is priced by a cost
file measured on its own CPU (two machines may share a host name)."""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path


@functools.cache
def cpu_name() -> str:
    """``"<model name> (<ISA>)"``, e.g. ``"AMD EPYC 7B13 (AVX2)"``: ``/proc/cpuinfo``'s model name
    (else ``platform.processor()``) and ``torch.backends.cpu.get_cpu_capability()``."""
    import torch

    model = ""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.lower().startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return f"{model} ({torch.backends.cpu.get_cpu_capability()})"


def cpu_tag(cpu: str | None = None) -> str:
    """A 6-hex-digit tag of ``cpu`` (default: this machine's :func:`cpu_name`), safe in a file name."""
    return hashlib.sha1((cpu or cpu_name()).encode()).hexdigest()[:6]
