"""A tensor-free engine: the runtime's own pool, scheduler and builder, stepped with stand-in tokens.

A step's dispatch depends on token values only through stop tokens: with no stop token
generated, `Sim` dispatches exactly the buckets an `Engine` of the same config would, at a
fraction of the cost. Its stand-in token is never the EOS; a request whose stop_token_ids
hold it stops, as the runtime's rules say, and `tokens` can pick other stand-ins to make
requests stop where a caller wants. It drives the runtime's one step sequence
(`Scheduler.schedule` / `Scheduler.postprocess`, `Scheduler.abort`) and copies none of it;
it offers the engine's serving face (`add_request`, `abort`, `step`, `has_work`, `steps`),
so `spyre_verify.serve_loop.serve` drives either.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder
from runtime.scheduler import Request, Scheduler, StepPlan

STAND_IN = 0  # the token every row "generates": in every vocabulary, and not the tiny model's EOS
# Builds the scheduler under test: `Scheduler` itself, a subclass, or any callable alike.
SchedulerFactory = Callable[[RuntimeConfig, BlockPool, MetadataBuilder], Scheduler]


def stand_ins(plan: StepPlan) -> list[int]:
    """One stand-in token per row the plan computes."""
    return [STAND_IN] * len(plan.rows)


class Sim:
    """Pool, scheduler and builder wired like `runtime.engine.Engine`, with no model.

    `builder` defaults to one on the config's own bucketer; `make` builds the scheduler
    (a subclass under test, say).
    """

    def __init__(
        self,
        config: RuntimeConfig,
        builder: MetadataBuilder | None = None,
        make: SchedulerFactory = Scheduler,
        tokens: Callable[[StepPlan], list[int]] = stand_ins,
    ) -> None:
        self.config = config
        self.pool = BlockPool(config.total_blocks)
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
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> StepPlan | None:
        """One step: the plan that ran, or None when there was nothing to do (as `Engine` idles)."""
        plan = self.scheduler.schedule()
        if plan is None:
            self.finished = []
            return None
        self.finished = self.scheduler.postprocess(self.tokens(plan))
        self.steps += 1
        return plan
