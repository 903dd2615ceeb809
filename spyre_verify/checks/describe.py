"""How checkers name what a runtime hands them, whichever runtime it is: a batch by the
fields the protocol promises, a bucket's key by its named fields, buckets in a stable order."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def describe_batch(batch: Any) -> str:
    """The bundled runtime's own wording when it offers one, else the protocol's fields."""
    describe = getattr(batch, "describe", None)
    if callable(describe):
        return str(describe())
    ids = list(getattr(batch, "request_ids", ()))
    lens = list(getattr(batch, "seq_lens", ()))
    return f"{len(ids)} seqs {ids}, seq_lens={lens}"


def key_fields(bucket: Any) -> dict[str, Any]:
    """A bucket's key as named fields: its `key` dataclass, else its own fields but the kernel."""
    key = getattr(bucket, "key", bucket)
    if not is_dataclass(key):
        return {}
    return {f.name: getattr(key, f.name) for f in fields(key) if f.name != "kernel"}


def ordered(items: Iterable[T]) -> list[T]:
    """Sorted by their own order where they have one (the bundled keys do), else by how they print."""
    items = list(items)
    try:
        return sorted(items)  # type: ignore[type-var]
    except TypeError:
        return sorted(items, key=str)
