"""The continuous-batching engine: one step prefills a joining request or decodes the batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from runtime.block_pool import NULL_BLOCK, BlockPool
from runtime.bucketer import Bucket, SpyreAttnBucketer
from runtime.compiler import BackendWrapper
from runtime.config import RuntimeConfig
from runtime.events import (
    BatchInfo,
    BlockTableEvent,
    DispatchEvent,
    EventBus,
    KVWriteEvent,
    RequestEvent,
    RowState,
    StateEvent,
    StepEvent,
)
from runtime.metadata import DecodeMetadata, MetadataBuilder, PrefillMetadata
from runtime.model import TinyTransformer
from runtime.paged_attention import PagedAttention
from runtime.scheduler import Request, Scheduler
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
        self.scheduler = Scheduler(config, self.pool)
        self.builder = MetadataBuilder(self.bucketer, seams.builder_kv_ladder, seams.padding_block)
        self.attention = PagedAttention(config, self.bucketer, self.events, seams.mask_padding, wrap_backend)
        self.recorder = WarmupRecorder(self.bucketer, self.attention, seams)
        self.model = model or TinyTransformer(config)
        self.steps = 0
        self.outputs: dict[str, list[int]] = {}

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
        sched = self.scheduler
        adm = sched.next_admission()
        if adm is not None:
            req = sched.admit(adm)
            md = self.builder.build_prefill(req.seq_state(), sched.tkv)
            token = self._run_prefill(req, md)
            done = sched.record_prefill(req, token)
            kind, bucket = "prefill", md.bucket
        elif sched.running:
            sched.grow_for_decode()
            dmd = self.builder.build_decode(sched.seq_states(), sched.tkv)
            tokens = self._run_decode(dmd)
            done = sched.record_decode(tokens)
            kind, bucket = "decode", dmd.bucket
        else:
            assert not sched.waiting, "an empty batch always admits the head of the queue"
            return StepResult("idle", None, ())
        finished = tuple(r.request_id for r in done)
        if self.events.wants("step"):
            self.events.emit("step", StepEvent(self.steps, kind, bucket, finished))
        if self.events.wants("state"):
            self.events.emit("state", self._state(kind, adm.request.request_id if adm else None, finished))
        self.steps += 1
        return StepResult(kind, bucket, finished)

    def _state(self, kind: str, admitted: str | None, finished: tuple[str, ...]) -> StateEvent:
        sched, pool = self.scheduler, self.pool
        rows = tuple(
            RowState(
                r.request_id, r.left_pad, tuple(r.blocks), r.num_cached, len(r.output), pool.reserved(r.request_id)
            )
            for r in sched.running
        )
        waiting = tuple(r.request_id for r in sched.waiting)
        return StateEvent(self.steps, kind, admitted, sched.tkv, rows, waiting, finished, pool.num_free)

    # -- model passes ---------------------------------------------------------------------------
    def _run_prefill(self, req: Request, md: PrefillMetadata) -> int:
        dev, width = self.config.device, int(md.bucket.key[0])
        lp, tkv = md.left_pad, md.tkv
        tokens = [0] * lp + list(req.prompt) + [0] * (width - tkv)
        positions = [max(0, min(j - lp, self.config.max_model_len - 1)) for j in range(width)]
        self._emit_dispatch(md.bucket, (req.request_id,), (md.prompt_len,), (lp,), tkv)
        self._emit_table(md.bucket, (req.request_id,), (lp,), tkv, (md.block_table,))
        slots = torch.tensor(md.slots, dtype=torch.long, device=dev)
        self._emit_writes((req.request_id,), [md.slots])
        with torch.no_grad():
            x = self.model.embed(torch.tensor(tokens, device=dev), torch.tensor(positions, device=dev))
            for layer in range(len(self.model.layers)):
                q, k, v = self.model.qkv(layer, x)
                self.attention.write_kv(layer, slots, k[lp:tkv], v[lp:tkv])
                x = self.model.finish_layer(layer, x, self.attention.prefill(layer, md, q, k, v))
            logits = self.model.logits(x[tkv - 1 : tkv])
        return self._pick([req], logits)[0]

    def _run_decode(self, md: DecodeMetadata) -> list[int]:
        dev, running = self.config.device, self.scheduler.running
        self._emit_dispatch(md.bucket, md.request_ids, md.seq_lens, md.left_pads, md.tkv)
        self._emit_table(md.bucket, md.request_ids, md.left_pads, md.tkv, md.block_table)
        self._emit_writes(md.request_ids, [(slot,) for slot in md.slots])
        self.attention.stage_decode(md)
        inputs = torch.tensor([r.output[-1] for r in running], device=dev)
        positions = torch.tensor([r.num_cached for r in running], device=dev)
        slots = torch.tensor(md.slots, dtype=torch.long, device=dev)
        with torch.no_grad():
            x = self.model.embed(inputs, positions)
            for layer in range(len(self.model.layers)):
                q, k, v = self.model.qkv(layer, x)
                self.attention.write_kv(layer, slots, k, v)
                x = self.model.finish_layer(layer, x, self.attention.decode(layer, md, q))
            logits = self.model.logits(x)
        return self._pick(running, logits)

    def _pick(self, reqs: list[Request], logits: torch.Tensor) -> list[int]:
        tokens = logits.argmax(dim=-1).tolist()
        for r, t, row in zip(reqs, tokens, logits, strict=True):
            self.outputs[r.request_id].append(t)
            if self.events.wants("token"):
                self.events.emit("token", TokenEvent(r.request_id, t, row.detach().clone(), self.steps))
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
