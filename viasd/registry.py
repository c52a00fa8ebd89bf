"""Name → object registries (methods, pairs, drafters, tasks, slim masks).

A registry maps a short name to a callable. Registering a name twice is an error; looking
up an unknown name raises :class:`~viasd.errors.ConfigError` listing the known names and the
closest match, in the style of lm-evaluation-harness.

Registration is explicit and lazy: :meth:`Registry.register_lazy` records which module
registers a name (``"pkg.mod"``, whose import runs the ``register`` decorator) or which object
it is (``"pkg.mod:attr"``); the module is imported on the first :meth:`Registry.get` of that
name, so listing the built-ins costs no imports. :meth:`Registry.alias` keeps an old or
user-facing name working for a canonical one.
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
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name``; duplicates raise ``ValueError``."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"duplicate {self.kind} name {name!r}: already registered as {self._items[name]!r}")
            self._items[name] = obj
            return obj

        return deco

    def register_lazy(self, name: str, target: str) -> None:
        """Record that ``target`` (``"pkg.mod"`` or ``"pkg.mod:attr"``) provides ``name``, imported on first use."""
        if name in self._items or name in self._lazy or name in self._aliases:
            raise ValueError(f"duplicate {self.kind} name {name!r}")
        self._lazy[name] = target

    def alias(self, name: str, canonical: str) -> None:
        """Make ``name`` another name for ``canonical`` (e.g. a user-facing spelling)."""
        if name in self._items or name in self._lazy or name in self._aliases:
            raise ValueError(f"duplicate {self.kind} name {name!r}")
        self._aliases[name] = canonical

    def canonical(self, name: str) -> str:
        """``name`` with aliases resolved (unknown names are returned unchanged)."""
        return self._aliases.get(name, name)

    def get(self, name: str) -> T:
        """Return the object registered as ``name`` (an alias, a lazy entry) or raise a ConfigError with suggestions."""
        name = self.canonical(name)
        if name not in self._items and name in self._lazy:
            module, _, attr = self._lazy[name].partition(":")
            obj = importlib.import_module(module)
            if attr:
                self._items.setdefault(name, getattr(obj, attr))
            if name not in self._items:
                raise RuntimeError(f"{self.kind} {name!r}: importing {module!r} did not register it")
        if name in self._items:
            return self._items[name]
        known = self.names()
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {', '.join(known)}")

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> list[str]:
        """Canonical names, registered or lazy (aliases are not listed)."""
        return sorted({*self._items, *self._lazy})
