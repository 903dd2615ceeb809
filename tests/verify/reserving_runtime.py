"""The foreign runtime with its reservations in a table of their own, as the real plugin's scheduler
keeps them, offered through the protocol's `reservations` capability: the liveness checker's runtime.

`make` keeps the table right: a request's entry goes when it ends, however it ends. `leaky` plants
the bug the checker is for: an abort of a running request ends it but leaves its reservation in the
table. Admission counts the table against the free pool, so each leak shrinks what later requests
can get, until one that fits the empty pool waits forever: the scheduler then plans nothing (the
stall) where the foreign one would assert.
"""

from __future__ import annotations

from typing import Any

from spyre_verify.runtimes.protocol import Settings
from tests.foreign.block_pool import BlockPool
from tests.foreign.config import Config
from tests.foreign.engine import ForeignEngine
from tests.foreign.faults import Faults
from tests.foreign.scheduler import Scheduler
from tests.foreign.sequence import Sequence


class ReservingScheduler(Scheduler):
    def __init__(self, config: Config, pool: BlockPool, leak_on_abort: bool = False) -> None:
        super().__init__(config, pool)
        self.held: dict[str, int] = {}  # request id -> blocks reserved and not yet allocated
        self.leak_on_abort = leak_on_abort

    def free_after_reservations(self) -> int:
        return self.pool.num_free - sum(self.held.values())

    def schedule(self) -> tuple[str, list[Sequence]] | None:
        if self.waiting and not self.running and not self.can_admit(self.waiting[0]):
            return None  # only leaked reservations can keep a request out of an empty batch
        plan = super().schedule()
        for seq in self.running:  # admission reserves, each block a decode starts draws on it
            self.held[seq.request_id] = seq.reserved
        return plan

    def finish(self, seq: Sequence, reason: str) -> None:
        super().finish(seq, reason)
        if not (self.leak_on_abort and reason == "abort"):  # the planted bug: an abort keeps its entry
            self.held.pop(seq.request_id, None)


class ReservingEngine(ForeignEngine):
    name = "reserving"
    capabilities = ForeignEngine.capabilities | {"reservations"}

    def __init__(self, config: Config, wrap_backend: Any = None, faults: Faults | None = None, leak: bool = False):
        super().__init__(config, wrap_backend, faults)
        self.scheduler = self.reserving = ReservingScheduler(config, self.pool, leak)

    def reservations(self) -> dict[str, int]:
        return dict(self.reserving.held)


def make(settings: Settings) -> ReservingEngine:
    return ReservingEngine(Config.from_settings(settings), settings.wrap_backend)


def leaky(settings: Settings) -> ReservingEngine:
    return ReservingEngine(Config.from_settings(settings), settings.wrap_backend, leak=True)
