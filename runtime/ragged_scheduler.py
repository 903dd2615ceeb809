"""Ragged layout: the scheduler. Every sequence keeps its own length; a prompt is prefilled in
chunks under the step's token budget T, and one step runs every running row's decode, then at
most one chunk. The rules are DESIGN's "The ragged layout, precisely".

As for the padded layout, a step is `schedule()`, the kernels, then `postprocess(tokens)`, and
tensor-free callers drive the same two calls with stand-in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.block_pool import BlockPool
from runtime.blocks import ceil_div
from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from runtime.events import PrefillState, RowState
from runtime.prefix_cache import Registered, lookup, register_full
from runtime.ragged_metadata import Call, RaggedBuilder, RaggedSeq
from runtime.requests import Request, RequestQueue
from runtime.scheduler import Admission


@dataclass(frozen=True)
class RaggedPlan:
    """One ragged step, decided and laid out, with no tensors."""

    kind: str  # "decode", "prefill" (a chunk alone) or "mixed" (decodes and a chunk)
    calls: tuple[Call, ...]  # in dispatch order: the decodes, then the chunk
    decodes: tuple[RaggedSeq, ...]  # the running rows, each decoding one token
    chunk: RaggedSeq | None  # the prefill chunk, if a request is prefilling
    completes: bool  # the chunk ends its prompt, so its last query yields the first token
    inputs: tuple[int, ...]  # each row's newest token, then the chunk's prompt tokens
    admission: Admission | None = None  # the request admitted this step, with its reservation
    hit: tuple[tuple[int, int], ...] = ()  # prefix caching: the admitted request's (block, hash) from the cache
    evicted: tuple[tuple[int, int], ...] = ()  # cached (block, hash) this step's allocations took back

    @property
    def bucket(self) -> Bucket:
        return self.calls[0].bucket

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        return tuple(c.bucket for c in self.calls)

    @property
    def positions(self) -> tuple[int, ...]:
        return tuple(p for s in (*self.decodes, *((self.chunk,) if self.chunk else ())) for p in range(s.start, s.end))

    @property
    def token_rows(self) -> tuple[str, ...]:
        """The requests that get a token back, in order: every decoding row, then a completed chunk's."""
        done = (self.chunk.request_id,) if self.chunk is not None and self.completes else ()
        return tuple(s.request_id for s in self.decodes) + done

    @property
    def request_ids(self) -> tuple[str, ...]:
        return self.token_rows


