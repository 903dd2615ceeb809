"""What the plugin did, read at each forward: the adapter's hooks and the events they send.

Two hooks, both put back on close:

- `ChunkedPrefillModelRunner.pre_warmup`: after it (the KV cache exists, warmup is next),
  the model's compiled slot becomes the adapter's `Slot`.
- `SpyreCausalLM.forward`: before the plugin's forward of the adapter's model runs, the
  attention metadata vLLM's forward context holds (block table, slot mapping, left padding,
  tkv) becomes the step's `dispatch`, `block_table` and `kv_write` events.
"""

from __future__ import annotations

from typing import Any

import spyre_verify.sendnn.events as ev
from spyre_verify.sendnn.hooks import Hooks
from spyre_verify.sendnn.slot import Slot


class Observer:
    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.model: Any = None  # the plugin's SpyreCausalLM this runtime built
        self.ran: ev.Graph | None = None  # the graph the last forward ran
        self.prefill_id: str | None = None  # the request `_prepare_chunked_prefill` last laid out

    def install(self, hooks: Hooks) -> None:
        from sendnn_inference.model_executor.model_loader import spyre
        from sendnn_inference.v1.worker.spyre_model_runner import ChunkedPrefillModelRunner as Runner

        observer = self

        def pre_warmup(original: Any) -> Any:
            def hooked(runner: Any) -> Any:
                out = original(runner)
                if observer.model is None:  # the first engine built while this runtime is warming up
                    observer.bind(runner.model, spyre._Fp32LogitsWrapper)
                return out

            return hooked

        def prepare_prefill(original: Any) -> Any:
            def hooked(runner: Any, req_id: str) -> Any:
                if runner.model is observer.model:
                    observer.prefill_id = req_id
                return original(runner, req_id)

            return hooked

        def forward(original: Any) -> Any:
            def hooked(model: Any, *args: Any, **kwargs: Any) -> Any:
                if model is observer.model:
                    observer.before_forward(kwargs.get("positions", args[1] if len(args) > 1 else None))
                return original(model, *args, **kwargs)

            return hooked

        hooks.wrap(Runner, "pre_warmup", pre_warmup)
        hooks.wrap(Runner, "_prepare_chunked_prefill", prepare_prefill)
        hooks.wrap(spyre.SpyreCausalLM, "forward", forward)

    def bind(self, model: Any, wrapper: Any) -> None:
        rt = self.runtime
        self.model = model
        rt.slot = Slot(wrapper(model.fms_model), rt.settings.backend, rt.settings.wrap_backend, rt.bus.emit)
        rt.hooks.set(model, "_compiled_forward", rt.slot)

    def before_forward(self, positions: Any) -> None:
        from vllm.forward_context import get_forward_context

        attn = get_forward_context().attn_metadata
        graph = ev.PREFILL if attn.is_prefill else ev.DECODE
        slot = self.runtime.slot
        slot.current = self.ran = graph
        if slot.phase == "serving":
            self.announce(graph, attn, positions)

    def announce(self, graph: ev.Graph, attn: Any, positions: Any) -> None:
        """The step's dispatch, block table and KV writes, as the plugin laid them out."""
        rt = self.runtime
        left = [int(x) for x in attn.left_padded_prompt_mask.reshape(-1).tolist()]
        table = tuple(tuple(int(b) for b in row) for row in attn.block_table.tolist())
        slots = tuple(int(s) for s in attn.slot_mapping.reshape(-1).tolist())
        rids: tuple[str, ...]
        writers: tuple[str | None, ...]
        if graph == ev.PREFILL:
            rids = (str(self.prefill_id),)
            lens, writers = prefill_rows(rids[0], left[0], positions[0].tolist(), len(slots))
        else:  # a decode row's tkv mask is its left padding plus its real tokens, the new one included
            rids = tuple(str(r) for r in rt.runner.input_batch.sorted_requests_ids)
            tkv = [int(x) for x in attn.current_tkv_mask.reshape(-1).tolist()]
            lens, writers = tuple(t - lp for t, lp in zip(tkv, left, strict=True)), rids
        owners, step = rt.block_owners(), rt.steps
        widest = max(lp + n for lp, n in zip(left, lens, strict=True))
        rt.bus.emit("dispatch", ev.Dispatch(ev.KERNEL, graph, ev.Batch(rids, lens), "serving", step))
        table_ev = ev.BlockTable(
            ev.KERNEL, graph, step, rids, tuple(left), lens, widest, table, owners, rt.num_blocks, rt.null_block
        )
        rt.bus.emit("block_table", table_ev)
        rt.bus.emit("kv_write", ev.KVWrite(step, slots, writers, owners))


def prefill_rows(
    rid: str, left_pad: int, positions: list[int], width: int
) -> tuple[tuple[int, ...], tuple[str | None, ...]]:
    """A prefill chunk's real length so far, and who writes each of its `width` slots.

    The plugin lays a chunk out as `width` inputs: in the first chunk, `left_pad` padding
    positions (sunk into block 0), then the prompt's tokens from position 0; in a later chunk,
    the tokens from the chunk's first position. Inputs past the prompt are right padding in the
    request's own last block. The positions tensor holds each real input's position (0 for
    padding), so the chunk's last real position ends the sequence so far."""
    later = positions[0] > 0  # a later chunk starts past position 0
    pad = 0 if later else left_pad
    return (max(positions) + 1,), tuple(None if k < pad else rid for k in range(width))
