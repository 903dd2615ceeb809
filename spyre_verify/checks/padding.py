"""Padding validity: padded entries are the null block, real entries belong to their row,
and KV writes land only in blocks their writer owns.

With prefix caching a row may also list the shared blocks its request holds (the event's
`holders`), but nobody writes them: a registered block is read-only (`shared-block-write`).

Every dispatch of a runtime with `paging` comes with its step's `block_table` and `kv_write`
events (the protocol's promise); a dispatch without them is a `missing-event`, not a step
with nothing to judge. For a `design_contract` runtime the null block is DESIGN's, block 0;
a runtime whose `null_block` says otherwise is a `wrong-null-block` (another runtime's own
`null_block` is taken as it says).

A ragged step dispatches several calls, each owing its own block table; their rules, and the
writes their tables allow, are in `ragged_padding.py`.

The opt-in KV integrity mode lives in `kv_integrity.py` and is subscribed only when asked
for, so its events cost nothing otherwise.
"""

from __future__ import annotations

import itertools
import operator
from operator import itemgetter
from typing import Any

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import PREFILL
from runtime.events import BlockTableEvent, DispatchEvent, KVWriteEvent
from spyre_verify.checks.kv_integrity import KVIntegrity
from spyre_verify.checks.padding_rules import (
    block_table_problems,
    holder_of,
    holders_of,
    seq_len_problems,
    whose,
)
from spyre_verify.checks.ragged_padding import RaggedSteps, is_ragged
from spyre_verify.checks.violations import Checker, InvariantViolation

# DESIGN "Glossary": the null block is block id 0. Written here, not imported from the runtime.
DESIGN_NULL_BLOCK = 0


