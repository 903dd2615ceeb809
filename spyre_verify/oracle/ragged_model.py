"""A tensor-free model of DESIGN "The ragged layout, precisely", run in lockstep with an engine.

Written from the document, not from `runtime.ragged_scheduler`: a waiting queue in arrival
order, at most one prefilling request (`c` of its `p` prompt tokens computed), and the running
rows in the order their prefill ended. A step admits the head of the queue only (a free slot,
nothing prefilling, and its whole reservation `ceil((p + max_tokens - 1) / bs)` fits beside the
admitted ones within `U`), decodes every running row once, then computes the chunk
`q = min(p - c, T - d)`; a prompt that completes yields its first token and joins the end of
running. Finishes (length, stop) and aborts (of a waiting, prefilling or running request) return
blocks and reservation in the same step. There is no tkv, no shift and no strip.

The blocks are physical (DESIGN "Prefix caching (ragged layout)", `oracle.ragged_pool`): a free
list in least-recently-freed order, from 1..U; each request's table grows as its positions are
written (the decodes in running order, then the chunk), from the head of the list. With prefix
caching on (`derive.prefix_caching`), an admitted request looks its prompt up block by block (at
most floor((p - 1) / bs) blocks, so one token is computed) and starts at c = h * bs; at the end of
a step every block that became full registers under its chain unless the chain is registered, and
then the step's endings drop their references, last table entry first. Content the model is not
told (a prompt added without tokens, a step without `tokens`) is unique: it never hits.

API, the shape of `oracle.model.ContractModel` so one checker drives either:
- `RaggedModel(config)`: `rows` (`RaggedRow`), `prefill` (`Prefilling` or None), `waiting` (`Pending`).
- `reject_reason(prompt_len, max_tokens)`, `add(request_id, prompt_len, max_tokens, prompt=None)`,
  `has_work()`; `prompt`, the request's tokens, lets it hit and register (None: unique content).
- `step(stopped=(), tokens=None) -> RaggedStep` (also kept as `last`): one engine step; `stopped`
  names the requests whose token this step was a stop token, `tokens` the token each request got
  (the decoding rows and a completed prompt), so that blocks decodes fill register by content.
- The pool, for a checker to compare: `tables()` (request -> its blocks), `pool.free` (the free
  list, head first), `pool.hashes` (registered block -> chain id), `pool.refs`.
- `abort_refusal(request_id)`, `abort(request_id) -> RaggedStep` (kind "abort").
- `diff`, `agrees`, `differences` (from `oracle.ragged_compare.RaggedJudge`): how an engine's state,
  dispatches and tokens after the same step differ, as (rule, message), the likeliest cause first.
- `resync(tkv, rows, waiting, prefill=None)`: adopt an engine's state after a divergence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from runtime.config import RuntimeConfig
from runtime.events import PrefillState, RowState
from spyre_verify.oracle.derive import ceil_div, ladders, prefix_caching, token_budget, usable_blocks
from spyre_verify.oracle.model import Requests, request_refusal
from spyre_verify.oracle.ragged_compare import RaggedJudge
from spyre_verify.oracle.ragged_pool import PrefixPool, Token


def add_refusal(max_model_len: int, prompt_len: int, max_tokens: int) -> str | None:
    """DESIGN "Add." (ragged): why `add_request` refuses a request; None to accept it. No padding:
    a request with p + max_tokens > L can never run."""
    if why := request_refusal(prompt_len, max_tokens):
        return why
    if prompt_len + max_tokens > max_model_len:
        return f"a prompt of {prompt_len} plus max_tokens={max_tokens} exceeds max_model_len={max_model_len}"
    return None


@dataclass(slots=True)
class RaggedRow:
    request_id: str
    cached: int  # n: the prompt and every generated token but the newest
    generated: int
    max_tokens: int
    reservation: int  # blocks it can ever need: held plus still promised
    blocks: list[int] = field(default_factory=list)  # its table, in position order
    chains: list[int] = field(default_factory=list)  # with caching on: each full block's chain id
    content: list[Token] = field(default_factory=list)  # with caching on: prompt, then generated tokens


@dataclass(slots=True)
class Prefilling:
    request_id: str
    prompt_len: int
    max_tokens: int
    computed: int  # c
    reservation: int
    blocks: list[int] = field(default_factory=list)
    chains: list[int] = field(default_factory=list)
    content: list[Token] = field(default_factory=list)


@dataclass(slots=True)
class RaggedStep:
    kind: str  # "decode", "prefill" (a chunk alone), "mixed", "idle" or "abort"
    admitted: str | None
    decodes: tuple[tuple[str, int], ...]  # each decoding row and the seq_len its call attends (n + 1)
    chunk: tuple[str, int, int, int, int] | None  # (request, c before, q, p, d): the budget's inputs
    completes: bool  # the chunk ended its prompt, so its request got its first token
    finished: tuple[str, ...]
    rules: tuple[str, ...]  # the rules that fired, in order
    held_back: str  # why the head of the queue was not admitted ("" when it was, or none waits)
    hit: tuple[str, int] | None = None  # the admitted request and the prompt blocks it found cached
    registered: tuple[tuple[str, int], ...] = ()  # (request, block): each full block registered at the end
    evicted: tuple[int, ...] = ()  # the blocks an allocation took from the free list with a hash

    @property
    def token_rows(self) -> tuple[str, ...]:
        """The requests that got a token: every decoding row, then a completed prompt's."""
        done = (self.chunk[0],) if self.chunk is not None and self.completes else ()
        return tuple(rid for rid, _ in self.decodes) + done


