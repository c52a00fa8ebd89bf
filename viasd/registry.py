"""Name → object registries (methods, pairs, drafters, tasks, slim masks).

A registry maps a short name to a callable. Registering a name twice is an error; looking
up an unknown name raises :class:`~viasd.errors.ConfigError` listing the known names and the
closest match, in the style of lm-evaluation-harness.
"""

from __future__ import annotations

import difflib
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

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name``; duplicates raise ``ValueError``."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"duplicate {self.kind} name {name!r}: already registered as {self._items[name]!r}")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """Return the object registered as ``name`` or raise a ConfigError with suggestions."""
        if name in self._items:
            return self._items[name]
        known = sorted(self._items)
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {', '.join(known)}")

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