class PaddingValidity(Checker):
    name = "padding-validity"
    needs = frozenset({"paging"})
    judged_by = ("tables", "kv_writes")

    def __init__(self, strict: bool = False, kv_integrity: bool = False, integrity_every: int = 1) -> None:
        super().__init__(strict)
        self.kv_integrity = kv_integrity
        self.integrity_every = integrity_every
        self.tables_checked = 0
        self.kv_writes = 0
        self.dispatches = 0
        self.missing = 0  # dispatches that came without their block table or KV writes
        # The step's dispatches whose events are still due: [step, kernel, bucket, table seen] each
        # (a ragged step makes several), and the last step whose KV writes came.
        self._due: list[list[Any]] = []
        self._wrote: int | None = None
        self.integrity_not_run: str | None = None

    def attach(self, engine: Any) -> None:
        self.block_size = engine.config.block_size
        # DESIGN's rule places a row's real entries from tkv; another runtime's rows are read by their lengths.
        self.by_lengths = "design_contract" not in getattr(engine, "capabilities", frozenset({"design_contract"}))
        own = getattr(engine, "null_block", NULL_BLOCK)
        # DESIGN fixes the null block; a contract runtime's own attribute is a claim to check, not the answer.
        self.null_block = own if self.by_lengths else DESIGN_NULL_BLOCK
        if own != self.null_block:
            self.flag(
                "wrong-null-block",
                f"the runtime's null_block is {own}, but DESIGN reserves block {DESIGN_NULL_BLOCK} for padding",
            )
        caps: frozenset[str] = getattr(engine, "capabilities", frozenset())
        # The runtime's declared padding sink (protocol `padding_sink`): padding positions may write there only.
        self.sink = getattr(engine, "padding_sink", None) if "padding_sink" in caps else None
        if self.kv_integrity and "kv_cache" not in getattr(engine, "capabilities", frozenset({"kv_cache"})):
            self.integrity_not_run = "KV integrity needs kv_cache"
            self.kv_integrity = False
        self.ragged = RaggedSteps(self.block_size, self.null_block)
        allowed = self.ragged.allowed if getattr(engine.config, "ragged", False) and not self.by_lengths else None
        self.integrity = KVIntegrity(self, engine, self.integrity_every, allowed) if self.kv_integrity else None
        super().attach(engine)
        if allowed is not None:  # the runtime's state, for the ragged rules; a padded run never builds it
            engine.subscribe(self.ragged)
        if self.integrity is not None:
            engine.subscribe(self.integrity)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        return {**out, "kv_integrity_not_run": self.integrity_not_run} if self.integrity_not_run else out

    def observed(self) -> dict[str, Any]:
        out = {
            "dispatches": self.dispatches,
            "tables": self.tables_checked,
            "kv_writes": self.kv_writes,
            "missing_events": self.missing,
        }
        return {**out, "integrity_checks": self.integrity_checks} if self.kv_integrity else out

    # -- the events each dispatch promises --------------------------------------------------
    def on_dispatch(self, ev: DispatchEvent) -> None:
        # A runtime emits a dispatch's block table and KV writes before its kernels run; the step's
        # own `step` event closes the account. Dispatches still open from an earlier step belong to
        # a step that never finished (a strict checker, the serving guard or the runtime raised
        # mid-step), whose later events were cut off by that raise, not left out by the runtime:
        # they are not judged. So is a padded step's open dispatch (it makes one a step), and a
        # ragged step whose KV writes already came: the step raised and is being run again.
        self.dispatches += 1
        ragged = not self.by_lengths and is_ragged(ev.bucket)
        again = self._wrote == ev.step
        if self._due and (self._due[0][0] != ev.step or again or not ragged):
            self._due = []
        if again:
            self._wrote = None
        self._due.append([ev.step, ev.kernel, ev.bucket, False])
        if ragged:
            self.ragged.dispatch(ev.step, again)

    def on_step(self, ev: Any) -> None:
        if self._due and self._due[0][0] == ev.step:
            self._settle()

    def _settle(self) -> None:
        due, self._due = self._due, []
        for step, kernel, bucket, table in due:
            lacking = [name for name, seen in (("block_table", table), ("kv_write", self._wrote == step)) if not seen]
            if not lacking:
                continue
            self.missing += 1
            self.flag(
                "missing-event",
                f"step {step} dispatched {bucket} ({kernel}) without its {' and '.join(lacking)} event"
                f"{'s' * (len(lacking) > 1)}: the protocol promises both for every dispatch of a paging runtime",
                kernel=kernel,
                bucket=str(bucket),
            )

    def finish(self, engine: Any) -> None:
        self._due = []  # their step never finished (see on_dispatch)
        integrity = getattr(self, "integrity", None)
        if integrity is not None:  # the blocks no write or free re-read since their last look
            integrity.final_check(engine.steps - 1)

    @property
    def integrity_checks(self) -> int:
        integrity = getattr(self, "integrity", None)  # unset when the checker never attached (not run)
        return integrity.checks if integrity is not None else 0

    # -- block tables ------------------------------------------------------------------
    def on_block_table(self, ev: BlockTableEvent) -> None:
        self.tables_checked += 1
        open_ = [d for d in self._due if not d[3] and d[0] == ev.step and d[1] == ev.kernel]
        # The first of the step's dispatches that this table answers: by its bucket, else (a label
        # that differs between the two events) the first of its kernel, named as the label problem it is.
        due = next((d for d in open_ if d[2] == ev.bucket), open_[0] if open_ else None)
        if due is not None:
            due[3] = True
            if due[2] != ev.bucket:
                self.flag(
                    "label-mismatch",
                    f"step {ev.step} dispatched {due[2]} ({ev.kernel}), but its block_table event says {ev.bucket}: "
                    "the two events label one call differently",
                    kernel=ev.kernel,
                    bucket=str(due[2]),
                )
        if not self.by_lengths and is_ragged(ev.bucket):
            self._report(ev, self.ragged.table(ev))
            return
        if not self.by_lengths and self._design_rows_hold(ev):
            return
        problems = block_table_problems(
            ev.block_table,
            ev.request_ids,
            ev.left_pads,
            ev.tkv,
            ev.kernel,
            self.block_size,
            ev.owners,
            ev.num_blocks,
            self.null_block,
            ev.seq_lens if self.by_lengths else None,
            holders_of(ev),
        )
        if not self.by_lengths:  # DESIGN fixes each row's length: the event must say the same
            problems += seq_len_problems(ev.request_ids, ev.left_pads, ev.seq_lens, ev.tkv, ev.kernel)
        self._report(ev, problems)

    def _report(self, ev: BlockTableEvent, problems: list[tuple[str, str]]) -> None:
        for kind, message in problems:
            self.flag(kind, f"step {ev.step}: {message}", kernel=ev.kernel, bucket=str(ev.bucket))
            if kind == "out-of-pool":
                # Never let the kernel make an out-of-bounds access (on CUDA it corrupts memory
                # or kills the context): stop here even when not strict. The step then gets no
                # step event, so its missing KV writes are not held against the runtime.
                raise InvariantViolation(self.violations[-1:])

    def _design_rows_hold(self, ev: BlockTableEvent) -> bool:
        """Every rule of `block_table_problems` and `seq_len_problems` holds, in one pass at C speed
        per row: what each step pays for. False sends the table to them, to name what broke."""
        rids, pads, lens, table, owners = ev.request_ids, ev.left_pads, ev.seq_lens, ev.block_table, ev.owners
        n, null, bs, tkv, hi = len(rids), self.null_block, self.block_size, ev.tkv, ev.num_blocks
        if n > len(table) or len(pads) != n or len(lens) != n or null in owners or not 0 <= null < hi:
            return False
        if holders_of(ev):  # the padded layout shares no block: one that does goes rule by rule
            return False
        if ev.kernel == PREFILL:
            last, length = (tkv - 1) // bs, tkv  # a row's length is this minus its left padding
        else:
            last, length = tkv // bs, tkv + 1
        for rid, lp, sl, row in zip(rids, pads, lens, table, strict=False):  # padded rows follow
            first = lp // bs
            real = row[first : last + 1]  # empty when the row has no real entry
            # Every entry outside `real` is the null block: `real` holds no null, as the null block
            # has no owner and every real entry must have one (the owner lookup below).
            if sl != length - lp or row.count(null) != len(row) - len(real):
                return False
            if real:
                if min(real) < 0 or max(real) >= hi:
                    return False
                try:  # one C call looks every owner up; it returns a bare value for a single key
                    got = itemgetter(*real)(owners)
                except KeyError:
                    return False
                if (got.count(rid) != len(real)) if len(real) > 1 else got != rid:
                    return False
        padded = table[n:]  # wholly null, each as wide as the first (a ragged one takes the slow path)
        return not padded or padded.count((null,) * len(padded[0])) == len(padded)

    # -- KV writes ---------------------------------------------------------------------------
    def on_kv_write(self, ev: KVWriteEvent) -> None:
        self.kv_writes += 1
        self._wrote = ev.step
        for kind, message, bucket in self.ragged.write_problems(ev):
            self.flag(kind, message, bucket=None if bucket is None else str(bucket))
        owners, null, writers, slots, bs = ev.owners, self.null_block, ev.writers, ev.slots, self.block_size
        holders = holders_of(ev)
        blocks = list(map(operator.floordiv, slots, itertools.repeat(bs)))
        if blocks and null not in blocks and len(blocks) == len(writers):
            try:  # the common case, at C speed: one call looks every owner up (a bare value for one slot)
                got = itemgetter(*blocks)(owners)
            except KeyError:  # a free or a shared block: no writer, not even a padding one (None), may match it
                got = KeyError
            mine = got == (writers[0] if len(blocks) == 1 else tuple(writers))
            if mine and (not holders or holders.keys().isdisjoint(blocks)):
                return
        odd = {
            (b, w)
            for b, w in zip(blocks, writers, strict=True)
            if w is None or b == null or owners.get(b) != w or b in holders
        }
        for b, writer in sorted(odd, key=lambda bw: (bw[0], bw[1] or "")):
            if writer is None and b == self.sink:
                continue  # a padding position, where the runtime sinks padding on purpose
            where = [s for s, w in zip(slots, writers, strict=True) if w == writer and s // bs == b]
            bucket = self.ragged.bucket_of(ev.step, writer) if writer is not None else None
            at = f"step {ev.step}" if bucket is None else f"step {ev.step} ({bucket})"
            named = {} if bucket is None else {"bucket": str(bucket)}
            if writer is None:
                held = whose(b, owners, holders) if holder_of(b, owners, holders) else "a free block"
                rule = (
                    f"padding may land only in the runtime's padding sink, block {self.sink}"
                    if self.sink is not None
                    else "padded positions are never written"
                )
                self.flag("padding-write", f"{at}: padding positions write slots {where} in block {b} ({held}): {rule}")
            elif b == null:
                self.flag("null-write", f"{at}: {writer} writes slots {where} in the null block", **named)
            elif b in holders:
                self.flag(
                    "shared-block-write",
                    f"{at}: {writer} writes slots {where} in block {b}, registered and held by "
                    f"{', '.join(holders[b])}: a request writes only its own unshared, unregistered blocks, "
                    "so a shared prefix's KV would change under every request reading it",
                    **named,
                )
            else:
                self.flag(
                    "foreign-write",
                    f"{at}: {writer} writes slots {where} in block {b}, owned by {owners.get(b)}",
                    **named,
                )
