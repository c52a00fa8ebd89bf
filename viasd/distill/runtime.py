"""How the draft build uses the machine: torch threads and progress bars.

This module owns the thread heuristic of the build (:func:`auto_threads`), the context
manager that applies a thread count (:func:`torch_threads`) and the build's progress bars
(:func:`progress_bar`, tqdm on stderr).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator

import torch
from tqdm.auto import tqdm


def progress_bar(*args, **kwargs) -> tqdm:
    """A tqdm bar on stderr (``disable=not progress`` hides it); arguments as :class:`tqdm.tqdm`."""
    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(*args, **kwargs)


def auto_threads(cap: int = 2) -> int:
    """Threads worth using now: up to ``cap``, minus cores other processes keep busy.

    On a shared CPU, a second torch thread makes small matmuls 5–10× *slower* (measured: a
    16×576 @ 576×1536 matmul takes 0.7 ms with 1 thread, 7–9 ms with 2 while another process
    runs), so the build uses 1 thread unless the machine looks idle.
    """
    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except (OSError, AttributeError):
        busy = 0.0
    return max(1, min(cap, cores - math.ceil(busy - 0.25)))


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads (``n <= 0``: :func:`auto_threads`), restoring the
    previous count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(n if n > 0 else auto_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)
