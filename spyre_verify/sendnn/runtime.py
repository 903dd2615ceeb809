"""`SendnnRuntime`: the plugin's in-process `EngineCore`, behind the harness's runtime protocol.

Built by `make` (cheap: the plugin is imported and vLLM's config made, so a refusal comes at
start-up); `warmup()` builds the engine, whose construction is the plugin's own warmup, with
the adapter's hooks in place; `close()` shuts the engine down and puts every hook back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import spyre_verify.sendnn.boot as boot
import spyre_verify.sendnn.events as ev
import spyre_verify.sendnn.faults as faults
from spyre_verify.sendnn.controls import Control, control_calls
from spyre_verify.sendnn.hooks import Hooks
from spyre_verify.sendnn.observe import Observer
from spyre_verify.sendnn.reference import ReferenceRun, generate
from spyre_verify.sendnn.slot import Slot

NULL_BLOCK = 0  # vLLM's null block, where the plugin sinks the KV of left padding
_WARM: SendnnRuntime | None = None  # the runtime whose hooks are in place (they are process-wide)


class Refused(ValueError):
    """A request the plugin's front end (its platform's and vLLM's validation) refuses, or an abort
    of an id that is not waiting or running."""


@dataclass(frozen=True)
class Model:
    vocab_size: int = boot.VOCAB
    eos_token_id: int = boot.EOS


@dataclass(frozen=True)
class Config:
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int  # the plugin's prefill chunk
    max_batch_tkv_limit: int
    enable_prefix_caching: bool
    num_blocks: int
    backend: str
    model: Model = field(default_factory=Model)
    layout: str = "none"  # neither of DESIGN's layouts: the contract checkers say which rule applied


@dataclass(frozen=True)
class Finished:
    request_id: str
    tokens: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class StepResult:
    kind: str
    bucket: ev.Graph | None
    finished: tuple[str, ...]


# Rules in which the plugin differs from DESIGN's runtime, as the report states them.
RULES = {
    "padding_sink": "block 0 is the plugin's padding sink: the KV of left-padding positions is written there on "
    "purpose and never read unmasked, so a padding write may land in block 0 and nowhere else, and KV integrity "
    "leaves block 0 out",
    "no_ladder": "sendnn-inference 2.6.3 has no bucket ladder for text generation: it compiles one symbolic graph "
    "per phase (prefill, decode), so dispatch is judged against the graphs warmup compiled, and no ladder, "
    "reachable set or warmup exactness applies",
    "right_padding": "positions past a prompt in its last prefill chunk are written into that request's own last "
    "block, which its decodes overwrite before they are read",
}


class SendnnRuntime:
    name = "sendnn"
    capabilities = frozenset(
        {"paging", "reference", "kv_cache", "control_calls", "compile_accounting", "reservations", "padding_sink"}
    )
    null_block = NULL_BLOCK
    padding_sink = NULL_BLOCK
    refusal = Refused
    rules = RULES

    def __init__(self, settings: Any, version: str, sizes: boot.Sizes, vllm_config: Any) -> None:
        self.settings, self.version, self.sizes, self.vllm_config = settings, version, sizes, vllm_config
        self.fault = faults.named(settings.fault)
        self.fixes = faults.fixes(getattr(settings, "options", {}) or {})
        self.num_blocks = int(vllm_config.cache_config.num_gpu_blocks_override)
        self.config = Config(
            boot.BLOCK_SIZE,
            sizes.max_model_len,
            sizes.max_num_seqs,
            sizes.chunk,
            sizes.tkv_limit,
            sizes.prefix_caching,
            self.num_blocks,
            settings.backend,
        )
        self.bus = ev.Bus()
        self.hooks = Hooks()
        self.steps = 0
        self.finished: dict[str, Finished] = {}
        self.tokens: dict[str, list[int]] = {}  # live requests' tokens so far
        self._reasons: dict[str, str] = {}  # finish reasons vLLM reported, until the step is over
        self.core: Any = None
        self.slot: Slot | None = None
        self.observer: Observer | None = None
        self.added = 0

    @classmethod
    def build(cls, settings: Any) -> SendnnRuntime:
        version = boot.prepare_process()
        sizes = boot.sizes_of(settings)
        faults.named(settings.fault)  # an unknown fault or fix is refused before anything is built
        faults.fixes(getattr(settings, "options", {}) or {})
        try:
            config = boot.vllm_config(sizes)
        except Exception as e:  # vLLM or the platform refusing the sizes: the user's input
            raise boot.PluginUnavailable(f"vLLM refused the config: {type(e).__name__}: {e}") from None
        return cls(settings, version, sizes, config)

    # -- the protocol's core --------------------------------------------------------------
    def subscribe(self, observer: Any) -> Callable[[], None]:
        return self.bus.subscribe(observer)

    def warm_plan(self) -> list[ev.Graph]:
        return [ev.PREFILL, ev.DECODE]

    def ladders(self) -> dict[str, tuple[int, ...]]:
        return {}  # RULES["no_ladder"]

    def faults(self) -> Mapping[str, str]:
        return dict(faults.CATALOG)

    def warmup(self, progress: Callable[[int, int, Any], None] | None = None) -> None:
        """Build the engine: its construction runs the plugin's warmup on the adapter's slot."""
        if self.core is not None:
            raise RuntimeError("warmup runs once per runtime")
        global _WARM
        if _WARM is not None:  # the hooks are on the plugin's classes: one warm runtime a process
            raise RuntimeError("another sendnn runtime is warm in this process: close it before warming this one")
        _WARM = self
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.engine.input_processor import InputProcessor
        from vllm.v1.executor import Executor

        # Dynamo remembers shapes per code object across compiles: a second engine in this process
        # would compile other graphs than the first (the plugin runs one engine a process). Start as fresh.
        torch._dynamo.reset()
        self.observer = Observer(self)
        self.observer.install(self.hooks)
        faults.install(self.fault, self.fixes, self.hooks, self)
        try:
            self.core = EngineCore(self.vllm_config, Executor.get_class(self.vllm_config), log_stats=False)
        except Exception:
            self.close()
            raise
        faults.install_on_engine(self.fault, self.fixes, self.hooks, self)
        self.processor = InputProcessor(self.vllm_config)
        assert self.slot is not None, "the plugin's warmup never reached pre_warmup"
        self.slot.phase = "serving"
        plan = self.warm_plan()
        for i, bucket in enumerate(plan, start=1):
            if progress is not None:
                progress(i, len(plan), bucket)

    @property
    def scheduler(self) -> Any:
        return self.core.scheduler

    @property
    def runner(self) -> Any:
        return self.core.model_executor.driver_worker.worker.model_runner

    def add_request(
        self,
        prompt_token_ids: object,
        max_tokens: object,
        request_id: object = None,
        *,
        stop_token_ids: object = (),
        ignore_eos: object = False,
    ) -> str:
        """Through the plugin's front end, as a server takes a request: its validation refuses."""
        from vllm.inputs import tokens_input
        from vllm.sampling_params import SamplingParams

        rid = f"req-{self.added}" if request_id is None else str(request_id)
        if rid in self.tokens or rid in self.finished:
            raise Refused(f"request id {rid!r} is already in use")
        try:
            prompt = [int(t) for t in prompt_token_ids]  # type: ignore[attr-defined]
            stops = [int(t) for t in stop_token_ids]  # type: ignore[attr-defined]
            params = SamplingParams(
                max_tokens=max_tokens, temperature=0.0, ignore_eos=bool(ignore_eos), stop_token_ids=stops
            )
            request = self.processor.process_inputs(
                rid, tokens_input(prompt), params, supported_tasks=("generate",), arrival_time=time.time()
            )
        except Exception as e:  # ValueError (the platform), VLLMValidationError (vLLM), TypeError: a refusal
            raise Refused(f"add_request refused: {type(e).__name__}: {e}") from e
        req, wave = self.core.preprocess_add_request(request)
        self.core.add_request(req, wave)
        self.added += 1
        self.tokens[rid] = []
        if self.bus.wants("request"):
            self.bus.emit("request", ev.Request(rid, tuple(prompt), int(max_tokens), tuple(stops), bool(ignore_eos)))  # type: ignore[call-overload]
        return rid

    def has_work(self) -> bool:
        return self.core is not None and bool(self.scheduler.has_unfinished_requests())

    def step(self) -> StepResult:
        """One engine step. A step that runs no model does not count: one right after an abort may
        schedule nothing, so it is tried once more; then the runtime is stuck (the serve loop's stall)."""
        assert self.observer is not None
        ran: ev.Graph | None = None
        ended: list[str] = []
        for _ in range(2):
            self.observer.ran = None
            outputs, executed = self.core.step()
            ended += self._collect(outputs)
            if executed:
                ran = self.observer.ran
                break
        for rid in ended:
            self._finish(rid)
        if ran is None:
            return StepResult("idle", None, tuple(ended))
        self.bus.emit("step", ev.Step(self.steps, ran.phase, ran, tuple(ended)))
        self.steps += 1
        return StepResult(ran.phase, ran, tuple(ended))

    def _collect(self, outputs: Mapping[int, Any]) -> list[str]:
        ended = []
        for batch in outputs.values():
            for out in batch.outputs:
                rid = out.request_id
                if rid not in self.tokens:
                    continue
                for token in out.new_token_ids:
                    self.tokens[rid].append(int(token))
                    if self.bus.wants("token"):
                        self.bus.emit("token", ev.Token(rid, int(token), self.steps))
                if out.finish_reason is not None:
                    self._reasons[rid] = str(out.finish_reason)
                    ended.append(rid)
        return ended

    def _finish(self, rid: str) -> Finished:
        done = Finished(rid, tuple(self.tokens.pop(rid)), self._reasons.pop(rid, "abort"))
        self.finished[rid] = done
        self.bus.emit("finish", ev.Finish(rid, done.reason, done.tokens, self.steps))
        return done

    def abort(self, request_id: object) -> Finished:
        rid = str(request_id)
        if rid not in self.tokens:
            raise Refused(f"abort({rid!r}): no waiting or running request has that id")
        self.core.abort_requests([rid])
        self._reasons[rid] = "abort"
        return self._finish(rid)

    def pool_snapshot(self) -> object:
        s = self.scheduler
        free = s.kv_cache_manager.block_pool.get_num_free_blocks()
        return free, s.total_reserved_blocks, tuple(sorted(s.reserved_blocks.items())), len(s.waiting)

    def close(self) -> None:
        global _WARM
        try:
            if self.core is not None:
                core, self.core = self.core, None
                _shutdown(core)
        finally:
            self.hooks.restore()
            if _WARM is self:
                _WARM = None

    def __enter__(self) -> SendnnRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- capabilities -----------------------------------------------------------------------
    def reservations(self) -> dict[str, int]:
        """Blocks the plugin's scheduler holds in reserve, by request id."""
        return {str(rid): int(n) for rid, n in self.scheduler.reserved_blocks.items()}

    def block_owners(self) -> dict[int, str]:
        manager = self.scheduler.kv_cache_manager.coordinator.single_type_managers[0]
        return {b.block_id: str(rid) for rid, blocks in manager.req_to_blocks.items() for b in blocks if b.block_id}

    def kv_blocks(self, blocks: Sequence[int]) -> list[torch.Tensor]:
        idx = torch.tensor(list(blocks), dtype=torch.long)
        return [t.index_select(0, idx) for layer in self.runner.model.past_key_value_states for t in layer]

    def reference(
        self, prompt: Sequence[int], max_tokens: int, stop_token_ids: Sequence[int] = (), ignore_eos: bool = False
    ) -> ReferenceRun:
        return generate(self.runner.model.fms_model, prompt, max_tokens, stop_token_ids, ignore_eos, boot.EOS)

    def preflight_call(self, bucket: ev.Graph) -> None:
        assert self.slot is not None
        with torch.no_grad():  # the plugin's serving grad mode (its platform's inference_mode())
            self.slot.replay(bucket, self.runner.model.past_key_value_states)

    def controls(self) -> list[Control]:
        assert self.slot is not None
        return control_calls(self.slot, lambda: self.runner.model.past_key_value_states)

    def kernel_accounts(self) -> Mapping[str, Any]:
        return {ev.KERNEL: self.slot.account} if self.slot is not None else {}


def _shutdown(core: Any) -> None:
    """vLLM 0.28's shutdown empties accelerator caches, which raises on CPU torch: no-ops meanwhile."""
    acc = torch.accelerator
    hooks = Hooks()
    for name in ("empty_cache", "empty_host_cache"):
        if hasattr(acc, name):
            hooks.set(acc, name, lambda *a, **k: None)
    try:
        core.shutdown()
    finally:
        hooks.restore()
