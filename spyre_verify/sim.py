"""A tensor-free engine: the runtime's own pool, scheduler and builder, stepped with stand-in tokens.

A step's dispatch depends on token counts only, never on token values (the runtime
has no stop tokens), so `Sim` dispatches exactly the buckets an `Engine` of the same
config would, at a fraction of the cost. It drives the runtime's one step sequence
(`Scheduler.schedule` / `Scheduler.postprocess`) and copies none of it; it offers the
engine's serving face (`add_request`, `step`, `has_work`, `steps`), so
`spyre_verify.serve_loop.serve` drives either.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder
from runtime.scheduler import Request, Scheduler, StepPlan

STAND_IN = 0  # the token every row "generates"; any value in the vocabulary would do
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
        self, config: RuntimeConfig, builder: MetadataBuilder | None = None, make: SchedulerFactory = Scheduler
    ) -> None:
        self.config = config
        self.pool = BlockPool(config.total_blocks)
        self.builder = builder if builder is not None else MetadataBuilder(SpyreAttnBucketer(config))
        self.scheduler = make(config, self.pool, self.builder)
        self.steps = 0
        self.finished: list[Request] = []  # what the last step finished

    def add_request(self, prompt_token_ids: object, max_tokens: object, request_id: object = None) -> str:
        return self.scheduler.add(prompt_token_ids, max_tokens, request_id)

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> StepPlan | None:
        """One step: the plan that ran, or None when there was nothing to do (as `Engine` idles)."""
        plan = self.scheduler.schedule()
        if plan is None:
            self.finished = []
            return None
        self.finished = self.scheduler.postprocess(stand_ins(plan))
        self.steps += 1
        return plan
