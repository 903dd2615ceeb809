"""The protocol's events as the adapter sends them (fields as `spyre_verify.runtimes.protocol.EVENTS`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

KERNEL = "model"  # the plugin compiles one slot, the whole model: prefill and decode are its two graphs


@dataclass(frozen=True, order=True)
class Graph:
    """A bucket of the plugin: one symbolic graph per phase, no ladder. Prefill runs one request's
    chunk (batch 1, the chunk's table width symbolic); decode any batch and table width."""

    phase: str  # "prefill" or "decode"
    kernel: str = KERNEL

    def __str__(self) -> str:
        return f"{self.phase}(symbolic)"


PREFILL, DECODE = Graph("prefill"), Graph("decode")


@dataclass(frozen=True)
class Batch:
    request_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)

    def describe(self) -> str:
        return f"{len(self.request_ids)} seqs {list(self.request_ids)}, seq_lens={list(self.seq_lens)}"


@dataclass(frozen=True)
class Dispatch:
    kernel: str
    bucket: Graph
    batch: Batch
    phase: str
    step: int


@dataclass(frozen=True)
class Compile:
    kernel: str
    bucket: Graph
    phase: str
    seconds: float
    graph_id: int


@dataclass(frozen=True)
class Token:
    request_id: str
    token: int
    step: int
    logits: Any = None


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
    step: int


@dataclass(frozen=True)
class Step:
    step: int
    kind: str
    bucket: Graph | None
    finished: tuple[str, ...]


@dataclass(frozen=True)
class BlockTable:
    kernel: str
    bucket: Graph
    step: int
    request_ids: tuple[str, ...]
    left_pads: tuple[int, ...]
    seq_lens: tuple[int, ...]
    tkv: int
    block_table: tuple[tuple[int, ...], ...]
    owners: Mapping[int, str]
    num_blocks: int
    null_block: int


@dataclass(frozen=True)
class KVWrite:
    step: int
    slots: tuple[int, ...]
    writers: tuple[str | None, ...]  # None: a padding position, which the plugin sinks into block 0
    owners: Mapping[int, str]


class Bus:
    """Observers by `on_<kind>` method; an event is built only when someone listens (`wants`)."""

    def __init__(self) -> None:
        self.observers: list[Any] = []

    def subscribe(self, observer: Any) -> Callable[[], None]:
        self.observers.append(observer)
        return lambda: self.observers.remove(observer) if observer in self.observers else None

    def wants(self, kind: str) -> bool:
        return any(callable(getattr(o, f"on_{kind}", None)) for o in self.observers)

    def emit(self, kind: str, event: Any) -> None:
        for o in list(self.observers):
            handler = getattr(o, f"on_{kind}", None)
            if callable(handler):
                handler(event)
