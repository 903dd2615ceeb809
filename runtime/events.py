"""The event interface: an observer is any object with some of the `on_<kind>` methods below.
An event is built only when someone listens (`EventBus.wants`), so an engine with no observer
pays one cached lookup per emit site. Events are read-only: every observer sees the same
object. The ones built every step are plain slotted dataclasses, not frozen ones, whose
field-by-field `object.__setattr__` made building them cost several times more."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from runtime.bucketer import Bucket

NO_HOLDERS: Mapping[int, Sequence[str]] = MappingProxyType({})
WARMUP = "warmup"
SERVING = "serving"


@dataclass(slots=True)
class BatchInfo:
    """The real batch behind a dispatch."""

    request_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]
    left_pads: tuple[int, ...]
    tkv: int
    # Ragged layout: each row's real query tokens, ending at its seq_len (left_pads are 0, tkv is 0).
    query_lens: tuple[int, ...] = ()

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)

    def describe(self) -> str:
        if self.query_lens:
            return f"{self.num_seqs} seqs, seq_lens={list(self.seq_lens)}, query_lens={list(self.query_lens)}"
        return f"{self.num_seqs} seqs, tkv={self.tkv}, seq_lens={list(self.seq_lens)}, left_pads={list(self.left_pads)}"


@dataclass(slots=True)
class DispatchEvent:
    kernel: str
    bucket: Bucket
    batch: BatchInfo
    phase: str
    step: int


@dataclass(frozen=True)
class CompileEvent:
    kernel: str
    bucket: Bucket
    phase: str
    seconds: float
    graph_id: int


@dataclass(frozen=True)
class GraphHitEvent:
    kernel: str
    bucket: Bucket  # the bucket of the call the graph served
    graph_id: int
    graph_bucket: Bucket  # the bucket the graph was compiled for


@dataclass(frozen=True)
class CallEvent:
    """One call of a compiled kernel; with GraphHitEvent it exposes eager fallback."""

    kernel: str
    bucket: Bucket
    phase: str


@dataclass(slots=True)
class BlockTableEvent:
    kernel: str
    bucket: Bucket
    step: int
    request_ids: tuple[str, ...]
    left_pads: tuple[int, ...]
    seq_lens: tuple[int, ...]  # positions each real row attends, from its left padding
    tkv: int
    block_table: tuple[tuple[int, ...], ...]  # one row per (padded) sequence
    owners: Mapping[int, str]  # the pool's, live and read-only: read it in the handler, copy it to keep it
    num_blocks: int
    null_block: int
    query_lens: tuple[int, ...] = ()  # ragged layout, as BatchInfo's
    # Prefix caching: registered blocks in use -> every request holding them. These are read-only
    # and not in `owners`, which lists the private blocks only. Live and read-only, as `owners`.
    holders: Mapping[int, Sequence[str]] = field(default_factory=lambda: NO_HOLDERS)


@dataclass(slots=True)
class KVWriteEvent:
    """Every slot (block * block_size + offset) one step writes, before its kernels run."""

    step: int
    slots: tuple[int, ...]
    writers: tuple[str, ...]  # the request writing each slot
    owners: Mapping[int, str]  # as BlockTableEvent's
    holders: Mapping[int, Sequence[str]] = field(default_factory=lambda: NO_HOLDERS)  # as BlockTableEvent's


@dataclass(frozen=True)
class CacheHitEvent:
    """Prefix caching, at admission: the leading prompt blocks a request found in the cache; they
    join its table, and its first chunk starts at `len(blocks) * block_size`. Only for a hit."""

    step: int
    request_id: str
    blocks: tuple[int, ...]
    hashes: tuple[int, ...]


@dataclass(frozen=True)
class CacheRegisterEvent:
    """Prefix caching, at the end of a step: a request's `index`-th block (positions index * bs ..
    (index + 1) * bs - 1), now full, is registered under `hash`, chained from `parent`."""

    step: int
    request_id: str
    index: int
    block: int
    hash: int
    parent: int | None


@dataclass(frozen=True)
class CacheEvictEvent:
    """Prefix caching: an allocation took a cached free block back; its hash leaves the cache."""

    step: int
    block: int
    hash: int


@dataclass(frozen=True)
class RequestEvent:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class Finished:
    """An ended request: its tokens (a stop token included) and why it ended ("length", "stop", "abort")."""

    request_id: str
    tokens: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class FinishEvent:
    """A request ended, by finish or abort; emitted after the step's StepEvent and StateEvent, or
    after the abort's StateEvent. `step`: the step that ended it; for an abort, the next step's."""

    request_id: str
    reason: str
    tokens: tuple[int, ...]
    step: int


@dataclass(frozen=True)
class StepEvent:
    """Emitted after a step has finished: KV writes, tokens and frees are all done."""

    step: int
    kind: str
    bucket: Bucket  # the step's first call's
    finished: tuple[str, ...]
    buckets: tuple[Bucket, ...] = ()  # every call's, in dispatch order (ragged steps make several)


@dataclass(slots=True)
class RowState:
    """One running row after a step, as the scheduler holds it."""

    request_id: str
    left_pad: int
    blocks: tuple[int, ...]  # real blocks, in position order
    num_cached: int
    generated: int
    reserved: int  # blocks still promised to it, not yet allocated


@dataclass(slots=True)
class PrefillState:
    """Ragged layout: the request whose prompt is being prefilled in chunks, after a step."""

    request_id: str
    computed: int  # prompt tokens whose KV is cached (c)
    prompt_len: int
    blocks: tuple[int, ...]
    reserved: int


@dataclass(slots=True)
class StateEvent:
    """The batch after a step (or after an abort): what a contract model is compared with."""

    step: int  # for an abort, the number of the step that comes next
    kind: str  # "prefill", "decode", "idle" or "abort"
    admitted: str | None  # the request this step prefilled
    tkv: int
    rows: tuple[RowState, ...]
    waiting: Sequence[str]  # the queue's ids, live as `owners` is: read it in the handler, copy it to keep it
    finished: tuple[str, ...]
    free_blocks: int
    prefill: PrefillState | None = None  # ragged layout: the prompt being prefilled, if any


class EventBus:
    def __init__(self) -> None:
        self._observers: list[Any] = []
        self._handlers: dict[str, tuple[Callable[[Any], None], ...]] = {}

    def subscribe(self, observer: Any) -> Callable[[], None]:
        """Attach an observer; returns a function that detaches it."""
        self._observers.append(observer)
        self._handlers.clear()

        def detach() -> None:
            self._observers.remove(observer)
            self._handlers.clear()

        return detach

    def __bool__(self) -> bool:
        """Whether anyone listens at all."""
        return bool(self._observers)

    def _resolve(self, kind: str) -> tuple[Callable[[Any], None], ...]:
        # Looked up once per kind (and again after a subscribe or detach), not once per event.
        found = (getattr(o, "on_" + kind, None) for o in self._observers)
        handlers = self._handlers[kind] = tuple(h for h in found if h is not None)
        return handlers

    def wants(self, kind: str) -> bool:
        """Whether any observer handles `kind`: an event nobody reads is never built."""
        handlers = self._handlers.get(kind)
        return bool(self._resolve(kind) if handlers is None else handlers)

    def emit(self, kind: str, event: object) -> None:
        # The cache is read here, not through a call: every step emits several events.
        handlers = self._handlers.get(kind)
        for handler in self._resolve(kind) if handlers is None else handlers:
            handler(event)
