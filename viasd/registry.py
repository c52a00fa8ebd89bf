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


def unknown_name(kind: str, name: str, known: list[str], kinds: str | None = None) -> ConfigError:
    """The one-line error for an unknown ``kind`` called ``name``: the closest of ``known`` and all of
    them (``kinds``: the plural, default ``<kind>s``). Registries and config-group typos both use it."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown {kind} {name!r}.{hint} Known {kinds or kind + 's'}: {', '.join(known)}")


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
        self._lazy: dict[str, str] = {}  # name -> "module" or "module:attribute", until first get()
        self._aliases: dict[str, str] = {}

    def _check_new(self, name: str) -> None:
        taken = self._items.get(name) or self._lazy.get(name) or self._aliases.get(name)
        if taken is not None:
            raise ValueError(f"duplicate {self.kind} name {name!r}: already registered as {taken!r}")

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name``; duplicates raise ``ValueError``.

        A name registered lazily as a module (no ``:attribute``) is registered by that module's
        import through this decorator."""

        def deco(obj: T) -> T:
            if ":" not in self._lazy.get(name, ":"):
                del self._lazy[name]
            self._check_new(name)
            self._items[name] = obj
            return obj

        return deco

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``name`` as ``"package.module:attribute"`` (that object) or ``"package.module"``
        (whose import registers ``name`` with :meth:`register`), imported on the first :meth:`get`."""
        module, sep, attr = target.partition(":")
        if not module or (sep and not attr):
            raise ValueError(f"lazy {self.kind} {name!r}: expected 'package.module[:attribute]', got {target!r}")
        self._check_new(name)
        self._lazy[name] = target

    def alias(self, name: str, canonical: str) -> None:
        """Make ``name`` another name for ``canonical`` (e.g. a user-facing spelling)."""
        self._check_new(name)
        self._aliases[name] = canonical

    def canonical(self, name: str) -> str:
        """``name`` with aliases resolved (unknown names are returned unchanged)."""
        return self._aliases.get(name, name)

    def get(self, name: str) -> T:
        """Return the object registered as ``name`` (an alias, a lazy entry) or raise a ConfigError with suggestions.

        A lazy entry is imported here once (an import error propagates: a wrong path is a bug in
        the registration, not in the user's configuration)."""
        name = self.canonical(name)
        if name not in self._items and name in self._lazy:
            module, _, attr = self._lazy[name].partition(":")
            obj = importlib.import_module(module)
            if attr:
                self._items[name] = getattr(obj, attr)
                del self._lazy[name]
            if name not in self._items:
                raise RuntimeError(f"{self.kind} {name!r}: importing {module!r} did not register it")
        if name in self._items:
            return self._items[name]
        raise unknown_name(self.kind, str(name), self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> list[str]:
        """Canonical names, registered or lazy (aliases are not listed)."""
        return sorted({*self._items, *self._lazy})