IDLE = RaggedStep("idle", None, (), None, False, (), (), "")


class RaggedModel(Requests, RaggedJudge):
    def __init__(self, config: RuntimeConfig) -> None:
        super().__init__()
        self.bs, self.L, self.S = config.block_size, config.max_model_len, config.max_num_seqs
        # From the raw fields (DESIGN), not the runtime's properties: an off-by-one in the
        # runtime's arithmetic must show as a divergence, not move the model along with it.
        self.U, self.T = usable_blocks(config), token_budget(config)
        self.lad = ladders(config)
        self.caching = prefix_caching(config)
        self.tkv = 0  # the ragged layout has none; kept for the checker's shared reading
        self.rows: list[RaggedRow] = []
        self.prefill: Prefilling | None = None
        self.reserved = 0  # the admitted requests' reservations, the prefilling one's included
        self.pool = PrefixPool(self.U)
        self.prompts: dict[str, tuple[int, ...]] = {}  # waiting requests added with their tokens
        self.last: RaggedStep = IDLE

    # -- requests --------------------------------------------------------------------------
    def reject_reason(self, prompt_len: int, max_tokens: int) -> str | None:
        return add_refusal(self.L, prompt_len, max_tokens)

    def add(self, request_id: str, prompt_len: int, max_tokens: int, prompt: Sequence[int] | None = None) -> None:
        """Queue a request; with its `prompt` tokens it can hit and register (else it is unique)."""
        assert prompt is None or len(prompt) == prompt_len, f"{request_id}: {len(prompt)} tokens for {prompt_len}"
        super().add(request_id, prompt_len, max_tokens)
        if prompt is not None:
            self.prompts[request_id] = tuple(prompt)

    def tables(self) -> dict[str, list[int]]:
        """Each live request's blocks, the prefilling one's included, in position order."""
        out = {r.request_id: r.blocks for r in self.rows}
        if self.prefill is not None:
            out[self.prefill.request_id] = self.prefill.blocks
        return out

    def has_work(self) -> bool:
        return bool(self.waiting or self.rows or self.prefill)

    def live(self, request_id: str) -> bool:
        pf = self.prefill
        live = [w.request_id for w in self.waiting] + [r.request_id for r in self.rows]
        return request_id in live or (pf is not None and pf.request_id == request_id)

    def need(self, prompt_len: int, max_tokens: int) -> int:
        """DESIGN Admission.: every block the request can ever need, up to its last cached token."""
        return ceil_div(prompt_len + max_tokens - 1, self.bs)

    def held_back(self) -> str:
        """Why the head of the queue cannot start prefilling now; "" when it can (or none waits)."""
        if not self.waiting:
            return ""
        pf = self.prefill
        if pf is not None:
            return f"{pf.request_id} is still prefilling ({pf.computed} of {pf.prompt_len} prompt tokens computed)"
        if len(self.rows) >= self.S:
            return f"no slot is free ({len(self.rows)} running, max_num_seqs={self.S})"
        head = self.waiting[0]
        need = self.need(head.prompt_len, head.max_tokens)
        if self.reserved + need > self.U:
            return f"{head.request_id} needs {need} blocks, and {self.reserved} of the {self.U} usable are reserved"
        return ""

    # -- one step ----------------------------------------------------------------------------
    def step(self, stopped: Collection[str] = (), tokens: Mapping[str, int] | None = None) -> RaggedStep:
        rules: list[str] = []
        why = self.held_back()
        admitted, hit = None, None
        if self.waiting and not why:
            admitted, h = self._admit()
            rules.append("admission")
            if h:
                hit = (admitted, h)
                rules.append("hit")
        rows, pf = self.rows, self.prefill
        if not rows and pf is None:
            self.last = IDLE
            return IDLE
        d = len(rows)
        evicted: list[int] = []
        decodes = tuple((r.request_id, r.cached + 1) for r in rows)  # the input lands at position n
        for r in rows:
            evicted += self._grow(r.blocks, r.cached + 1)
            r.cached += 1
            r.generated += 1
        if d:
            rules.append("decode")
        chunk, completes = None, False
        if pf is not None:
            q = min(pf.prompt_len - pf.computed, self.T - d)  # DESIGN Budget.; never 0 (a slot is held)
            chunk = (pf.request_id, pf.computed, q, pf.prompt_len, d)
            evicted += self._grow(pf.blocks, pf.computed + q)
            pf.computed += q
            rules.append("budget")
            if pf.computed == pf.prompt_len:
                completes, self.prefill = True, None
                rows.append(RaggedRow(pf.request_id, pf.prompt_len, 1, pf.max_tokens, pf.reservation, pf.blocks))
                rows[-1].chains, rows[-1].content = pf.chains, pf.content
                rules.append("join")
        got = [rid for rid, _ in decodes] + ([chunk[0]] if completes and chunk else [])
        registered = self._cache(got, tokens) if self.caching else ()
        stops = set(got) & set(stopped) if stopped else set()
        ends = [r for r in rows if r.generated >= r.max_tokens or r.request_id in stops]
        if ends:
            self.reserved -= sum(r.reservation for r in ends)
            self.rows = [r for r in rows if r not in ends]
            for r in ends:  # after the step's registrations: a prompt that ends at once leaves its blocks cached
                self.pool.release(r.blocks)
            if any(r.generated >= r.max_tokens for r in ends):
                rules.append("finish")
            if any(r.generated < r.max_tokens for r in ends):
                rules.append("stop")
        if evicted:
            rules.append("evict")
        kind = "mixed" if d and chunk else "decode" if d else "prefill"
        finished = tuple(r.request_id for r in ends)
        self.last = RaggedStep(
            kind, admitted, decodes, chunk, completes, finished, tuple(rules), why, hit, registered, tuple(evicted)
        )
        self.forget(self.last.finished)
        return self.last

    def _admit(self) -> tuple[str, int]:
        """DESIGN Admission.: the head starts prefilling and reserves its whole need. With caching on
        it looks its prompt up, at most floor((p - 1) / bs) blocks so that one token is computed, and
        starts past the blocks it found. The request and how many it found."""
        head = self.waiting.popleft()
        need = self.need(head.prompt_len, head.max_tokens)
        pf = self.prefill = Prefilling(head.request_id, head.prompt_len, head.max_tokens, 0, need)
        self.reserved += need
        prompt = self.prompts.pop(head.request_id, None)
        if self.caching:
            pf.content = [*prompt] if prompt is not None else [None] * head.prompt_len
            if prompt is not None:
                pf.blocks, pf.chains = self.pool.lookup(prompt, self.bs, (head.prompt_len - 1) // self.bs)
                self.pool.share(pf.blocks)
                pf.computed = len(pf.blocks) * self.bs
        return head.request_id, len(pf.blocks)

    def _grow(self, table: list[int], positions: int) -> list[int]:
        """Give a table the blocks its positions 0 .. positions - 1 land in, from the free list's
        head; the blocks that lost a hash so."""
        need = ceil_div(positions, self.bs) - len(table)
        if need <= 0:
            return []
        blocks, evicted = self.pool.allocate(need)
        table += blocks
        return evicted

    def _cache(self, got: Sequence[str], tokens: Mapping[str, int] | None) -> tuple[tuple[str, int], ...]:
        """The end of a step with caching on: each token lands in its request's content (unknown
        when not told), then each block that became full registers, the decoding rows' in running
        order, then the chunk's. The (request, block) pairs registered."""
        live = {r.request_id: r for r in self.rows}
        for rid in got:
            live[rid].content.append(None if tokens is None else tokens.get(rid))
        stepped: list[tuple[RaggedRow | Prefilling, int]] = [(r, r.cached) for r in self.rows]
        if (pf := self.prefill) is not None:
            stepped.append((pf, pf.computed))
        return tuple(
            (r.request_id, b)
            for r, written in stepped
            for b in self.pool.register_full(r.blocks, r.chains, r.content, written, self.bs)
        )

    # -- abort ---------------------------------------------------------------------------------
    def abort(self, request_id: str) -> RaggedStep:
        """A waiting request leaves the queue; a prefilling or running one returns its blocks (last
        table entry first) and its whole reservation at once, and an aborted prefill frees the slot
        for the next admission."""
        why = self.abort_refusal(request_id)
        if why is not None:
            raise LookupError(f"cannot abort {request_id!r}: {why}")
        pf = self.prefill
        if pf is not None and pf.request_id == request_id:
            self.prefill = None
            self.reserved -= pf.reservation
            self.pool.release(pf.blocks)
        elif any(r.request_id == request_id for r in self.rows):
            row = next(r for r in self.rows if r.request_id == request_id)
            self.rows.remove(row)
            self.reserved -= row.reservation
            self.pool.release(row.blocks)
        else:
            self.waiting = deque(w for w in self.waiting if w.request_id != request_id)
            self.prompts.pop(request_id, None)
        self.last = RaggedStep("abort", None, (), None, False, (request_id,), ("abort",), "")
        self.forget(self.last.finished)
        return self.last

    # -- recovery ------------------------------------------------------------------------------
    def resync(
        self, tkv: int, rows: Sequence[RowState], waiting: Sequence[str], prefill: PrefillState | None = None
    ) -> None:
        """Adopt an engine's state, so one divergence is reported once and later steps still count.
        The tables are the engine's; their content is unknown to the model (unique from here on),
        and the cache keeps what the model had registered."""
        known = self.known

        def max_tokens(rid: str, fallback: int) -> int:
            return known[rid].max_tokens if rid in known else fallback

        self.rows = [
            RaggedRow(
                e.request_id,
                e.num_cached,
                e.generated,
                max_tokens(e.request_id, e.generated),
                len(e.blocks) + e.reserved,
                [*e.blocks],
                *self._unknown(e.num_cached, e.num_cached + 1),
            )
            for e in rows
        ]
        pf = prefill
        self.prefill = (
            None
            if pf is None
            else Prefilling(
                pf.request_id,
                pf.prompt_len,
                max_tokens(pf.request_id, 1),
                pf.computed,
                len(pf.blocks) + pf.reserved,
                [*pf.blocks],
                *self._unknown(pf.computed, pf.prompt_len),
            )
        )
        self.reserved = sum(r.reservation for r in self.rows) + (self.prefill.reservation if self.prefill else 0)
        self.waiting = deque(known[rid] for rid in waiting if rid in known)
        self.pool.adopt(self.tables().values(), self.U)

    def _unknown(self, written: int, length: int) -> tuple[list[int], list[Token]]:
        """Chains and content for a request whose tokens the model never saw: unique, so they
        register without matching anything."""
        if not self.caching:
            return [], []
        return [self.pool.unique() for _ in range(written // self.bs)], [None] * length
