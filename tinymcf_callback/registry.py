"""One kind of table for everything the package looks up by name: trainers' folder layouts, weight formats with their
loaders, the served reload routes, the trackers.

A :class:`Registry` holds named entries in registration order. An entry is the thing itself or a lazy
``"module:attribute"`` string, imported on first use (:func:`resolve`): a table low in the package can name what a
higher part implements without importing it, as lm-evaluation-harness's registry names its models. A name given
twice is refused; a name not there is an error listing the names there are.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Generic, TypeVar

from .errors import RegistryError

T = TypeVar("T")


def resolve(entry):
    """``entry`` itself, or the attribute a ``"module:attribute"`` string names, imported now."""
    if not isinstance(entry, str):
        return entry
    module, _, attribute = entry.partition(":")
    if not module or not attribute:
        raise RegistryError(f"{entry!r} is not a lazy entry: write it \"package.module:attribute\"")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as e:
        raise RegistryError(f"the lazy entry {entry!r} cannot be resolved: {e}") from None


class Registry(Generic[T]):
    """Named entries of one ``kind`` (what a message calls one: ``"run folder layout"``), in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, entry: T | str, *, before: str | None = None) -> T | str:
        """Add ``entry`` (or a lazy ``"module:attribute"`` string) under ``name``, last or just before the entry
        named ``before`` (when that one is there); a name already there is refused."""
        if name in self._entries:
            raise RegistryError(f"a {self.kind} named {name!r} is registered already (registered: {self.listed()})")
        rows = list(self._entries.items())
        at = [n for n, _ in rows].index(before) if before in self._entries else len(rows)
        rows.insert(at, (name, entry))
        self._entries = dict(rows)
        return entry

    def __getitem__(self, name: str) -> T:
        """The entry under ``name``, imported on first use when it was registered lazily."""
        if name not in self._entries:
            raise RegistryError(f"no {self.kind} named {name!r} (registered: {self.listed()})")
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = resolve(entry)
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def values(self) -> list[T]:
        """Every entry, in order (lazy ones imported now)."""
        return [self[name] for name in self.names()]

    def listed(self) -> str:
        """The names, for a message: ``"a, b, c"``."""
        return ", ".join(self._entries) or "none"

    @contextlib.contextmanager
    def scoped(self) -> Iterator[Registry[T]]:
        """Entries registered inside the block are gone after it (and nothing registered before is lost)."""
        kept = dict(self._entries)
        try:
            yield self
        finally:
            self._entries = kept
