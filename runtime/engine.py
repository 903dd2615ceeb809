"""The continuous-batching engine: one step prefills a joining request or decodes the batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from runtime.block_pool import NULL_BLOCK, BlockPool
from runtime.bucketer import Bucket, SpyreAttnBucketer
from runtime.compiler import BackendWrapper, compile_limits, set_dynamo_config
from runtime.config import RuntimeConfig
from runtime.events import (
    BatchInfo,
    BlockTableEvent,
    DispatchEvent,
    EventBus,
    KVWriteEvent,
    RequestEvent,
    StateEvent,
    StepEvent,
)
from runtime.metadata import DecodeMetadata, MetadataBuilder, PrefillMetadata
from runtime.model import TinyTransformer
from runtime.paged_attention import PagedAttention
from runtime.scheduler import Scheduler, StepPlan
from runtime.seams import Seams
from runtime.warmup import WarmupRecorder


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
        self.events = EventBus()
        self.bucketer = SpyreAttnBucketer(config)
        self.pool = BlockPool(config.total_blocks)
        self.builder = MetadataBuilder(self.bucketer)
        self.scheduler = Scheduler(config, self.pool, self.builder)
        self.attention = PagedAttention(config, self.bucketer, self.events, wrap_backend)
        self.recorder = WarmupRecorder(self.bucketer, self.attention, seams)
        self.model = model or TinyTransformer(config)
        self.steps = 0
        self.outputs: dict[str, list[int]] = {}
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

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lifecycle ------------------------------------------------------------------------
    def subscribe(self, observer: Any) -> Callable[[], None]:
        return self.events.subscribe(observer)

    def warmup(self, progress: Callable[[int, int, Bucket], None] | None = None) -> None:
        self.recorder.record_graphs(progress)

    def add_request(self, prompt_token_ids: object, max_tokens: object, request_id: object = None) -> str:
        rid = self.scheduler.add(prompt_token_ids, max_tokens, request_id)
        self.outputs[rid] = []
        if self.events.wants("request"):
            req = self.scheduler.waiting[-1]
            self.events.emit("request", RequestEvent(rid, req.prompt, req.max_tokens))
        return rid

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def run_until_done(self, max_steps: int = 1_000_000) -> dict[str, list[int]]:
        for _ in range(max_steps):
            if not self.has_work():
                return self.outputs
            self.step()
        raise RuntimeError(f"engine still busy after {max_steps} steps")

    def step(self) -> StepResult:
        """Schedule, run the kernels on the plan, postprocess: nano-vllm's three calls."""
        plan = self.scheduler.schedule()
        if plan is None:
            assert not self.scheduler.waiting, "an empty batch always admits the head of the queue"
            return StepResult("idle", None, ())
        tokens = self._run_prefill(plan) if plan.kind == "prefill" else self._run_decode(plan)
        finished = tuple(r.request_id for r in self.scheduler.postprocess(tokens))
        kind, bucket = plan.kind, plan.bucket
        if self.events.wants("step"):
            self.events.emit("step", StepEvent(self.steps, kind, bucket, finished))
        if self.events.wants("state"):
            admitted = plan.admission.request_id if plan.admission else None
            self.events.emit("state", self._state(kind, admitted, finished))
        self.steps += 1
        return StepResult(kind, bucket, finished)

    def _state(self, kind: str, admitted: str | None, finished: tuple[str, ...]) -> StateEvent:
        sched = self.scheduler
        waiting = tuple(r.request_id for r in sched.waiting)
        return StateEvent(
            self.steps, kind, admitted, sched.tkv, sched.row_states(), waiting, finished, self.pool.num_free
        )

    # -- model passes ---------------------------------------------------------------------------
    def _run_prefill(self, plan: StepPlan) -> list[int]:
        md = plan.metadata
        assert isinstance(md, PrefillMetadata)
        dev, width = self.config.device, md.tokens
        lp, tkv, rid = md.left_pad, md.tkv, md.request_id
        tokens = [0] * lp + list(plan.inputs) + [0] * (width - tkv)
        positions = [max(0, min(j - lp, self.config.max_model_len - 1)) for j in range(width)]
        self._emit_dispatch(md.bucket, (rid,), (md.prompt_len,), (lp,), tkv)
        self._emit_table(md.bucket, (rid,), (lp,), tkv, (md.block_table,))
        slots = torch.tensor(md.slots, dtype=torch.long, device=dev)
        self._emit_writes((rid,), [md.slots])
        with torch.no_grad():
            x = self.model.embed(torch.tensor(tokens, device=dev), torch.tensor(positions, device=dev))
            for layer in range(len(self.model.layers)):
                q, k, v = self.model.qkv(layer, x)
                self.attention.write_kv(layer, slots, k[lp:tkv], v[lp:tkv])
                x = self.model.finish_layer(layer, x, self.attention.prefill(layer, md, q, k, v))
            logits = self.model.logits(x[tkv - 1 : tkv])
        return self._pick((rid,), logits)

    def _run_decode(self, plan: StepPlan) -> list[int]:
        md = plan.metadata
        assert isinstance(md, DecodeMetadata)
        dev, running = self.config.device, plan.rows
        self._emit_dispatch(md.bucket, md.request_ids, md.seq_lens, md.left_pads, md.tkv)
        self._emit_table(md.bucket, md.request_ids, md.left_pads, md.tkv, md.block_table)
        self._emit_writes(md.request_ids, [(slot,) for slot in md.slots])
        self.attention.stage_decode(md)
        inputs = torch.tensor(plan.inputs, device=dev)
        positions = torch.tensor([r.num_cached for r in running], device=dev)
        slots = torch.tensor(md.slots, dtype=torch.long, device=dev)
        with torch.no_grad():
            x = self.model.embed(inputs, positions)
            for layer in range(len(self.model.layers)):
                q, k, v = self.model.qkv(layer, x)
                self.attention.write_kv(layer, slots, k, v)
                x = self.model.finish_layer(layer, x, self.attention.decode(layer, md, q))
            logits = self.model.logits(x)
        return self._pick(md.request_ids, logits)

    def _pick(self, rids: tuple[str, ...], logits: torch.Tensor) -> list[int]:
        tokens = logits.argmax(dim=-1).tolist()
        for rid, t, row in zip(rids, tokens, logits, strict=True):
            self.outputs[rid].append(t)
            if self.events.wants("token"):
                self.events.emit("token", TokenEvent(rid, t, row.detach().clone(), self.steps))
        return tokens

    # -- events ----------------------------------------------------------------------------------
    def _emit_dispatch(
        self, bucket: Bucket, rids: tuple[str, ...], lens: tuple[int, ...], pads: tuple[int, ...], tkv: int
    ) -> None:
        if self.events.wants("dispatch"):
            batch = BatchInfo(rids, lens, pads, tkv)
            phase = self.attention.runners[bucket.kernel].phase
            self.events.emit("dispatch", DispatchEvent(bucket.kernel, bucket, batch, phase, self.steps))

    def _emit_table(
        self, bucket: Bucket, rids: tuple[str, ...], pads: tuple[int, ...], tkv: int, table: tuple[tuple[int, ...], ...]
    ) -> None:
        if self.events.wants("block_table"):
            ids = sorted({b for row in table for b in row})
            owners = tuple((b, self.pool.owner_of(b)) for b in ids)
            ev = BlockTableEvent(
                bucket.kernel, bucket, self.steps, rids, pads, tkv, table, owners, self.pool.num_blocks, NULL_BLOCK
            )
            self.events.emit("block_table", ev)

    def _emit_writes(self, rids: tuple[str, ...], slots_per_request: list[tuple[int, ...]]) -> None:
        if self.events.wants("kv_write"):
            bs = self.config.block_size
            for rid, slots in zip(rids, slots_per_request, strict=True):
                blocks = tuple(s // bs for s in slots)
                owners = tuple(self.pool.owner_of(b) for b in blocks)
                self.events.emit("kv_write", KVWriteEvent(rid, slots, blocks, owners, self.steps))
