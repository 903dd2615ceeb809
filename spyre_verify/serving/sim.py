"""A tensor-free engine: the runtime's own pool, scheduler and builder, stepped with stand-in tokens.

A step's dispatch depends on token values only through stop tokens: with no stop token
generated, `Sim` dispatches exactly the buckets an `Engine` of the same config would, at a
fraction of the cost. Its stand-in token is never the EOS; a request whose stop_token_ids
hold it stops, as the runtime's rules say, and `tokens` can pick other stand-ins to make
requests stop where a caller wants. It drives the runtime's one step sequence
(`Scheduler.schedule` / `Scheduler.postprocess`, `Scheduler.abort`) and copies none of it;
it offers the engine's serving face (`add_request`, `abort`, `step`, `has_work`, `steps`),
so `spyre_verify.serving.serve_loop.serve` drives either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder
from runtime.ragged_metadata import RaggedBuilder
from runtime.ragged_scheduler import RaggedPlan, RaggedScheduler
from runtime.scheduler import Request, Scheduler, StepPlan

STAND_IN = 0  # the token every row "generates": in every vocabulary, and not the tiny model's EOS
# Builds the scheduler under test from (config, pool, builder): `Scheduler` itself, a subclass,
# or any callable alike; on a ragged config, a `RaggedScheduler` subclass (the builder is ragged).
SchedulerFactory = Callable[[RuntimeConfig, BlockPool, Any], Scheduler | RaggedScheduler]


def stand_ins(plan: StepPlan | RaggedPlan) -> list[int]:
    """One stand-in token per row the plan gives a token to."""
    return [STAND_IN] * len(plan.token_rows if isinstance(plan, RaggedPlan) else plan.rows)


class Sim:
    """Pool, scheduler and builder wired like `runtime.engine.Engine`, with no model.

    `builder` defaults to one on the config's own bucketer; `make` builds the scheduler
    (a subclass under test, say). A ragged config gets the ragged builder, and the ragged
    scheduler when `make` is the stock `Scheduler` (else `make`, a `RaggedScheduler` subclass).
    """

    def __init__(
        self,
        config: RuntimeConfig,
        builder: Any = None,
        make: SchedulerFactory = Scheduler,
        tokens: Callable[[Any], list[int]] = stand_ins,
    ) -> None:
        self.config = config
        self.pool = BlockPool(config.total_blocks)
        self.scheduler: Any
        if config.ragged:  # the stock `Scheduler` stands for the layout's own; a subclass under test is built as given
            self.builder: Any = builder if builder is not None else RaggedBuilder(SpyreAttnBucketer(config))
            self.scheduler = (RaggedScheduler if make is Scheduler else make)(config, self.pool, self.builder)
        else:
            self.builder = builder if builder is not None else MetadataBuilder(SpyreAttnBucketer(config))
            self.scheduler = make(config, self.pool, self.builder)
        self.tokens = tokens
        self.steps = 0
        self.finished: list[Request] = []  # what the last step or abort ended

    def add_request(
        self,
        prompt_token_ids: object,
        max_tokens: object,
        request_id: object = None,
        *,
        stop_token_ids: object = (),
        ignore_eos: object = False,
    ) -> str:
        return self.scheduler.add(prompt_token_ids, max_tokens, request_id, stop_token_ids, ignore_eos)

    def abort(self, request_id: object) -> None:
        self.finished = [self.scheduler.abort(request_id)]

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.in_flight())

    def step(self) -> Any:
        """One step: the plan that ran, or None when there was nothing to do (as `Engine` idles)."""
        plan = self.scheduler.schedule()
        if plan is None:
            self.finished = []
            return None
        self.finished = self.scheduler.postprocess(self.tokens(plan))
        self.steps += 1
        return plan
