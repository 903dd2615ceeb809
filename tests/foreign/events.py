"""What the runtime tells observers: exactly the fields `spyre_verify.runtimes.protocol.EVENTS` names.

An observer is any object with some `on_<kind>` methods; an event is built only when some
observer has the method for its kind (`Bus.wants`), so an unobserved engine pays a lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .buckets import Bucket

WARMUP = "warmup"
SERVING = "serving"


@dataclass(frozen=True)
class Batch:
    request_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]

    def describe(self) -> str:
        return f"{len(self.request_ids)} seqs, seq_lens={list(self.seq_lens)}"


@dataclass(frozen=True)
class Dispatch:
    kernel: str
    bucket: Bucket
    batch: Batch
    phase: str
    step: int


@dataclass(frozen=True)
class Compile:
    kernel: str
    bucket: Bucket
    phase: str
    seconds: float
    graph_id: int


@dataclass(frozen=True)
class Token:
    request_id: str
    token: int
    step: int
    logits: Any  # a [vocab] tensor


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool


@dataclass(frozen=True)
class Finish:
    request_id: str
    reason: str
    tokens: tuple[int, ...]
    step: int  # the step that ended it; for an abort, the number of the next step


@dataclass(frozen=True)
class Step:
    step: int
    kind: str
    bucket: Bucket
    finished: tuple[str, ...]


@dataclass(frozen=True)
class BlockTable:
    kernel: str
    bucket: Bucket
    step: int
    request_ids: tuple[str, ...]
    left_pads: tuple[int, ...]  # always 0: rows are right-padded
    seq_lens: tuple[int, ...]
    tkv: int  # the longest real row's seq_len
    block_table: tuple[tuple[int, ...], ...]  # what the kernel reads: one row per padded row
    owners: Mapping[int, str]  # the pool's owners, live and read-only: read them in the handler
    num_blocks: int
    null_block: int


@dataclass(frozen=True)
class KVWrite:
    """One a step: every slot it writes (block * block_size + offset) and each slot's writer."""

    step: int
    slots: tuple[int, ...]
    writers: tuple[str, ...]
    owners: Mapping[int, str]


class Bus:
    def __init__(self) -> None:
        self.observers: list[Any] = []
        self._handlers: dict[str, list[Callable[[Any], None]]] = {}

    def subscribe(self, observer: Any) -> Callable[[], None]:
        self.observers.append(observer)
        self._handlers.clear()

        def detach() -> None:
            if observer in self.observers:
                self.observers.remove(observer)
                self._handlers.clear()

        return detach

    def handlers(self, kind: str) -> list[Callable[[Any], None]]:
        if kind not in self._handlers:
            found = (getattr(o, f"on_{kind}", None) for o in self.observers)
            self._handlers[kind] = [h for h in found if callable(h)]
        return self._handlers[kind]

    def wants(self, kind: str) -> bool:
        return bool(self.handlers(kind))

    def emit(self, kind: str, event: object) -> None:
        for handler in self.handlers(kind):
            handler(event)
