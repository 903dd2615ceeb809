"""The engine: schedule, run the kernels, postprocess, behind spyre-verify's runtime protocol.

`make(settings)` is the factory: `--runtime tests.own_ragged.engine:make`. The runtime declares
its contract as plain data (`contract`) and makes `layers` compiled calls per dispatch; its
buckets are plain tuples, its events its own dataclasses with the protocol's field names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spyre_verify.runtimes.protocol import Settings

from . import events as ev
from .attention import Control, PagedAttention
from .buckets import ATTEND, CHUNKED, NULL_BLOCK, Bucket, Builder, Ladders, Reach
from .config import Config
from .faults import FAULTS, Faults
from .model import ReferenceRun, TinyModel, generate
from .pool import BlockPool
from .scheduler import Plan, Request, RequestRefused, Scheduler

HEADROOM = 8  # graphs past the warm plan Dynamo may still compile: the control calls, and spare


@dataclass(frozen=True)
class Finished:
    request_id: str
    tokens: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class StepResult:
    kind: str  # "decode", "prefill", "mixed" or "idle"
    buckets: tuple[Bucket, ...]
    finished: tuple[str, ...]


class OwnRaggedEngine:
    name = "own-ragged"
    capabilities = frozenset({"paging", "reference", "control_calls", "compile_accounting", "reservations", "kv_cache"})
    refusal = RequestRefused
    null_block = NULL_BLOCK

    def __init__(self, config: Config, wrap_backend: Any = None, faults: Faults | None = None) -> None:
        self.config = config
        self.planted = faults = faults or Faults()
        self.contract = config.contract()
        self.layers = config.model.num_layers
        self.bus = ev.Bus()
        self.ladder = Ladders(config, faults)
        self.pool = BlockPool(config.num_blocks)
        self.num_blocks = config.num_blocks
        # Not named `builder`: that name is the bundled builder's interface, which the harness probes.
        self.planner = Builder(self.ladder, faults)
        self.scheduler = Scheduler(config, self.pool, self.planner, faults.abort_leak)
        self.model = TinyModel(config.model, config.max_model_len, config.device)
        self.judge = TinyModel(config.model, config.max_model_len, config.device)  # the reference's own weights
        self.attention = PagedAttention(config, self.ladder, self.bus, wrap_backend)
        self._plan = Reach(config, self.ladder).plan()
        self.steps = 0
        self.finished: dict[str, Finished] = {}
        self.warmed = False
        # Dynamo's limits are process-wide: raised while this engine lives, put back by close().
        dynamo = torch._dynamo.config
        self._saved: dict[str, int] | None = {
            "recompile_limit": dynamo.recompile_limit,
            "accumulated_recompile_limit": dynamo.accumulated_recompile_limit,
        }
        limit = max(dynamo.recompile_limit, len(self._plan) + HEADROOM)
        dynamo.recompile_limit = limit
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * limit)

    def close(self) -> None:
        if self._saved is not None:
            for k, v in self._saved.items():
                setattr(torch._dynamo.config, k, v)
            self._saved = None

    def __enter__(self) -> OwnRaggedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the protocol's core ---------------------------------------------------------------------
    def subscribe(self, observer: Any) -> Callable[[], None]:
        return self.bus.subscribe(observer)

    def warm_plan(self) -> list[Bucket]:
        return list(self._plan)

    def ladders(self) -> dict[str, tuple[int, ...]]:
        return self.ladder.as_dict()

    def warmup(self, progress: Callable[[int, int, Any], None] | None = None) -> None:
        """Compile every bucket of the plan once, on the staging buffers serving uses."""
        if self.warmed:
            raise RuntimeError("warmup runs once per engine")
        plan = self.warm_plan()
        if self.planted.skip_warmup_key:  # the bug: the plan's smallest per-sequence key is left out
            plan.remove(min(b for b in plan if b[0] == ATTEND))
        for i, bucket in enumerate(plan, start=1):
            self.attention.preflight_call(bucket)
            if progress is not None:
                progress(i, len(plan), bucket)
        for runner in self.attention.runners.values():
            runner.serve()
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
        r = self.scheduler.add(prompt_token_ids, max_tokens, request_id, stop_token_ids, ignore_eos)
        if self.bus.wants("request"):
            self.bus.emit(
                "request", ev.RequestEvent(r.request_id, r.prompt, r.max_tokens, r.stop_token_ids, r.ignore_eos)
            )
        return r.request_id

    def abort(self, request_id: object) -> Finished:
        """End a waiting, prefilling or running request between steps; its blocks return at once."""
        r = self.scheduler.abort(request_id)
        return self._ended("abort", None, [r])[0]

    def has_work(self) -> bool:
        s = self.scheduler
        return bool(s.waiting or s.running or s.prefilling)

    def step(self) -> StepResult:
        plan = self.scheduler.schedule()
        if plan is None:
            return StepResult("idle", (), ())
        self._announce(plan)
        tokens = self._run(plan)
        done = self.scheduler.postprocess(tokens)
        finished = tuple(r.request_id for r in done)
        buckets = tuple(c.bucket for c in plan.calls)
        if self.bus.wants("step"):
            self.bus.emit("step", ev.StepEvent(self.steps, plan.kind, buckets[0], finished, buckets))
        self._ended(plan.kind, plan.admitted, done)
        self.steps += 1
        return StepResult(plan.kind, buckets, finished)

    def pool_snapshot(self) -> object:
        return self.scheduler.snapshot()

    # -- a step ------------------------------------------------------------------------------------
    def _announce(self, plan: Plan) -> None:
        """Each call's dispatch and block table, then the step's KV writes: before the kernels run."""
        bus, step, owners = self.bus, self.steps, self.pool.owners
        for call in plan.calls:
            ids, lens, qlens, pads = call.request_ids, call.seq_lens, call.query_lens, (0,) * len(call.request_ids)
            if bus.wants("dispatch"):
                batch = ev.BatchInfo(ids, lens, pads, 0, qlens)
                bus.emit("dispatch", ev.DispatchEvent(call.kernel, call.label, batch, ev.SERVING, step))
            if bus.wants("block_table"):
                table = ev.BlockTableEvent(
                    call.kernel, call.bucket, step, ids, pads, lens, 0, call.table, owners, self.num_blocks,
                    NULL_BLOCK, qlens,
                )  # fmt: skip
                bus.emit("block_table", table)
        if bus.wants("kv_write"):
            slots = tuple(s for c in plan.calls for s in c.slots)
            writers = tuple(
                rid for c in plan.calls for rid, q in zip(c.request_ids, c.query_lens, strict=True) for _ in range(q)
            )
            bus.emit("kv_write", ev.KVWriteEvent(step, slots, writers, owners))

    @torch.no_grad()
    def _run(self, plan: Plan) -> list[int]:
        """Every call of the step over one forward pass; the decoding rows' tokens, then a completed prompt's."""
        dev, att = self.config.device, self.attention
        slots = torch.tensor([s for c in plan.calls for s in c.slots], dtype=torch.long, device=dev)
        x = self.model.embed(torch.tensor(plan.inputs, device=dev), torch.tensor(plan.positions, device=dev))
        last = len(self.model.layers) - 1
        for layer in range(len(self.model.layers)):
            q, k, v = self.model.qkv(layer, x)
            att.write_kv(layer, slots, k, v)
            outs, at = [], 0
            for call in plan.calls:
                n = sum(call.query_lens)
                decode = call.kernel == CHUNKED or (plan.chunk is None or call.request_ids[0] != plan.chunk.request_id)
                eager = self.planted.eager_layer and layer == last and decode
                outs.append(att.run(layer, call, q[at : at + n], eager))
                at += n
            x = self.model.finish_layer(layer, x, torch.cat(outs))
        rows = list(range(len(plan.decodes))) + ([x.shape[0] - 1] if plan.completes else [])
        logits = self.model.logits(x[rows])
        tokens: list[int] = logits.argmax(dim=-1).tolist()
        if self.bus.wants("token"):
            for rid, t, row in zip(plan.token_rows, tokens, logits, strict=True):
                self.bus.emit("token", ev.TokenEvent(rid, t, self.steps, row.clone()))
        return tokens

    def _ended(self, kind: str, admitted: str | None, done: list[Request]) -> list[Finished]:
        """After a step or an abort: the state event, then each ended request's record and finish event."""
        s, bus = self.scheduler, self.bus
        if bus.wants("state"):
            finished = tuple(r.request_id for r in done)
            rows, pf, free = s.row_states(), s.prefill_state(), self.pool.num_free
            bus.emit("state", ev.StateEvent(self.steps, kind, admitted, 0, rows, s.waiting_ids, finished, free, pf))
        out = []
        for r in done:
            assert r.reason is not None
            out.append(Finished(r.request_id, tuple(r.output), r.reason))
            self.finished[r.request_id] = out[-1]
            if bus.wants("finish"):
                bus.emit("finish", ev.FinishEvent(r.request_id, r.reason, tuple(r.output), self.steps))
        return out

    # -- capabilities ------------------------------------------------------------------------------
    def reference(
        self, prompt: Sequence[int], max_tokens: int, stop_token_ids: Sequence[int] = (), ignore_eos: bool = False
    ) -> ReferenceRun:
        return generate(self.judge, prompt, max_tokens, stop_token_ids, ignore_eos)

    def kv_blocks(self, blocks: Sequence[int]) -> list[torch.Tensor]:
        idx = torch.tensor(list(blocks), dtype=torch.long, device=self.config.device)
        return [c.index_select(0, idx) for c in (*self.attention.k, *self.attention.v)]

    def block_owners(self) -> Mapping[int, str]:
        return dict(self.pool.owners)

    def reservations(self) -> dict[str, int]:
        return self.pool.reservations()

    def preflight_call(self, bucket: Bucket) -> None:
        self.attention.preflight_call(tuple(bucket))

    def controls(self) -> list[Control]:
        return self.attention.controls()

    def kernel_accounts(self) -> Mapping[str, Any]:
        return self.attention.runners

    def faults(self) -> Mapping[str, str]:
        return dict(FAULTS)


def make(settings: Settings) -> OwnRaggedEngine:
    """The factory: sizes, backend and device from `settings`; `options` may set max_num_batched_tokens
    and num_blocks; `fault` (else the env variable OWN_RAGGED_BUG) plants one of `FAULTS`."""
    return OwnRaggedEngine(Config.from_settings(settings), settings.wrap_backend, Faults.named(settings.fault))


make.default_sizes = {"block_size": 2, "max_model_len": 8, "max_num_seqs": 4}  # type: ignore[attr-defined]
