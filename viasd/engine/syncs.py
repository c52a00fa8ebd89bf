"""Host syncs: the device→host reads a decode makes, counted where they happen.

A value the host reads off an accelerator tensor (``.item()``, ``.tolist()``, ``int(t)``,
``bool(t)``, ``.nonzero()``, ``.cpu()``, …) waits for every kernel queued before it: a *host sync*.
The decoding loops read what they must (how many drafted tokens were accepted, the next tokens)
through :func:`to_host`, once per round where they can.

:class:`HostSyncs` counts every such read while it is active (a ``TorchFunctionMode``, so a read
that bypasses :func:`to_host` is counted too): on an accelerator the reads of its tensors, on a
CPU-only run every read of a tensor (each would be a sync if the pair sat on a GPU). A tensor that
already lives on the host — a stream's host copy of tokens it fed (:func:`host_copy`) — is read
with :func:`host_values`, which is not counted. ``sites`` names where each read came from.

What lets a stream do without reads lives here too: :class:`HostTokens` (the host values of a
stream's cached tokens), :func:`match_length` (a valid prefix found on the host) and
:class:`ForwardClock` (forward times without a sync per forward).
"""

from __future__ import annotations

import collections
import contextvars
import os
import sys
import time
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: Tensor functions that return host values (or need them: ``nonzero`` sizes its output).
SYNC_FUNCTIONS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero",
                            "cpu", "numpy", "bincount", "unique", "masked_select", "equal"})
_HOST_READ: contextvars.ContextVar[bool] = contextvars.ContextVar("viasd_host_read", default=False)


class HostSyncs(TorchFunctionMode):
    """Counts host syncs while active (``with HostSyncs() as s: …; s.count``).

    ``sites``: ``"function file:line"`` → count, the innermost frame of a ``viasd`` module (other
    than this one) that made each read; just ``"function"`` for a read made outside the package.
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.sites: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNC_FUNCTIONS and not _HOST_READ.get() and _on_device(args):
            self.count += 1
            self.sites[name + _viasd_caller(sys._getframe(1))] += 1
        return func(*args, **(kwargs or {}))


def _viasd_caller(frame) -> str:
    """``" file.py:line"`` of the innermost frame of a ``viasd`` module other than this one, from
    ``frame`` outwards ("" when none: a read made by a test or a user's script). Frames are told by
    their module's name, never by the path of their file: a checkout in a folder named ``viasd``
    holds pytest's and torch's files too."""
    while frame is not None:
        module = frame.f_globals.get("__name__")
        if type(module) is str and module.split(".", 1)[0] == "viasd" and module != __name__:
            return f" {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _on_device(args) -> bool:
    """Whether the read's tensor is one a GPU run would hold on the device (every tensor on a
    CPU-only machine; on an accelerator machine, the tensors not on the CPU)."""
    t = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if t is None:
        return False
    return t.device.type != "cpu" or not torch.cuda.is_available()


def to_host(x: torch.Tensor) -> Any:
    """``x.tolist()``: the one device→host read of a round (a host sync on an accelerator)."""
    return x.tolist()


def host_copy(x: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Start copying ``x`` to the host without waiting: ``(host tensor, CUDA event or None)``; read
    it later with :func:`host_values` (free once the device has passed the copy)."""
    if x.device.type != "cuda":
        return x, None
    out = x.to("cpu", non_blocking=True)  # pinned destination: the copy is queued, not awaited
    event = torch.cuda.Event()
    event.record()
    return out, event


def copied(copy: tuple[torch.Tensor, Any]) -> bool:
    """Whether the device has passed a :func:`host_copy` (its values can be read without a wait)."""
    return copy[1] is None or copy[1].query()


def host_values(copy: tuple[torch.Tensor, Any]) -> list:
    """The values of a :func:`host_copy`; waits for the copy only if the device has not passed it
    (a host sync that :class:`HostSyncs` does not see: the loops read copies a round's sync has passed)."""
    x, event = copy
    if event is not None and not event.query():
        event.synchronize()
    token = _HOST_READ.set(True)
    try:
        return x.tolist()
    finally:
        _HOST_READ.reset(token)


