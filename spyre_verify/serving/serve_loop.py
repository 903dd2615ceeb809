"""The one arrival-and-serve loop: submit each arrival before its step, step until drained.

`check` (`serve_judged`, below), `soak`, coverage traffic (`traffic.drive`, for `check` and
`audit`) and the benchmarks all serve through `serve`, so they share one idle rule: an
engine with nothing to do while arrivals are still to come skips ahead to the next
arrival, keeping the gaps between the later ones. It drives anything with the engine's
serving face: `runtime.engine.Engine`, the tensor-free `spyre_verify.serving.sim.Sim`, or the
benchmark's engines in lockstep. A workload's `Abort` items abort the request of an
earlier arrival between steps, as a client that goes away does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from spyre_verify.serving.workload import Abort, Arrival, Item

DRAINED, DEADLINE, MAX_STEPS, IDLE, STALL = None, "deadline", "max_steps", "idle", "stall"


class Servable(Protocol):
    """What `serve` needs of an engine."""

    @property
    def steps(self) -> int: ...

    def add_request(
        self, prompt_token_ids: object, max_tokens: object, *, stop_token_ids: object = (), ignore_eos: object = False
    ) -> str: ...

    def abort(self, request_id: object) -> Any: ...

    def step(self) -> Any: ...

    def has_work(self) -> bool: ...


# Arrival ids an endless stream's Feed keeps for its aborts (a soak's abort comes within 16 steps).
ENDLESS_WINDOW, TRIM = 256, 32


class Feed:
    """Arrivals (and aborts) in step order, looked at one ahead; resumable across `serve` calls.

    Arrival step `s` is due before engine step `offset + s`. An idle skip-ahead moves
    the offset, so the arrivals after the next keep their gaps. The arrivals may be an
    endless iterator. `ids` holds the request id of every arrival submitted so far
    (None: refused), which an `Abort` names by its index; for arrivals that are not a
    sequence (an endless stream, a soak's) only the last ENDLESS_WINDOW of them are kept,
    so a long run's memory stays flat (`submitted` counts them all).
    """

    def __init__(self, arrivals: Iterable[Item], offset: int = 0) -> None:
        self._rest = iter(arrivals)
        self.head: Item | None = next(self._rest, None)
        self.offset = offset
        self.ids: list[str | None] = []
        self.dropped = 0  # ids forgotten from the front of `ids`
        self.window = None if isinstance(arrivals, Sequence) else ENDLESS_WINDOW

    def submitted(self, rid: str | None) -> None:
        self.ids.append(rid)
        if self.window is not None and len(self.ids) > self.window + TRIM:
            del self.ids[:TRIM]  # a cut every TRIM arrivals keeps the list within TRIM of the window
            self.dropped += TRIM

    def id_of(self, ref: int) -> str | None:
        """The request id of arrival `ref`; KeyError when it is not (or no longer) known."""
        i = ref - self.dropped
        if not 0 <= i < len(self.ids):
            raise KeyError(ref)
        return self.ids[i]

    def due(self, now: int) -> Item | None:
        """Take the next arrival if it is due before engine step `now`."""
        head = self.head
        if head is None or head.step + self.offset > now:
            return None
        self.head = next(self._rest, None)
        return head

    def skip_to(self, now: int) -> None:
        """Make the next arrival due at `now`, keeping the gaps between it and the later ones."""
        if self.head is not None:
            self.offset = now - self.head.step


@dataclass
class ServeStats:
    submitted: int = 0  # arrivals handed to add_request
    accepted: int = 0
    rejected: int = 0
    aborted: int = 0  # aborts the engine carried out
    abort_missed: int = 0  # aborts of a request already ended, or refused at add
    steps: int = 0  # steps served
    # Why it stopped before every arrival was served and the engine drained: DEADLINE,
    # MAX_STEPS, IDLE (with skip_idle=False) or STALL (a step that did not advance); None: drained.
    stopped: str | None = DRAINED


# The protocol's refusal: a ValueError (the bundled runtime's RequestError is one).
Rejected = Callable[[Arrival, ValueError], None]
# An abort with nothing left to abort, and the request id it named (None: its arrival was refused).
Missed = Callable[[Abort, str | None], None]
# Every abort sent to the runtime: the request id, and whether the runtime refused it.
Aborted = Callable[[str, bool], None]
# The runtime said it has no work: the steps it has run so far.
Idle = Callable[[int], None]


def serve(
    engine: Servable,
    arrivals: Iterable[Item] | Feed,
    *,
    on_rejected: Rejected | None = None,
    on_step: Callable[[Any, ServeStats], None] | None = None,
    on_missed: Missed | None = None,
    on_abort: Aborted | None = None,
    on_idle: Idle | None = None,
    deadline: float | None = None,
    max_steps: int | None = None,
    skip_idle: bool = True,
    stats: ServeStats | None = None,
) -> ServeStats:
    """Submit every arrival before its step and step `engine` until it is drained.

    Plain `arrivals` count their steps from the engine's step count now; pass a `Feed`
    to resume a stream across calls. A request `add_request` refuses goes to
    `on_rejected`; without one the ValueError propagates. An `Abort` whose request
    has already ended (or was refused) is counted in `stats.abort_missed` and shown to
    `on_missed(abort, request_id)`; every abort sent goes to `on_abort(request_id, refused)`
    once the call returned or raised. `on_step(result, stats)` follows every step, and
    `on_idle(engine.steps)` every time the engine says it has no work. It
    stops early, naming why in `stats.stopped`: past `deadline` (a `time.monotonic()`
    value; nothing more is submitted or stepped), after `max_steps` steps with work
    left, or, with `skip_idle=False`, when the engine idles while arrivals are still to
    come. Counts go into `stats` when given, so a caller
    keeps them when a step raises.
    """
    feed = arrivals if isinstance(arrivals, Feed) else Feed(arrivals, engine.steps)
    stats = stats if stats is not None else ServeStats()
    while True:
        if deadline is not None and time.monotonic() > deadline:
            stats.stopped = DEADLINE
            return stats
        while (a := feed.due(engine.steps)) is not None:
            if isinstance(a, Abort):
                _abort(engine, feed, a, stats, on_missed, on_abort)
            else:
                feed.submitted(_submit(engine, a, stats, on_rejected))
        if not engine.has_work():
            if on_idle is not None:
                on_idle(engine.steps)
            if feed.head is None:
                stats.stopped = DRAINED
                return stats
            if not skip_idle:
                stats.stopped = IDLE
                return stats
            feed.skip_to(engine.steps)
            continue
        if max_steps is not None and stats.steps >= max_steps:
            stats.stopped = MAX_STEPS
            return stats
        before = engine.steps
        result = engine.step()
        if engine.steps == before:  # work left but nothing it can do: never spin
            stats.stopped = STALL
            return stats
        stats.steps += 1
        if on_step is not None:
            on_step(result, stats)


def _submit(engine: Servable, a: Arrival, stats: ServeStats, on_rejected: Rejected | None) -> str | None:
    """Add one arrival; its request id, or None when refused."""
    stats.submitted += 1
    try:
        rid = engine.add_request(list(a.prompt), a.max_tokens, stop_token_ids=a.stop_token_ids, ignore_eos=a.ignore_eos)
    except refusal(engine) as e:
        stats.rejected += 1
        if on_rejected is None:
            raise
        on_rejected(a, e)
        return None
    stats.accepted += 1
    return rid


def _abort(
    engine: Servable, feed: Feed, a: Abort, stats: ServeStats, on_missed: Missed | None, on_abort: Aborted | None
) -> None:
    try:
        rid = feed.id_of(a.ref)
    except KeyError:
        seen = feed.dropped + len(feed.ids)
        raise ValueError(f"{a}: the workload has no earlier arrival #{a.ref} to abort ({seen} so far)") from None
    try:
        if rid is not None:
            engine.abort(rid)
            stats.aborted += 1
            if on_abort is not None:
                on_abort(rid, False)
            return
    except refusal(engine):  # it has already ended: the client left too late, as clients do
        if on_abort is not None:
            on_abort(str(rid), True)
    stats.abort_missed += 1
    if on_missed is not None:
        on_missed(a, rid)


def refusal(engine: object) -> type[ValueError]:
    """What the runtime raises to refuse a request or an abort: its own `refusal` type when it names
    one (the bundled runtime's RequestError), else the protocol's ValueError. A narrower type keeps
    a ValueError from a bug in the runtime from passing for a refusal."""
    kind = getattr(engine, "refusal", ValueError)
    return kind if isinstance(kind, type) and issubclass(kind, ValueError) else ValueError


def ignore(arrival: Arrival, error: ValueError) -> None:
    """An `on_rejected` for callers that only count refusals."""


def _judges(observers: Sequence[Any], method: str) -> list[Callable[..., None]]:
    """Each observer's `method`, for observers that have it (a checker the runtime's capabilities
    left unrun is shown nothing)."""
    return [getattr(o, method) for o in observers if hasattr(o, method) and getattr(o, "not_run", None) is None]


def _told(observers: Sequence[Any], method: str) -> Callable[..., None]:
    """A callback that calls `method` with its arguments on every observer that has it."""
    judges = _judges(observers, method)

    def tell(*args: Any) -> None:
        for j in judges:
            j(*args)

    return tell


def aborts_judged_by(observers: Sequence[Any]) -> Aborted:
    """An `on_abort` that shows every abort sent to each observer with an `on_abort_call` method."""
    return _told(observers, "on_abort_call")


def idles_judged_by(observers: Sequence[Any]) -> Idle:
    """An `on_idle` that tells each observer with an `on_idle` method that the runtime said it
    has no work (liveness holds every accepted request to having ended by then)."""
    return _told(observers, "on_idle")


def judged_by(observers: Sequence[Any]) -> Rejected:
    """An `on_rejected` that shows every refusal to each observer with an `on_rejected`
    method (the contract model judges whether DESIGN refuses it too)."""
    judges = _judges(observers, "on_rejected")

    def judge(a: Arrival, e: ValueError) -> None:
        for j in judges:
            j(a.prompt, a.max_tokens, str(e))

    return judge


def judging(observers: Sequence[Any]) -> dict[str, Any]:
    """`serve`'s callbacks that show every refusal, abort and idle moment to the observers."""
    return {
        "on_rejected": judged_by(observers),
        "on_abort": aborts_judged_by(observers),
        "on_idle": idles_judged_by(observers),
    }


def serve_judged(
    engine: Any, workload: Sequence[Item], progress: Callable[[str], None] | None = None, observers: Sequence[Any] = ()
) -> tuple[int, int]:
    """Serve the workload to completion through `serve_loop.serve`; returns (accepted, rejected).

    A rejected request is shown to every observer with an `on_rejected` method, so a
    contract model can judge the refusal.
    """

    arrivals = sum(isinstance(a, Arrival) for a in workload)

    def note(_: object, s: ServeStats) -> None:
        if progress and engine.steps % 50 == 0:
            progress(f"serving: step {engine.steps}, {s.accepted} requests added, {arrivals - s.submitted} to come")

    stats = serve(engine, workload, **judging(observers), on_step=note)
    return stats.accepted, stats.rejected
