"""FIFO continuous batching: one prefill a step when the queue's head fits, else decode them all.

Admission reserves every block a request can need up to max_tokens, so a running request
never runs out mid-decode and nothing is ever preempted; blocks are allocated lazily from
that reservation, one when a new token starts a block.
"""

from __future__ import annotations

from collections import deque

from .block_pool import BlockPool
from .config import Config
from .sequence import Sequence, Status, parse_request


class Scheduler:
    def __init__(self, config: Config, pool: BlockPool) -> None:
        self.config = config
        self.block_size = config.block_size
        self.pool = pool
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.ids: set[str] = set()  # every id ever accepted: ids are never reused
        self.next_id = 0

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(
        self, prompt: object, max_tokens: object, request_id: object, stops: object, ignore_eos: object
    ) -> Sequence:
        """Validate everything first: a refused request changes nothing, the id counter included."""
        if request_id is None:
            rid, next_id = f"f-{self.next_id}", self.next_id + 1
        elif isinstance(request_id, str) and request_id:
            rid, next_id = request_id, self.next_id
        else:
            raise ValueError(f"request_id={request_id!r}: must be a non-empty string or None")
        if rid in self.ids:
            raise ValueError(f"request_id={rid!r}: already used")
        seq = parse_request(self.config, prompt, max_tokens, rid, stops, ignore_eos)
        self.ids.add(rid)
        self.next_id = next_id
        self.waiting.append(seq)
        return seq

    def free_after_reservations(self) -> int:
        return self.pool.num_free - sum(s.reserved for s in self.running)

    def can_admit(self, seq: Sequence) -> bool:
        return len(self.running) < self.config.max_num_seqs and (
            seq.lifetime_blocks(self.block_size) <= self.free_after_reservations()
        )

    def schedule(self) -> tuple[str, list[Sequence]] | None:
        """("prefill", [seq]) or ("decode", running); None when there is nothing to do."""
        if self.waiting and self.can_admit(self.waiting[0]):
            seq = self.waiting.popleft()
            need = -(-len(seq.prompt) // self.block_size)
            seq.blocks = self.pool.allocate(seq.request_id, need)
            seq.reserved = seq.lifetime_blocks(self.block_size) - need
            seq.status = Status.RUNNING
            self.running.append(seq)
            return "prefill", [seq]
        if not self.running:
            assert not self.waiting, "an empty batch admits any valid request"
            return None
        for seq in self.running:
            if seq.num_cached == len(seq.blocks) * self.block_size:  # the new token starts a block
                assert seq.reserved > 0, f"{seq.request_id} outgrew its reservation"
                seq.blocks += self.pool.allocate(seq.request_id, 1)
                seq.reserved -= 1
        return "decode", list(self.running)

    def postprocess(self, kind: str, seqs: list[Sequence], tokens: list[int]) -> list[Sequence]:
        """Cache what the step wrote, append each token, end what stops; returns the ended."""
        ended = []
        for seq, token in zip(seqs, tokens, strict=True):
            seq.num_cached += len(seq.prompt) if kind == "prefill" else 1
            seq.output.append(token)
            reason = seq.stop_reason(token, self.config.model.eos_token_id)
            if reason is not None:
                self.finish(seq, reason)
                ended.append(seq)
        return ended

    def abort(self, request_id: object) -> Sequence:
        seq = next((s for s in (*self.waiting, *self.running) if s.request_id == request_id), None)
        if seq is None:
            why = "it has ended" if isinstance(request_id, str) and request_id in self.ids else "no such request"
            raise ValueError(f"cannot abort request_id={request_id!r}: {why}")
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
            seq.status, seq.reason = Status.FINISHED, "abort"
        else:
            self.finish(seq, "abort")
        return seq

    def finish(self, seq: Sequence, reason: str) -> None:
        """A running request ends: its blocks and the rest of its reservation return at once."""
        self.running.remove(seq)
        self.pool.deallocate(seq.request_id, seq.blocks)
        seq.blocks, seq.reserved = [], 0
        seq.status, seq.reason = Status.FINISHED, reason

    def snapshot(self) -> tuple[object, ...]:
        """Everything a refused request must leave as it was."""
        rows = tuple((s.request_id, tuple(s.blocks), s.num_cached, tuple(s.output), s.reserved) for s in self.running)
        waiting = tuple(s.request_id for s in self.waiting)
        return rows, waiting, self.pool.snapshot(), self.next_id, frozenset(self.ids)
