"""Name → object registries (methods, pairs, drafters, tasks, slim masks).

A registry maps a short name to a callable. Registering a name twice is an error; looking
up an unknown name raises :class:`~viasd.errors.ConfigError` listing the known names and the
closest match, in the style of lm-evaluation-harness. An entry can also be registered lazily
as an import path (``"package.module:attribute"``), imported on its first :meth:`Registry.get`,
so a lower layer can name an object that lives in a higher one without importing it.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from viasd.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of objects with a ``register`` decorator.

    Example::

        METHODS = Registry("method")

        @METHODS.register("sd")
        def sd(...): ...

        METHODS.get("sd")

        PAIR_LOADERS.register_lazy("smollm2", "viasd.distill.pair:load_smollm2_pair")
        PAIR_LOADERS.get("smollm2")  # imports viasd.distill.pair on first use
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attribute", until first get()

    def _check_new(self, name: str) -> None:
        if name in self._items or name in self._lazy:
            where = self._items[name] if name in self._items else self._lazy[name]
            raise ValueError(f"duplicate {self.kind} name {name!r}: already registered as {where!r}")

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name``; duplicates raise ``ValueError``."""

        def deco(obj: T) -> T:
            self._check_new(name)
            self._items[name] = obj
            return obj

        return deco

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``name`` as the import path ``"package.module:attribute"``, imported on the
        first :meth:`get`; duplicates (lazy or not) raise ``ValueError``."""
        module, sep, attr = target.partition(":")
        if not (module and sep and attr):
            raise ValueError(f"lazy {self.kind} {name!r}: expected 'package.module:attribute', got {target!r}")
        self._check_new(name)
        self._lazy[name] = target

    def get(self, name: str) -> T:
        """Return the object registered as ``name`` or raise a ConfigError with suggestions.

        A lazy entry is imported here once (an import error propagates: a wrong path is a bug
        in the registration, not in the user's configuration)."""
        if name in self._items:
            return self._items[name]
        if name in self._lazy:
            module, _, attr = self._lazy[name].partition(":")
            self._items[name] = getattr(importlib.import_module(module), attr)
            del self._lazy[name]
            return self._items[name]
        known = self.names()
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {', '.join(known)}")

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> list[str]:
        """All registered names, lazy ones included (sorted; nothing is imported)."""
        return sorted([*self._items, *self._lazy])