class RaggedScheduler(RequestQueue):
    tkv = 0  # the ragged layout has none; state events carry 0

    def __init__(self, config: RuntimeConfig, pool: BlockPool, builder: RaggedBuilder) -> None:
        super().__init__(config, pool)
        self.builder = builder
        self.budget = config.token_budget
        self.prefilling: Request | None = None
        self._plan: RaggedPlan | None = None
        self.caching = config.prefix_caching
        self.registered: tuple[Registered, ...] = ()  # what the last postprocess registered

    def fit_problem(self, tokens: tuple[int, ...], max_tokens: int) -> str | None:
        if len(tokens) + max_tokens > self.config.max_model_len:
            return (
                f"request can never fit: prompt of {len(tokens)} tokens plus max_tokens={max_tokens} exceeds "
                f"max_model_len={self.config.max_model_len}"
            )
        return None

    def in_flight(self) -> tuple[Request, ...]:
        return (*self.running, *((self.prefilling,) if self.prefilling else ()))

    def schedule(self) -> RaggedPlan | None:
        """The next step, laid out; None when nothing is admitted and nothing can be. A plan whose
        kernels raised is handed out again, as for the padded layout."""
        if self._plan is not None:
            return self._plan
        adm = self.next_admission() if self.prefilling is None else None
        hit: tuple[tuple[int, int], ...] = ()
        if adm is not None:
            hit = self._admit(adm)
        if not self.running and self.prefilling is None:
            return None
        decodes = []
        for r in self.running:
            self._grow(r, r.num_cached + 1)
            decodes.append(RaggedSeq(r.request_id, tuple(r.blocks), r.num_cached, 1))
        inputs = [r.output[-1] for r in self.running]
        chunk, completes = None, False
        if (pf := self.prefilling) is not None:
            r = pf
            q = min(len(r.prompt) - r.computed, self.budget - len(self.running))
            assert q >= 1, "a prefilling request holds a slot, so the budget always leaves it a token"
            self._grow(r, r.computed + q)
            chunk, completes = RaggedSeq(r.request_id, tuple(r.blocks), r.computed, q), r.computed + q == len(r.prompt)
            inputs += r.prompt[r.computed : r.computed + q]
        kind = "mixed" if decodes and chunk else "decode" if decodes else "prefill"
        calls = self.builder.build_step(decodes, chunk)
        evicted, self.pool.evicted[:] = tuple(self.pool.evicted), []
        self._plan = RaggedPlan(kind, calls, tuple(decodes), chunk, completes, tuple(inputs), adm, hit, evicted)
        return self._plan

    def postprocess(self, tokens: list[int]) -> list[Request]:
        """Apply the scheduled step's tokens (one per `token_rows`): record them, move a completed
        prompt to the end of the running rows, finish and free what is done."""
        plan, self._plan = self._plan, None
        assert plan is not None, "postprocess follows schedule"
        assert len(tokens) == len(plan.token_rows), f"{len(tokens)} tokens for {len(plan.token_rows)} rows"
        rows = list(self.running)
        ends: list[tuple[Request, str]] = []
        for r, t in zip(rows, tokens, strict=False):
            r.output.append(t)
            if (reason := self.finish_reason(r)) is not None:
                ends.append((r, reason))
        stepped = rows
        if plan.chunk is not None and (pf := self.prefilling) is not None:
            r = pf
            r.computed += plan.chunk.query_len
            stepped = [*rows, r]
            if plan.completes:
                self.prefilling = None
                self.running.append(r)
                r.output.append(tokens[-1])
                if (reason := self.finish_reason(r)) is not None:
                    ends.append((r, reason))
        # Blocks this step filled register before the step's finishes drop their references.
        self.registered = tuple(reg for r in stepped for reg in self._register(r)) if self.caching else ()
        for r, reason in ends:
            self._end(r, reason)
        return [r for r, _ in ends]

    def _register(self, r: Request) -> list[Registered]:
        written = r.num_cached if r.computed == len(r.prompt) else r.computed
        return register_full(self.pool, r.request_id, (*r.prompt, *r.output), written, r.blocks, r.hashes, self.bs)

    def next_admission(self) -> Admission | None:
        """The head of the queue, if it can start prefilling now (arrival order: nobody overtakes it)."""
        if self.prefilling is not None or not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        req = self.waiting[0]
        need = ceil_div(len(req.prompt) + req.max_tokens - 1, self.bs)
        return Admission(req, 0, 0, need) if self.pool.can_reserve(need) else None

    def _admit(self, adm: Admission) -> tuple[tuple[int, int], ...]:
        """Start the head of the queue prefilling; with prefix caching, from its cached prefix on.
        Returns the (block, hash) pairs it got from the cache."""
        req = self.waiting.popleft()
        assert req is adm.request
        self.pool.reserve(req.request_id, adm.reservation)
        blocks, hashes = lookup(self.pool, req.prompt, self.bs) if self.caching else ([], [])
        for b in blocks:
            self.pool.share(req.request_id, b)
        req.blocks, req.hashes, req.computed = list(blocks), list(hashes), len(blocks) * self.bs
        self.prefilling = req
        return tuple(zip(blocks, hashes, strict=True))

    def _grow(self, r: Request, positions: int) -> None:
        """Give `r` the blocks its positions 0 .. positions - 1 land in, from its reservation."""
        need = ceil_div(positions, self.bs) - len(r.blocks)
        if need > 0:
            r.blocks += self.pool.allocate(r.request_id, need)

    def free_order(self, blocks: list[int]) -> list[int]:
        """Last table entry first (DESIGN "References."), so a prefix's tail is evicted before its head."""
        return blocks[::-1]

    def _end(self, r: Request, reason: str) -> None:
        if r is self.prefilling:  # an aborted prefill frees the slot for the next step's admission
            self.prefilling = None
            self.running.append(r)
        super()._end(r, reason)

    def row_states(self) -> tuple[RowState, ...]:
        rows = [(r, self.pool.reserved(r.request_id)) for r in self.running]
        return tuple([RowState(r.request_id, 0, tuple(r.blocks), r.num_cached, len(r.output), n) for r, n in rows])

    def prefill_state(self) -> PrefillState | None:
        r = self.prefilling
        if r is None:
            return None
        return PrefillState(r.request_id, r.computed, len(r.prompt), tuple(r.blocks), self.pool.reserved(r.request_id))

    def snapshot(self) -> tuple[object, ...]:
        """Everything a bad request must leave untouched."""
        rows = tuple((r.request_id, tuple(r.blocks), tuple(r.output)) for r in self.running)
        waiting = tuple(r.request_id for r in self.waiting)
        pf = self.prefill_state()
        return (rows, pf, waiting, self.pool.snapshot(), self._next_id, frozenset(self._ids))
