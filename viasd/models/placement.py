"""Where a pair's models go on the GPUs: one GPU when a model fits one, a balanced split otherwise, never offload.

``pair.device_map=auto`` used to hand ``device_map="auto"`` to ``from_pretrained``, which spreads even a
small model over every GPU and silently offloads to ``cpu``/``disk`` what does not fit. :func:`place`
decides instead, from the model built on the meta device (no weights) and each GPU's memory:

* a model that fits the GPU with the most room goes whole on it (``{"": "cuda:i"}``);
* a larger one is split by accelerate (``get_balanced_memory`` + ``infer_auto_device_map``, decoder
  layers kept whole) over the GPUs;
* a map that puts any module on ``cpu`` or ``disk`` is refused with one line naming the memory needed
  and the knob that allows it (``+pair.allow_offload=true``).
"""

from __future__ import annotations

from typing import Any

import torch

from viasd.errors import ConfigError

__all__ = ["OFFLOAD", "place", "model_bytes", "gpu_max_memory"]

GIB = 1024**3
OFFLOAD = ("cpu", "disk")


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers (works on the meta device: shapes × element size)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def gpu_max_memory() -> dict[Any, int]:
    """``{gpu index: free bytes}`` of every visible GPU plus ``"cpu"`` (host memory), accelerate's form;
    without GPUs only ``"cpu"``, so a map over it is an offload."""
    from accelerate.utils import get_max_memory

    return get_max_memory()


def place(model: torch.nn.Module, max_memory: dict[Any, int], name: str = "model",
          allow_offload: bool = False, headroom: float = 1.2) -> dict[str, Any]:
    """The device map of ``model`` (a meta-device or real module) over ``max_memory``.

    ``max_memory``: ``{gpu index or "cpu"/"disk": bytes}`` (accelerate's form); a model whose weights ×
    ``headroom`` (KV cache, activations) fit one GPU goes whole on the GPU with the most memory,
    otherwise accelerate balances it over the GPUs. Raises ConfigError (one line) when the map would
    put a module on ``cpu``/``disk`` and ``allow_offload`` is false.
    """
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    need = model_bytes(model)
    gpus = {k: v for k, v in max_memory.items() if k not in OFFLOAD}
    if gpus:
        best = max(gpus, key=gpus.get)
        if need * headroom <= gpus[best]:
            return {"": best}
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    mem = dict(max_memory)
    if len(gpus) > 1:
        mem = get_balanced_memory(model, max_memory=mem, no_split_module_classes=no_split)
    device_map = infer_auto_device_map(model, max_memory=mem, no_split_module_classes=no_split)
    off = sorted({str(d) for d in device_map.values() if str(d) in OFFLOAD})
    if off and not allow_offload:
        have = sum(gpus.values())
        raise ConfigError(
            f"{name} needs ~{need * headroom / GIB:.1f} GiB (weights {need / GIB:.1f} GiB x {headroom}) but the "
            f"{len(gpus)} GPU(s) hold {have / GIB:.1f} GiB: the device map would put modules on {'/'.join(off)}; "
            "use more or larger GPUs, or set +pair.allow_offload=true to offload (slow)")
    return device_map
