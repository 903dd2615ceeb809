"""The continuous-batching engine: one step prefills a joining request or decodes the batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import Any, Self

import torch

from runtime import events as ev
from runtime.block_pool import NULL_BLOCK, BlockPool
from runtime.bucketer import Bucket, SpyreAttnBucketer
from runtime.compiler import BackendWrapper, compile_limits, set_dynamo_config
from runtime.config import RuntimeConfig
from runtime.metadata import DecodeMetadata, MetadataBuilder, PrefillMetadata
from runtime.model import TinyTransformer
from runtime.paged_attention import PagedAttention
from runtime.ragged_attention import RaggedAttention
from runtime.ragged_metadata import AttendMetadata, RaggedBuilder
from runtime.ragged_scheduler import RaggedPlan, RaggedScheduler
from runtime.scheduler import Request, Scheduler, StepPlan
from runtime.warmup import Seams, WarmupRecorder


@dataclass(frozen=True)
class TokenEvent:
    request_id: str
    token: int
    logits: torch.Tensor
    step: int


@dataclass(frozen=True)
class StepResult:
    kind: str  # "prefill", "decode" or "idle"
    bucket: Bucket | None
    finished: tuple[str, ...]


class Engine:
    def __init__(
        self,
        config: RuntimeConfig,
        seams: Seams = Seams(),
        model: TinyTransformer | None = None,
        wrap_backend: BackendWrapper | None = None,
    ) -> None:
        self.config = config
        self.seams = seams
        self.events = ev.EventBus()
        self.bucketer = SpyreAttnBucketer(config)
        self.pool = BlockPool(config.total_blocks)
        self.builder: MetadataBuilder | RaggedBuilder
        self.scheduler: Scheduler | RaggedScheduler
        self.attention: PagedAttention | RaggedAttention
        if config.ragged:
            self.builder = RaggedBuilder(self.bucketer)
            self.scheduler = RaggedScheduler(config, self.pool, self.builder)
            self.attention = RaggedAttention(config, self.bucketer, self.events, wrap_backend)
        else:
            self.builder = MetadataBuilder(self.bucketer)
            self.scheduler = Scheduler(config, self.pool, self.builder)
            self.attention = PagedAttention(config, self.bucketer, self.events, wrap_backend)
        self.recorder = WarmupRecorder(self.bucketer, self.attention, seams)
        self.model = model or TinyTransformer(config)
        self.steps = 0
        self.outputs: dict[str, list[int]] = {}
        self.finished: dict[str, ev.Finished] = {}  # every ended request, aborts included
        # Dynamo's limits are process-wide: the engine sets the ones it compiles under here, and
        # only here, and close() puts back what they replaced.
        buckets = len(list(self.bucketer.candidates()))
        self._replaced: dict[str, object] | None = set_dynamo_config(compile_limits(config, buckets))

    def close(self) -> None:
        """Put back the Dynamo settings the engine replaced, once it is done compiling and serving.
        Engines that overlap close in the reverse order of creation, as nested `with` blocks do."""
        if self._replaced is not None:
            set_dynamo_config(self._replaced)
            self._replaced = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subscribe(self, observer: Any) -> Callable[[], None]:
        return self.events.subscribe(observer)

    def warmup(self, progress: Callable[[int, int, Bucket], None] | None = None) -> None:
        self.recorder.record_graphs(progress)

    def add_request(
        self,
        prompt_token_ids: object,
        max_tokens: object,
        request_id: object = None,
        *,
        stop_token_ids: object = (),
        ignore_eos: object = False,
    ) -> str:
        rid = self.scheduler.add(prompt_token_ids, max_tokens, request_id, stop_token_ids, ignore_eos)
        self.outputs[rid] = []
        if self.events.wants("request"):
            r = self.scheduler.waiting[-1]
            self.events.emit("request", ev.RequestEvent(rid, r.prompt, r.max_tokens, r.stop_token_ids, r.ignore_eos))
        return rid

    def abort(self, request_id: object) -> None:
        """End a waiting or running request between steps; RequestError for an unknown or ended id."""
        self._ended("abort", None, [self.scheduler.abort(request_id)])

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.in_flight())

    def run_until_done(self, max_steps: int = 1_000_000) -> dict[str, list[int]]:
        for _ in range(max_steps):
            if not self.has_work():
                return self.outputs
            self.step()
        raise RuntimeError(f"engine still busy after {max_steps} steps")

    def step(self) -> StepResult:
        """Schedule, run the kernels on the plan, postprocess: nano-vllm's three calls."""
        sched = self.scheduler
        plan = sched.schedule()
        if plan is None:
            assert not sched.waiting, "an empty batch always admits the head of the queue"
            return StepResult("idle", None, ())
        if isinstance(plan, RaggedPlan):
            self._emit_cache(plan)
            self._emit_ragged(plan)
            tokens = self._run_ragged(plan)
        else:
            self._emit_batch(plan)
            tokens = self._run_prefill(plan) if plan.kind == "prefill" else self._run_decode(plan)
        done = sched.postprocess(tokens)
        if isinstance(sched, RaggedScheduler) and sched.registered and self.events.wants("cache_register"):
            for r in sched.registered:
                self.events.emit("cache_register", ev.CacheRegisterEvent(self.steps, *astuple(r)))
        finished = tuple(r.request_id for r in done)
        if self.events.wants("step"):
            buckets = plan.buckets if isinstance(plan, RaggedPlan) else (plan.bucket,)
            self.events.emit("step", ev.StepEvent(self.steps, plan.kind, plan.bucket, finished, buckets))
        self._ended(plan.kind, plan.admission.request_id if plan.admission else None, done)
        self.steps += 1
        return StepResult(plan.kind, plan.bucket, finished)

    def _ended(self, kind: str, admitted: str | None, done: list[Request]) -> None:
        """After a step or an abort: record the ended requests, then emit the state and each finish."""
        sched, bus = self.scheduler, self.events
        if bus.wants("state"):
            waiting, rows = sched.waiting_ids, sched.row_states()
            finished = tuple([r.request_id for r in done]) if done else ()
            prefill = sched.prefill_state() if isinstance(sched, RaggedScheduler) else None
            free = self.pool.num_free
            state = ev.StateEvent(self.steps, kind, admitted, sched.tkv, rows, waiting, finished, free, prefill)
            bus.emit("state", state)
        for r in done:
            assert r.finish_reason is not None
            self.finished[r.request_id] = ev.Finished(r.request_id, tuple(r.output), r.finish_reason)
            if bus.wants("finish"):
                bus.emit("finish", ev.FinishEvent(r.request_id, r.finish_reason, tuple(r.output), self.steps))

    @torch.no_grad()
    def _run_ragged(self, plan: RaggedPlan) -> list[int]:
        """Every call of a ragged step over one forward pass: the decoding rows' tokens, then the chunk's."""
        attention, dev = self.attention, self.config.device
        assert isinstance(attention, RaggedAttention)
        slots = torch.tensor([s for call in plan.calls for s in call.slots], dtype=torch.long, device=dev)
        x = self.model.embed(torch.tensor(plan.inputs, device=dev), torch.tensor(plan.positions, device=dev))
        for layer in range(len(self.model.layers)):
            q, k, v = self.model.qkv(layer, x)
            attention.write_kv(layer, slots, k, v)
            outs, at = [], 0
            for call in plan.calls:
                n = call.query_len if isinstance(call, AttendMetadata) else call.num_seqs
                outs.append(attention.run(layer, call, q[at : at + n]))
                at += n
            x = self.model.finish_layer(layer, x, torch.cat(outs))
        rows = list(range(len(plan.decodes))) + ([x.shape[0] - 1] if plan.completes else [])
        return self._pick(plan.token_rows, self.model.logits(x[rows]))

    @torch.no_grad()
    def _run_prefill(self, plan: StepPlan) -> list[int]:
        md = plan.metadata
        assert isinstance(md, PrefillMetadata)
        lp, tkv = md.left_pad, md.tkv
        tokens = [0] * lp + list(plan.inputs) + [0] * (md.tokens - tkv)
        positions = [max(0, min(j - lp, self.config.max_model_len - 1)) for j in range(md.tokens)]
        x = self._forward(md, tokens, positions)
        return self._pick((md.request_id,), self.model.logits(x[tkv - 1 : tkv]))

    @torch.no_grad()
    def _run_decode(self, plan: StepPlan) -> list[int]:
        md = plan.metadata
        assert isinstance(md, DecodeMetadata) and isinstance(self.attention, PagedAttention)
        self.attention.stage_decode(md)
        x = self._forward(md, list(plan.inputs), [r.num_cached for r in plan.rows])
        return self._pick(md.request_ids, self.model.logits(x))

    def _forward(self, md: PrefillMetadata | DecodeMetadata, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """The model's layers around paged attention; only real tokens' K and V are cached."""
        dev, attention = self.config.device, self.attention
        assert isinstance(attention, PagedAttention)
        slots = torch.tensor(md.slots, dtype=torch.long, device=dev)
        real = slice(md.left_pad, md.tkv) if isinstance(md, PrefillMetadata) else slice(None)
        x = self.model.embed(torch.tensor(tokens, device=dev), torch.tensor(positions, device=dev))
        for layer in range(len(self.model.layers)):
            q, k, v = self.model.qkv(layer, x)
            attention.write_kv(layer, slots, k[real], v[real])
            if isinstance(md, PrefillMetadata):
                attn = attention.prefill(layer, md, q, k, v)
            else:
                attn = attention.decode(layer, md, q)
            x = self.model.finish_layer(layer, x, attn)
        return x

    def _pick(self, rids: tuple[str, ...], logits: torch.Tensor) -> list[int]:
        tokens = logits.argmax(dim=-1).tolist()
        for rid, t, row in zip(rids, tokens, logits, strict=True):
            self.outputs[rid].append(t)
            if self.events.wants("token"):
                self.events.emit("token", TokenEvent(rid, t, row.detach().clone(), self.steps))
        return tokens

    def _emit_cache(self, plan: RaggedPlan) -> None:
        """What admission and allocation did to the prefix cache, before the step's dispatches."""
        bus, step = self.events, self.steps
        if plan.hit and plan.admission is not None and bus.wants("cache_hit"):
            blocks, hashes = zip(*plan.hit, strict=True)
            bus.emit("cache_hit", ev.CacheHitEvent(step, plan.admission.request.request_id, blocks, hashes))
        if plan.evicted and bus.wants("cache_evict"):
            for block, h in plan.evicted:
                bus.emit("cache_evict", ev.CacheEvictEvent(step, block, h))

    def _emit_ragged(self, plan: RaggedPlan) -> None:
        """A ragged step's dispatches and block tables (one each per call), then its KV writes."""
        bus, step, owners = self.events, self.steps, self.pool.owners
        for call in plan.calls:
            rids: tuple[str, ...]
            lens: tuple[int, ...]
            qlens: tuple[int, ...]
            table: tuple[tuple[int, ...], ...]
            if isinstance(call, AttendMetadata):
                rids, lens, qlens, table = (call.request_id,), (call.seq_len,), (call.query_len,), (call.block_table,)
            else:
                rids, lens, qlens, table = call.request_ids, call.seq_lens, (1,) * call.num_seqs, call.block_table
            bucket, kernel, pads = call.bucket, call.bucket.kernel, (0,) * len(rids)
            if bus.wants("dispatch"):
                phase = self.attention.runners[kernel].phase
                batch = ev.BatchInfo(rids, lens, pads, 0, qlens)
                bus.emit("dispatch", ev.DispatchEvent(kernel, bucket, batch, phase, step))
            if bus.wants("block_table"):
                args = (rids, pads, lens, 0, table, owners, self.pool.num_blocks, NULL_BLOCK, qlens, self.pool.holders)
                bus.emit("block_table", ev.BlockTableEvent(kernel, bucket, step, *args))
        if bus.wants("kv_write"):
            slots = tuple(s for call in plan.calls for s in call.slots)
            writers = tuple(s.request_id for s in plan.decodes)
            if plan.chunk is not None:
                writers += (plan.chunk.request_id,) * plan.chunk.query_len
            bus.emit("kv_write", ev.KVWriteEvent(step, slots, writers, owners, self.pool.holders))

    def _emit_batch(self, plan: StepPlan) -> None:
        """A planned step's dispatch, block table and KV writes (one event each), before its kernels run."""
        md, bus, step, owners = plan.metadata, self.events, self.steps, self.pool.owners
        if isinstance(md, DecodeMetadata):
            rids, lens, pads, table, writers = md.request_ids, md.seq_lens, md.left_pads, md.block_table, md.request_ids
        else:
            rids, lens, pads, table = (md.request_id,), (md.prompt_len,), (md.left_pad,), (md.block_table,)
            writers = rids * len(md.slots)
        bucket, kernel = md.bucket, md.bucket.kernel
        if bus.wants("dispatch"):
            phase = self.attention.runners[kernel].phase
            bus.emit("dispatch", ev.DispatchEvent(kernel, bucket, ev.BatchInfo(rids, lens, pads, md.tkv), phase, step))
        if bus.wants("block_table"):
            args = (rids, pads, lens, md.tkv, table, owners, self.pool.num_blocks, NULL_BLOCK)
            bus.emit("block_table", ev.BlockTableEvent(kernel, bucket, step, *args))
        if bus.wants("kv_write"):
            bus.emit("kv_write", ev.KVWriteEvent(step, md.slots, writers, owners))
