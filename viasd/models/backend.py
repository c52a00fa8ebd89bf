"""CPU inference backends and the dtype probe: how a loaded model's linear layers run.

``eager`` leaves a model as transformers built it (``F.linear``: the small-M GEMM re-packs the
weight on every call, so scoring 5 tokens costs 2–3× scoring one). ``packed`` replaces every
``nn.Linear`` *module* in place with a :class:`PackedLinear` whose weight was reordered once by
oneDNN (``torch.ops.mkldnn._reorder_linear_weight``) and which runs
``torch.ops.mkldnn._linear_pointwise`` — the same prepacked-linear op that Inductor's CPU
freezing pass emits. The model's own ``forward`` (and :mod:`viasd.engine.routing`, which calls
the same layer modules) is untouched, so every family, every method and the KV cache logic work
as before. ``auto`` is ``packed`` on CPU and ``eager`` elsewhere.

:func:`probe_dtype` times a prefill-sized and a 1-token product in fp32 and bf16 on this CPU
and picks the dtype for ``pair.dtype: auto`` (bf16 only when it wins both).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from viasd.errors import ConfigError

BACKENDS = ("auto", "eager", "packed")


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """Dtypes oneDNN can pack on this CPU (bf16 needs AVX512-BW/VL/DQ or AVX-NE-CONVERT)."""
    if not torch.backends.mkldnn.is_available():
        return ()
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


def _pointwise(x2d: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2d, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is kept in oneDNN's packed layout (packed once at build).

    Args:
        linear: the module to replace (CPU, fp32 or bf16).
        keep_dense: keep ``weight`` (the original Parameter, e.g. an LM head tied to the input
            embedding, or one read for its shape); otherwise the dense copy is released and
            ``weight`` is rebuilt from the packed one on access (slow, for inspection only).

    ``forward``: ``x [..., in_features]`` → ``[..., out_features]`` (same dtype as ``x``).
    Inference only (no autograd through the packed op). ``state_dict``/``load_state_dict`` and
    ``copy.deepcopy`` behave as for the ``nn.Linear`` it replaced; ``.to(dtype/device)`` does not
    re-pack (pack after the last move).
    """

    def __init__(self, linear: nn.Linear, keep_dense: bool = False):
        super().__init__()
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(w), persistent=False)
        self.bias = linear.bias
        self.dense = linear.weight if keep_dense else None

    @property
    def weight(self) -> torch.Tensor:
        """``[out_features, in_features]`` dense weight (the kept Parameter, or unpacked)."""
        return self.dense if self.dense is not None else self.packed_weight.to_dense()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # The state dict is the nn.Linear one (``weight``, ``bias``), whatever the layout in memory.
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.pop(prefix + "dense", None)
        destination[prefix + "weight"] = self.weight if keep_vars else self.weight.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        weight = state_dict.get(prefix + "weight")
        if weight is not None:
            with torch.no_grad():
                if self.dense is not None:
                    self.dense.copy_(weight)
                dense = weight.detach().to(self.dtype).clone()
                self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(dense)
        if self.bias is not None and prefix + "bias" in state_dict:
            with torch.no_grad():
                self.bias.copy_(state_dict[prefix + "bias"])
        required = [prefix + "weight"] + ([prefix + "bias"] if self.bias is not None else [])
        missing_keys.extend(k for k in required if strict and k not in state_dict)

    def __deepcopy__(self, memo):
        shell = nn.Linear(1, 1, bias=False)
        shell.in_features, shell.out_features = self.in_features, self.out_features
        shell.weight = copy.deepcopy(self.dense, memo) if self.dense is not None else \
            nn.Parameter(self.packed_weight.to_dense(), requires_grad=False)
        shell.bias = copy.deepcopy(self.bias, memo)
        new = PackedLinear(shell, keep_dense=self.dense is not None)
        memo[id(self)] = new
        return new

    @property
    def dtype(self) -> torch.dtype:
        return self.packed_weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _pointwise(x.reshape(-1, self.in_features), self.packed_weight, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def resolve_backend(name: str, device: str | torch.device) -> str:
    """``auto|eager|packed`` → the backend to apply on ``device`` (``auto``: packed on CPU only)."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown pair.backend {name!r}; use one of {', '.join(BACKENDS)}")
    on_cpu = torch.device(device).type == "cpu"
    if name == "auto":
        return "packed" if on_cpu and torch.backends.mkldnn.is_available() else "eager"
    if name == "packed" and not on_cpu:
        raise ConfigError(f"pair.backend=packed is a CPU backend (device is {device}); "
                          "use pair.backend=auto or eager")
    if name == "packed" and not torch.backends.mkldnn.is_available():
        raise ConfigError("pair.backend=packed needs a torch build with oneDNN (mkldnn); "
                          "use pair.backend=eager")
    return name


def pack_linears(model: nn.Module) -> int:
    """Replace every CPU ``nn.Linear`` of a packable dtype (:func:`packable_dtypes`) inside
    ``model`` by a :class:`PackedLinear`, in place (others stay eager).

    The output embedding keeps its dense weight (it may be tied to the input embedding, and
    callers read its rows count). Call after the model's final ``.to(dtype)``: packed buffers
    do not follow later dtype/device moves. Returns the number of modules replaced.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    dtypes = packable_dtypes()
    todo = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is nn.Linear and child.weight.device.type == "cpu"
            and child.weight.dtype in dtypes]
    for parent, name, child in todo:
        setattr(parent, name, PackedLinear(child, keep_dense=child is head))
    return len(todo)


def apply_backend(model: nn.Module | None, backend: str) -> int:
    """Apply a resolved backend (``eager``/``packed``) to ``model``; returns modules packed."""
    if model is None or backend == "eager":
        return 0
    return pack_linears(model)


def _min_time(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def probe_dtype(device: str | torch.device = "cpu", hidden: int = 1024, inner: int = 4096, prefill: int = 128,
                reps: int = 5) -> tuple[str, dict[str, Any]]:
    """Pick fp32 or bf16 for this machine by timing ``[M, hidden] @ [hidden, inner]`` products.

    Times a prefill-sized product (``M = prefill``) and a 1-token one in each dtype (min of
    ``reps``, on the path the CPU backend would use: packed where the dtype packs, else
    ``F.linear``); bf16 is chosen only when it is faster at both.
    Non-CPU devices get bf16 without probing.

    Returns:
        ``(dtype_name, probe)``: ``"float32"`` or ``"bfloat16"`` and the timings in seconds.
    """
    if torch.device(device).type != "cpu":
        return "bfloat16", {"reason": f"{device}: bf16 without probing"}
    times: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(0)
    w32 = torch.randn(inner, hidden, generator=gen)
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        w = w32.to(dt)
        packed = torch.ops.mkldnn._reorder_linear_weight(w) if dt in packable_dtypes() else None
        for m in (1, prefill):
            x = torch.randn(m, hidden, generator=gen).to(dt)
            fn = (lambda x=x, w=w: nn.functional.linear(x, w)) if packed is None else \
                (lambda x=x, p=packed: _pointwise(x, p, None))
            times[f"{name}_m{m}_s"] = _min_time(fn, reps)
    wins = all(times[f"bfloat16_m{m}_s"] < times[f"float32_m{m}_s"] for m in (1, prefill))
    return ("bfloat16" if wins else "float32"), times
