"""The compiled slot: what the adapter puts in `SpyreCausalLM._compiled_forward`.

The plugin compiles `_Fp32LogitsWrapper(fms_model)` with `torch.compile` and no `dynamic=`,
its dynamic dimensions marked per call (`_mark_input_tensors`). On CPU it compiles nothing
(its backends are Spyre's and inductor, which casts the model to fp16), so the adapter
installs the same call, `torch.compile(_Fp32LogitsWrapper(fms_model))`, with the harness's
backend wrapped twice: by its own recorder (the runtime's side of the count: compile
events, graph hits per bucket) and by the harness's `wrap_backend` (the other side).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from spyre_verify.sendnn.boot import BLOCK_SIZE
from spyre_verify.sendnn.events import KERNEL, Compile, Graph


@dataclass
class Account:
    """The kernel's own count, as `protocol.CAPABILITIES["compile_accounting"]` asks."""

    calls: Counter[Graph] = field(default_factory=Counter)
    served: Counter[tuple[Graph, Graph]] = field(default_factory=Counter)
    compiles: list[Compile] = field(default_factory=list)


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        copy = x.clone()
        for mark in ("_dynamo_dynamic_indices", "_dynamo_static_indices"):
            if hasattr(x, mark):  # the plugin's per-call marks travel with a replayed call
                setattr(copy, mark, set(getattr(x, mark)))
        return copy
    return x


class Slot:
    """A callable in the plugin's compiled slot: counts each call for the bucket being run,
    keeps the first warmup call of each bucket (for preflight and control calls), and calls
    the compiled module."""

    def __init__(self, module: Any, backend: str, wrap_backend: Any, emit: Callable[[str, Any], None]) -> None:
        self.account = Account()
        self.emit = emit
        self.current: Graph | None = None  # the bucket the plugin's forward is running
        self.phase = "warmup"
        self.captured: dict[Graph, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        inner = self._recording(torch._dynamo.lookup_backend(backend))
        outer = wrap_backend(KERNEL, inner) if wrap_backend is not None else inner
        self.compiled = torch.compile(module, backend=outer)  # as the plugin calls it: no dynamic=

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bucket = self.current
        assert bucket is not None, "the compiled slot ran outside a forward the adapter saw"
        self.account.calls[bucket] += 1
        if self.phase == "warmup" and bucket not in self.captured:
            self.captured[bucket] = (
                tuple(_clone(a) for a in args),
                {k: v for k, v in ((k, _clone(v)) for k, v in kwargs.items()) if k != "past_key_value_states"},
            )
        return self.compiled(*args, **kwargs)

    def replay(self, bucket: Graph, kv: Any, edit: Callable[[dict[str, Any]], None] | None = None) -> Any:
        """Call the slot as warmup called it for `bucket`, its writes sent to block 0 (the plugin's
        padding sink), on the model's KV cache `kv`; `edit` may change the arguments first."""
        args, kwargs = self.captured[bucket]
        kw = {k: _clone(v) for k, v in kwargs.items()}
        table, slots = kw.get("block_table"), kw.get("slot_mapping")
        if isinstance(table, torch.Tensor):
            table.zero_()
        if isinstance(slots, torch.Tensor):
            slots.remainder_(BLOCK_SIZE)
        if edit is not None:
            edit(kw)
        saved = self.current
        self.current = bucket
        try:
            return self(*[_clone(a) for a in args], past_key_value_states=kv, **kw)
        finally:
            self.current = saved

    def _recording(self, backend: Any) -> Any:
        account = self.account

        def record(gm: Any, example_inputs: Any, *rest: Any, **kw: Any) -> Any:
            graph_id, made_for, t0 = len(account.compiles), self.current, time.perf_counter()
            compiled = backend(gm, example_inputs, *rest, **kw)
            assert made_for is not None
            ev = Compile(KERNEL, made_for, self.phase, time.perf_counter() - t0, graph_id)
            account.compiles.append(ev)
            self.emit("compile", ev)

            def run(*call_args: Any) -> Any:
                if self.current is not None:
                    account.served[(self.current, made_for)] += 1
                return compiled(*call_args)

            return run

        return record