def cuda_devices(model: torch.nn.Module) -> list[torch.device]:
    """The CUDA devices ``model``'s parameters sit on, in index order (empty on a CPU model): the
    devices a timed forward synchronizes, so a model split by a device map is timed whole."""
    devs = {p.device for p in model.parameters() if p.device.type == "cuda"}
    return sorted(devs, key=lambda d: d.index or 0)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the common prefix of two token rows ``[1, La]`` and ``[1, Lb]``."""
    n = min(a.shape[1], b.shape[1])
    if n == 0:
        return 0
    diff = (a[0, :n] != b[0, :n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else n


class HostTokens:
    """The host values of a token row the device holds (``[1, n]``): a known prefix, then queued
    host copies (:func:`~viasd.engine.syncs.host_copy`) of the tokens fed from the device."""

    def __init__(self) -> None:
        self.known: list[int] = []
        self.pending: list = []  # copies of the tokens after ``known``, in order
        self.length = 0  # tokens of the row covered (known + pending, cropped)

    def values(self, need: int, wait: bool = True) -> list[int]:
        """Host values of a prefix of the row, at least ``need`` long where it has them: queued copies
        are read only while the known prefix is shorter (free once the device has passed them;
        ``wait=False``: only the copies the device has passed)."""
        while self.pending and len(self.known) < need and (wait or copied(self.pending[0])):
            self.known += host_values(self.pending.pop(0))
        del self.known[self.length:]
        return self.known

    def crop(self, length: int) -> None:
        """The row was rolled back to ``length`` tokens."""
        self.length = min(self.length, length)
        if length <= len(self.known):
            del self.known[length:]
            self.pending = []

    def fed(self, seq: torch.Tensor, keep: int, host: list[int] | None) -> None:
        """The row is now ``seq`` ``[1, L]``, its first ``keep`` tokens kept: ``host`` (the values of a
        prefix of ``seq``) when it knows more than the row did, and a queued copy of the rest."""
        self.crop(keep)
        if host is not None and len(host) >= self.length:
            self.known, self.pending = list(host[: seq.shape[1]]), []
            self.length = len(self.known)
        if self.length < seq.shape[1]:
            self.pending.append(host_copy(seq[0, self.length:]))
            self.length = seq.shape[1]


def match_length(a: torch.Tensor, a_host: HostTokens, b: torch.Tensor, b_host: list[int] | None,
                 exact: bool = True) -> int:
    """:func:`common_prefix` of ``a`` and ``b`` (``[1, La]``, ``[1, Lb]``) read from their host
    values (``a_host``: ``a``'s; ``b_host``: the values of a prefix of ``b``) where both are known;
    the device compares only what neither knows (a host sync). ``exact=False``: no device read and
    no wait — where the host values end undecided, their agreeing length (a lower bound)."""
    n = min(a.shape[1], b.shape[1])
    known = a_host.values(min(n, len(b_host) if b_host is not None else 0), wait=exact)
    h = min(n, len(known), len(b_host) if b_host is not None else 0)
    for i in range(h):
        if known[i] != b_host[i]:
            return i
    return h if h == n or not exact else h + common_prefix(a[:, h:n], b[:, h:n])


class ForwardClock:
    """Seconds of a model's forwards without a host sync per forward.

    A model on one GPU: a pair of CUDA events around each forward, read when :meth:`seconds` is
    asked (one wait, at the end of a decode). A model split over several GPUs: every device is
    synchronized after each forward (events of one device cannot time the others). CPU: wall time.
    """

    def __init__(self, model: torch.nn.Module):
        self.devices = cuda_devices(model)  # every GPU the model sits on (a split model: several)
        self.events: list = []
        self.done = 0.0

    def start(self):
        if len(self.devices) == 1:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.devices[0]))
            return ev
        return time.perf_counter()

    def stop(self, t0) -> None:
        if len(self.devices) == 1:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.devices[0]))
            self.events.append((t0, ev))
            return
        self.synchronize()  # a split model: timing covers the work queued on every device it uses
        self.done += time.perf_counter() - t0

    def synchronize(self) -> None:
        """Wait for the work queued on every device of the model."""
        for dev in self.devices:
            torch.cuda.synchronize(dev)

    def seconds(self) -> float:
        """Seconds of the forwards timed so far (reads the pending CUDA events: waits for the last)."""
        if self.events:
            self.events[-1][1].synchronize()
            self.done += sum(a.elapsed_time(b) for a, b in self.events) / 1e3
            self.events = []
        return self.done
