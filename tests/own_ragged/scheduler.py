"""The ragged scheduler (CONTRACT.md "Requests" and "The ragged layout"): the waiting queue in
arrival order, at most one prompt prefilling in chunks under the step's token budget T, and the
running rows in the order their prompts completed. A step is `schedule()` (admission, blocks,
the calls), the kernels, then `postprocess(tokens)`."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .buckets import Builder, Call, Seq
from .config import Config, ceil_div
from .events import PrefillState, RowState
from .pool import BlockPool


class RequestRefused(ValueError):
    """A request that can never be served, or an abort of a request that is not live: nothing changed."""


@dataclass
class Request:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    output: list[int] = field(default_factory=list)
    computed: int = 0  # prompt tokens whose KV is cached, while it prefills
    blocks: list[int] = field(default_factory=list)
    reason: str | None = None  # once it has ended: "length", "stop" or "abort"

    @property
    def num_cached(self) -> int:
        """Tokens whose KV is cached once its prompt is: the prompt, every output token but the newest."""
        return len(self.prompt) + max(len(self.output) - 1, 0)


@dataclass(frozen=True)
class Plan:
    kind: str  # "decode", "prefill" (a chunk alone) or "mixed"
    calls: tuple[Call, ...]
    decodes: tuple[Seq, ...]
    chunk: Seq | None
    completes: bool  # the chunk ends its prompt: its last query yields the request's first token
    inputs: tuple[int, ...]  # each running row's newest token, then the chunk's prompt tokens
    admitted: str | None

    @property
    def positions(self) -> tuple[int, ...]:
        seqs = (*self.decodes, *((self.chunk,) if self.chunk is not None else ()))
        return tuple(p for s in seqs for p in range(s.start, s.end))

    @property
    def token_rows(self) -> tuple[str, ...]:
        """Who gets a token: every decoding row, then a completed prompt."""
        done = (self.chunk.request_id,) if self.chunk is not None and self.completes else ()
        return tuple(s.request_id for s in self.decodes) + done


class Queue(Sequence[str]):
    """The waiting ids, live and read-only: copy to keep."""

    def __init__(self, waiting: deque[Request]) -> None:
        self._waiting = waiting

    def __len__(self) -> int:
        return len(self._waiting)

    def __iter__(self) -> Iterator[str]:
        return (r.request_id for r in self._waiting)

    def __getitem__(self, i: Any) -> Any:
        return tuple(self)[i]


def token_list(name: str, value: object, vocab: int) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise RequestRefused(f"{name} must be a list of token ids, got {type(value).__name__}")
    tokens = tuple(value)  # type: ignore[arg-type]
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise RequestRefused(f"{name}: {t!r} is not a token id in [0, {vocab})")
    return tokens


class Scheduler:
    def __init__(self, config: Config, pool: BlockPool, builder: Builder, abort_leak: bool = False) -> None:
        self.config, self.pool, self.builder = config, pool, builder
        self.bs, self.budget = config.block_size, config.max_num_batched_tokens
        self.abort_leak = abort_leak
        self.waiting: deque[Request] = deque()
        self.waiting_ids = Queue(self.waiting)
        self.running: list[Request] = []
        self.prefilling: Request | None = None
        self.ids: set[str] = set()
        self.next_id = 0
        self.plan: Plan | None = None  # scheduled, not yet postprocessed

    # -- requests ------------------------------------------------------------------------------
    def add(
        self, prompt: object, max_tokens: object, request_id: object, stop_token_ids: object, ignore_eos: object
    ) -> Request:
        vocab, L = self.config.model.vocab_size, self.config.max_model_len
        tokens = token_list("prompt_token_ids", prompt, vocab)
        if not tokens:
            raise RequestRefused("prompt_token_ids is empty")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestRefused(f"max_tokens={max_tokens!r}: an integer, at least 1")
        if len(tokens) + max_tokens > L:
            raise RequestRefused(f"a prompt of {len(tokens)} tokens plus max_tokens={max_tokens} exceeds {L}")
        stops = token_list("stop_token_ids", stop_token_ids, vocab)
        if not isinstance(ignore_eos, bool):
            raise RequestRefused(f"ignore_eos={ignore_eos!r}: True or False")
        if request_id is None:
            while f"req-{self.next_id}" in self.ids:
                self.next_id += 1
            request_id = f"req-{self.next_id}"
        if not isinstance(request_id, str) or not request_id or request_id in self.ids:
            raise RequestRefused(f"request_id={request_id!r}: a non-empty string not used before")
        self.ids.add(request_id)
        req = Request(request_id, tokens, max_tokens, stops, ignore_eos)
        self.waiting.append(req)
        return req

    def live(self) -> tuple[Request, ...]:
        return (*self.waiting, *self.running, *((self.prefilling,) if self.prefilling else ()))

    def abort(self, request_id: object) -> Request:
        req = next((r for r in self.live() if r.request_id == request_id), None)
        if req is None:
            why = "it has ended" if isinstance(request_id, str) and request_id in self.ids else "no such request"
            raise RequestRefused(f"cannot abort {request_id!r}: {why}")
        if req in self.waiting:
            self.waiting.remove(req)
        elif self.plan is not None:  # only after a step's kernels raised: the step still holds it
            raise RequestRefused(f"cannot abort {request_id!r} while its step is unfinished")
        else:
            self._end(req, "abort")
        req.reason = "abort"
        return req

    def finish_reason(self, r: Request) -> str | None:
        t = r.output[-1]
        if t in r.stop_token_ids or (t == self.config.model.eos_token_id and not r.ignore_eos):
            return "stop"
        return "length" if len(r.output) >= r.max_tokens else None

    def _end(self, r: Request, reason: str) -> None:
        r.reason = reason
        if r is self.prefilling:
            self.prefilling = None
        else:
            self.running.remove(r)
        if reason == "abort" and self.abort_leak:
            self.pool.release(r.request_id)  # the bug: its blocks stay allocated to it
            return
        self.pool.free(r.request_id, r.blocks)

    # -- one step ------------------------------------------------------------------------------
    def need(self, r: Request) -> int:
        """Every block a request can ever need: up to its last cached token, position p + max_tokens - 2."""
        return ceil_div(len(r.prompt) + r.max_tokens - 1, self.bs)

    def admit(self) -> Request | None:
        """The head of the queue starts prefilling when nothing prefills, a slot is free and its
        whole reservation fits beside the others'."""
        if self.prefilling is not None or not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        head = self.waiting[0]
        if self.need(head) > self.pool.num_free:
            return None
        self.waiting.popleft()
        self.pool.reserve(head.request_id, self.need(head))
        self.prefilling = head
        return head

    def grow(self, r: Request, positions: int) -> None:
        more = ceil_div(positions, self.bs) - len(r.blocks)
        if more > 0:
            r.blocks += self.pool.allocate(r.request_id, more)

    def schedule(self) -> Plan | None:
        """The next step laid out; None when nothing runs. A plan whose kernels raised is handed out again."""
        if self.plan is not None:
            return self.plan
        admitted = self.admit()
        if not self.running and self.prefilling is None:
            return None
        decodes = []
        for r in self.running:
            self.grow(r, r.num_cached + 1)
            decodes.append(Seq(r.request_id, tuple(r.blocks), r.num_cached, 1))
        inputs = [r.output[-1] for r in self.running]
        chunk, completes = None, False
        if (pf := self.prefilling) is not None:
            q = min(len(pf.prompt) - pf.computed, self.budget - len(self.running))
            self.grow(pf, pf.computed + q)
            chunk, completes = Seq(pf.request_id, tuple(pf.blocks), pf.computed, q), pf.computed + q == len(pf.prompt)
            inputs += pf.prompt[pf.computed : pf.computed + q]
        kind = "mixed" if decodes and chunk else "decode" if decodes else "prefill"
        calls = self.builder.build_step(decodes, chunk)
        name = admitted.request_id if admitted else None
        self.plan = Plan(kind, calls, tuple(decodes), chunk, completes, tuple(inputs), name)
        return self.plan

    def postprocess(self, tokens: list[int]) -> list[Request]:
        """The step's tokens, one per `token_rows`: record them, move a completed prompt to the end
        of the running rows, and end what is done (its blocks and reservation return at once)."""
        plan, self.plan = self.plan, None
        assert plan is not None and len(tokens) == len(plan.token_rows)
        done = []
        for r, t in zip(list(self.running), tokens, strict=False):
            r.output.append(t)
            if (why := self.finish_reason(r)) is not None:
                self._end(r, why)
                done.append(r)
        if plan.chunk is not None and (pf := self.prefilling) is not None:
            pf.computed += plan.chunk.query_len
            if plan.completes:
                self.prefilling = None
                self.running.append(pf)
                pf.output.append(tokens[-1])
                if (why := self.finish_reason(pf)) is not None:
                    self._end(pf, why)
                    done.append(pf)
        return done

    # -- what the state event shows ------------------------------------------------------------
    def row_states(self) -> tuple[RowState, ...]:
        reserved = self.pool.reserved
        return tuple(
            RowState(r.request_id, 0, tuple(r.blocks), r.num_cached, len(r.output), reserved(r.request_id))
            for r in self.running
        )

    def prefill_state(self) -> PrefillState | None:
        r = self.prefilling
        if r is None:
            return None
        return PrefillState(r.request_id, r.computed, len(r.prompt), tuple(r.blocks), self.pool.reserved(r.request_id))

    def snapshot(self) -> tuple[object, ...]:
        """Everything a refused request must leave as it was."""
        rows = tuple((r.request_id, tuple(r.blocks), tuple(r.output)) for r in self.running)
        pf = self.prefill_state()
        return rows, pf, tuple(self.waiting_ids), self.pool.snapshot(), self.next_id, frozenset(self.ids)
