"""What the runtime tells observers: the fields `spyre_verify.runtimes.protocol.EVENTS` names for each kind.

An observer is any object with some `on_<kind>` methods; only the handlers it has are called,
and an event is built only when some observer has the handler for its kind (`Bus.wants`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WARMUP = "warmup"
SERVING = "serving"


@dataclass(frozen=True)
class BatchInfo:
    request_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]  # positions each row attends, its queries included
    left_pads: tuple[int, ...]  # always 0: a ragged row has no padding
    tkv: int  # always 0: the ragged layout has none
    query_lens: tuple[int, ...]  # each row's real query tokens, ending at its seq_len

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)

    def describe(self) -> str:
        return f"{self.num_seqs} seqs, seq_lens={list(self.seq_lens)}, query_lens={list(self.query_lens)}"


@dataclass(frozen=True)
class DispatchEvent:
    kernel: str
    bucket: tuple
    batch: BatchInfo
    phase: str
    step: int


@dataclass(frozen=True)
class CompileEvent:
    kernel: str
    bucket: tuple
    phase: str
    seconds: float
    graph_id: int


@dataclass(frozen=True)
class BlockTableEvent:
    kernel: str
    bucket: tuple
    step: int
    request_ids: tuple[str, ...]
    left_pads: tuple[int, ...]
    seq_lens: tuple[int, ...]
    tkv: int
    block_table: tuple[tuple[int, ...], ...]  # one row per row of the bucket, padded rows included
    owners: Mapping[int, str]  # the pool's live, read-only view
    num_blocks: int
    null_block: int
    query_lens: tuple[int, ...]


@dataclass(frozen=True)
class KVWriteEvent:
    step: int
    slots: tuple[int, ...]  # block * block_size + offset
    writers: tuple[str, ...]
    owners: Mapping[int, str]


@dataclass(frozen=True)
class TokenEvent:
    request_id: str
    token: int
    step: int
    logits: Any  # a [vocab] tensor


@dataclass(frozen=True)
class RequestEvent:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool


@dataclass(frozen=True)
class FinishEvent:
    request_id: str
    reason: str  # "length", "stop" or "abort"
    tokens: tuple[int, ...]
    step: int  # the step that ended it; for an abort, the next step's number


@dataclass(frozen=True)
class StepEvent:
    step: int
    kind: str  # "decode", "prefill" (a chunk alone) or "mixed"
    bucket: tuple  # the first call's
    finished: tuple[str, ...]
    buckets: tuple[tuple, ...]  # every call's, in dispatch order


@dataclass(frozen=True)
class RowState:
    request_id: str
    left_pad: int  # always 0
    blocks: tuple[int, ...]  # its real blocks, in position order
    num_cached: int
    generated: int
    reserved: int  # blocks still promised to it, not yet allocated


@dataclass(frozen=True)
class PrefillState:
    request_id: str
    computed: int
    prompt_len: int
    blocks: tuple[int, ...]
    reserved: int


@dataclass(frozen=True)
class StateEvent:
    step: int  # for an abort, the number of the step that comes next
    kind: str  # "prefill", "decode", "mixed" or "abort"
    admitted: str | None
    tkv: int  # always 0
    rows: tuple[RowState, ...]
    waiting: Sequence[str]
    finished: tuple[str, ...]
    free_blocks: int
    prefill: PrefillState | None


class Bus:
    def __init__(self) -> None:
        self._observers: list[Any] = []

    def subscribe(self, observer: Any) -> Callable[[], None]:
        self._observers.append(observer)

        def detach() -> None:
            self._observers[:] = [o for o in self._observers if o is not observer]

        return detach

    def wants(self, kind: str) -> bool:
        return any(hasattr(o, "on_" + kind) for o in self._observers)

    def emit(self, kind: str, event: object) -> None:
        for o in list(self._observers):
            handler = getattr(o, "on_" + kind, None)
            if handler is not None:
                handler(event)
