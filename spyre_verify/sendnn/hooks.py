"""Attribute patches from outside, each put back exactly as it was."""

from __future__ import annotations

from typing import Any

_ABSENT = object()


class Hooks:
    """`set(obj, name, value)` replaces an attribute; `restore()` puts every one back, newest first,
    deleting those that were not there before (an instance attribute over a class method)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        self._saved.append((obj, name, obj.__dict__.get(name, _ABSENT)))
        setattr(obj, name, value)

    def wrap(self, obj: Any, name: str, make: Any) -> None:
        """Replace `obj.name` with `make(original)`, the original as looked up now."""
        self.set(obj, name, make(getattr(obj, name)))

    def restore(self) -> None:
        while self._saved:
            obj, name, old = self._saved.pop()
            if old is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

    def __len__(self) -> int:
        return len(self._saved)
