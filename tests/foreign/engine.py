"""The foreign engine: nano-vllm's schedule / run / postprocess, behind spyre-verify's protocol.

`make(settings)` is the factory the harness names: `--runtime tests.foreign.engine:make`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spyre_verify.runtimes.protocol import BackendWrapper, Settings

from . import events as ev
from .announce import announce
from .attention import PagedAttention
from .block_pool import NULL_BLOCK, BlockPool
from .buckets import PREFILL, Bucket, Bucketer
from .config import Config
from .controls import Control, control_calls
from .faults import FAULTS, Faults
from .layout import StepLayout, lay_out
from .model import TinyModel
from .model_runner import run_step
from .reference import ReferenceRun, generate
from .scheduler import Scheduler
from .sequence import Sequence as Seq

# Control calls compile on top of the warm set; leave Dynamo room for them and a few more.
RECOMPILE_HEADROOM = 8


@dataclass(frozen=True)
class Finished:
    request_id: str
    tokens: tuple[int, ...]
    reason: str  # "length", "stop" or "abort"


@dataclass(frozen=True)
class StepResult:
    kind: str  # "prefill", "decode" or "idle"
    bucket: Bucket | None
    finished: tuple[str, ...]


class ForeignEngine:
    name = "foreign"
    capabilities = frozenset({"paging", "reference", "control_calls", "compile_accounting", "kv_cache"})
    null_block = NULL_BLOCK

    def __init__(self, config: Config, wrap_backend: BackendWrapper | None = None, faults: Faults | None = None):
        self.config = config
        self.bus = ev.Bus()
        faults = faults or Faults()
        self.bucketer = Bucketer(config, faults.skip_top_decode)
        self.pool = BlockPool(config.total_blocks)
        self.num_blocks = config.total_blocks
        self.scheduler = Scheduler(config, self.pool)
        self.model = TinyModel(config.model, config.max_model_len, config.device)
        self.attention = PagedAttention(config, self.bucketer, self.bus, wrap_backend, faults)
        self.steps = 0
        self.finished: dict[str, Finished] = {}
        self.warmed = False
        self._pending: tuple[StepLayout, list[Seq]] | None = None  # a step whose kernels raised
        # Process-wide: raised while this engine lives (every bucket needs its own graph), put back on close().
        self._saved_limit: int | None = torch._dynamo.config.recompile_limit
        limit = self.bucketer.all_buckets() + RECOMPILE_HEADROOM
        torch._dynamo.config.recompile_limit = max(self._saved_limit, limit)

    def close(self) -> None:
        if self._saved_limit is not None:
            torch._dynamo.config.recompile_limit = self._saved_limit
            self._saved_limit = None

    def __enter__(self) -> ForeignEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subscribe(self, observer: Any) -> Callable[[], None]:
        return self.bus.subscribe(observer)

    def warm_plan(self) -> list[Bucket]:
        return self.bucketer.warm_plan()

    def ladders(self) -> dict[str, tuple[int, ...]]:
        return self.bucketer.ladders()

    def faults(self) -> Mapping[str, str]:
        return dict(FAULTS)

    def warmup(self, progress: Callable[[int, int, Any], None] | None = None) -> None:
        """Compile every bucket of the plan once, on the staging buffers serving uses."""
        if self.warmed:
            raise RuntimeError("warmup runs once per engine")
        plan = self.warm_plan()
        for runner in self.attention.runners.values():
            runner.phase = ev.WARMUP
        try:
            for i, bucket in enumerate(plan, start=1):
                self.attention.preflight_call(bucket)
                if progress is not None:
                    progress(i, len(plan), bucket)
        finally:
            for runner in self.attention.runners.values():
                runner.phase = ev.SERVING
        self.warmed = True

    def add_request(
        self,
        prompt_token_ids: object,
        max_tokens: object,
        request_id: object = None,
        *,
        stop_token_ids: object = (),
        ignore_eos: object = False,
    ) -> str:
        s = self.scheduler.add(prompt_token_ids, max_tokens, request_id, stop_token_ids, ignore_eos)
        self.bus.emit("request", ev.Request(s.request_id, s.prompt, s.max_tokens, s.stop_token_ids, s.ignore_eos))
        return s.request_id

    def has_work(self) -> bool:
        return not self.scheduler.is_finished()

    def step(self) -> StepResult:
        """Schedule, run, postprocess. A step whose kernels raised (a serving guard refusing a
        compile, say) is kept and run again by the next call, never scheduled twice."""
        if self._pending is None:
            plan = self.scheduler.schedule()
            if plan is None:
                return StepResult("idle", None, ())
            self._pending = lay_out(plan[0], plan[1], self.bucketer), plan[1]
        lay, seqs = self._pending
        if lay.kind != PREFILL:
            self.attention.stage_decode(lay)
        announce(self.bus, lay, self.pool, self.attention, self.steps)
        tokens = self._run(lay)
        ended = self.scheduler.postprocess(lay.kind, seqs, tokens)
        self._pending = None
        done = tuple(s.request_id for s in ended)
        self.bus.emit("step", ev.Step(self.steps, lay.kind, lay.bucket, done))
        self._record(ended)
        self.steps += 1
        return StepResult(lay.kind, lay.bucket, done)

    def abort(self, request_id: object) -> Finished:
        """End a waiting or running request between steps; its blocks return at once."""
        seq = self.scheduler.abort(request_id)
        if self._pending is not None and any(s is seq for s in self._pending[1]):
            # Its unfinished step is planned afresh: a decode's block allocation is idempotent.
            self._pending = None
        return self._record([seq])[0]

    def _record(self, ended: list[Seq]) -> list[Finished]:
        out = []
        for s in ended:
            assert s.reason is not None
            out.append(Finished(s.request_id, tuple(s.output), s.reason))
            self.finished[s.request_id] = out[-1]
            self.bus.emit("finish", ev.Finish(s.request_id, s.reason, tuple(s.output), self.steps))
        return out

    def _run(self, lay: StepLayout) -> list[int]:
        logits = run_step(self.model, self.attention, lay, self.config.device)
        tokens: list[int] = logits.argmax(dim=-1).tolist()  # greedy
        if self.bus.wants("token"):
            for rid, token, row in zip(lay.request_ids, tokens, logits, strict=True):
                self.bus.emit("token", ev.Token(rid, token, self.steps, row.clone()))
        return tokens

    def pool_snapshot(self) -> object:
        return self.scheduler.snapshot()

    def reference(
        self, prompt: Sequence[int], max_tokens: int, stop_token_ids: Sequence[int] = (), ignore_eos: bool = False
    ) -> ReferenceRun:
        return generate(self.model, prompt, max_tokens, stop_token_ids, ignore_eos)

    def kv_blocks(self, blocks: Sequence[int]) -> list[torch.Tensor]:
        idx = torch.tensor(list(blocks), dtype=torch.long, device=self.config.device)
        return [c.index_select(0, idx) for c in (*self.attention.k_cache, *self.attention.v_cache)]

    def block_owners(self) -> Mapping[int, str]:
        return dict(self.pool.owner)

    def preflight_call(self, bucket: Bucket) -> None:
        self.attention.preflight_call(bucket)

    def controls(self) -> list[Control]:
        return control_calls(self.attention, self.bucketer, self.warm_plan())

    def kernel_accounts(self) -> Mapping[str, Any]:
        return self.attention.runners


def make(settings: Settings) -> ForeignEngine:
    """The factory: sizes, backend and device from `settings`; `options` may set num_blocks and
    seed; `fault` seeds one of `FAULTS`; `wrap_backend` wraps every kernel's Dynamo backend."""
    faults = Faults.named(settings.fault)
    return ForeignEngine(Config.from_settings(settings), settings.wrap_backend, faults)
