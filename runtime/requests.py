"""Requests and the queue every scheduler shares: validation, ids, add, abort, finish.

A layout's scheduler (padded: `runtime.scheduler`, ragged: `runtime.ragged_scheduler`) adds
its own fit rule (`fit_problem`), admission and step on top of this.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.block_pool import BlockPool
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.metadata import SeqState

FINISH_REASONS = ("length", "stop", "abort")


@dataclass
class Request:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    output: list[int] = field(default_factory=list)
    left_pad: int = 0  # padded layout
    computed: int = 0  # ragged layout: prompt tokens prefilled so far
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # prefix caching: its full blocks' chain hashes, in order
    finish_reason: str | None = None  # one of FINISH_REASONS once it has ended

    @property
    def num_cached(self) -> int:
        # The newest generated token is the next decode's input, not yet cached.
        return len(self.prompt) + max(len(self.output) - 1, 0)

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.output)

    def seq_state(self) -> SeqState:
        return SeqState(self.request_id, tuple(self.blocks), self.num_cached, self.left_pad)


def token_ids(name: str, value: object, vocab: int) -> tuple[int, ...]:
    """A request's list of token ids (`name` is its field), checked against the vocabulary."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise RequestError(f"{name} must be a list of ints, got {type(value).__name__}")
    tokens = tuple(value)
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int):
            raise RequestError(f"{name}: token {t!r} is not an int")
        if not 0 <= t < vocab:
            raise RequestError(f"{name}: token {t} is outside the vocabulary [0, {vocab})")
    return tokens


class QueueIds(Sequence[str]):
    """The waiting queue's ids, live and read-only as `BlockTableEvent.owners` is: the state event
    lists them every step, and the queue can be long. Copy it to keep it."""

    def __init__(self, queue: deque[Request]) -> None:
        self._queue = queue

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[str]:
        return (r.request_id for r in self._queue)

    def __getitem__(self, i: Any) -> Any:
        return tuple(self)[i]


class RequestQueue:
    """The waiting queue and the running rows, with what every layout does the same way."""

    def __init__(self, config: RuntimeConfig, pool: BlockPool) -> None:
        self.config = config
        self.pool = pool
        self.bs = config.block_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._next_id = 0
        self._ids: set[str] = set()
        self._plan: Any = None  # scheduled, not yet postprocessed
        self.waiting_ids = QueueIds(self.waiting)  # live: the state event hands it out every step

    def fit_problem(self, tokens: tuple[int, ...], max_tokens: int) -> str | None:
        """Why a request can never run under this layout; None when it can."""
        raise NotImplementedError

    def validate(self, prompt: object, max_tokens: object, request_id: object) -> tuple[tuple[int, ...], int, str]:
        """Check a request without touching any state; raise RequestError naming the fault."""
        vocab = self.config.model.vocab_size
        tokens = token_ids("prompt_token_ids", prompt, vocab)
        if not tokens:
            raise RequestError("prompt_token_ids is empty; give at least one token")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(f"max_tokens={max_tokens!r}: must be an integer >= 1")
        if (problem := self.fit_problem(tokens, max_tokens)) is not None:
            raise RequestError(problem)
        rid = self._fresh_id() if request_id is None else request_id
        if not isinstance(rid, str) or not rid:
            raise RequestError(f"request_id={request_id!r}: must be a non-empty string")
        if rid in self._ids:
            raise RequestError(f"request_id={rid!r} is already in use")
        return tokens, max_tokens, rid

    def _fresh_id(self) -> str:
        n = self._next_id
        while f"req-{n}" in self._ids:
            n += 1
        return f"req-{n}"

    def add(
        self,
        prompt: object,
        max_tokens: object,
        request_id: object = None,
        stop_token_ids: object = (),
        ignore_eos: object = False,
    ) -> str:
        tokens, mt, rid = self.validate(prompt, max_tokens, request_id)
        stops = token_ids("stop_token_ids", stop_token_ids, self.config.model.vocab_size)
        if not isinstance(ignore_eos, bool):
            raise RequestError(f"ignore_eos={ignore_eos!r}: must be True or False")
        if request_id is None:
            self._next_id = int(rid.removeprefix("req-")) + 1
        self._ids.add(rid)
        self.waiting.append(Request(rid, tokens, mt, stops, ignore_eos))
        return rid

    def in_flight(self) -> tuple[Request, ...]:
        """The admitted requests an abort can end: the running rows (and a ragged prefill)."""
        return tuple(self.running)

    def abort(self, request_id: object) -> Request:
        """End a waiting or admitted request between steps (DESIGN Abort.): an admitted one returns
        its blocks and reservation at once."""
        req = next((r for r in (*self.waiting, *self.in_flight()) if r.request_id == request_id), None)
        if req is None:
            why = "it has ended" if isinstance(request_id, str) and request_id in self._ids else "no such request"
            raise RequestError(f"cannot abort request_id={request_id!r}: {why}")
        if req in self.waiting:
            self.waiting.remove(req)
            req.finish_reason = "abort"
            return req
        if self._plan is not None:  # only after a step's kernels raised: its rows are still in flight
            raise RequestError(f"cannot abort request_id={request_id!r} while a scheduled step is unfinished")
        self._end(req, "abort")
        return req

    def finish_reason(self, r: Request) -> str | None:
        """Why `r` ends after the token it just generated, or None. A stop token wins over
        max_tokens, as in vLLM, and stays in the output."""
        t = r.output[-1]
        if t in r.stop_token_ids or (t == self.config.model.eos_token_id and not r.ignore_eos):
            return "stop"
        return "length" if r.remaining == 0 else None

    def _end(self, r: Request, reason: str) -> None:
        """A running request ends: its blocks and what is left of its reservation return."""
        r.finish_reason = reason
        self.running.remove(r)
        self.pool.free(r.request_id, self.free_order(r.blocks))
        self.pool.release(r.request_id)

    def free_order(self, blocks: list[int]) -> list[int]:
        """The order an ended request's blocks return to the free list in."""
        return blocks
