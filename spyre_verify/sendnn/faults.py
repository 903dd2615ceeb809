"""The plugin's fault catalog and its outside fixes, each patched in from outside.

A fault is a bug of the kind the real project has had, seeded into the installed plugin by
wrapping one of its methods; each names the checker that must catch it through the serving
path. Every fault run also applies the fixes of the known findings, so none of them can be what
a control is caught by. A fix is a repair for a finding (README, "Found in real systems"),
applied with `--sendnn-fix NAME` (the runtime option `fix`; several joined by commas), off by
default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from spyre_verify.sendnn.boot import BLOCK_SIZE, PluginUnavailable
from spyre_verify.sendnn.hooks import Hooks

CATALOG = {
    # Decode slot mapping one slot too far: each new token's KV lands beside where it is read.
    "slot-off-by-one": "output-equivalence",
    # The first chunk's left-padding slots point at a real block instead of block 0.
    "padding-into-real-block": "padding-validity",
    # After warmup the decode table's width is marked static: every new width recompiles.
    "static-table-width": "graph-reuse",
    # The decode block table's first two rows swapped: a row reads another request's blocks.
    "swapped-table-rows": "padding-validity",
    # Decode forwards run the eager FMS model instead of the compiled slot.
    "eager-forward": "graph-reuse",
    # A request that ends by length or stop keeps its reservation.
    "leaked-reservation": "liveness",
}

ENV_FIX = "SPYRE_VERIFY_SENDNN_FIX"  # what `--sendnn-fix` sets (spyre_verify.cli.config)
ABORT_FIX = "abort-reservation-leak"
PAUSED_FIX = "paused-decodes-unfinished"
FIXES = {
    ABORT_FIX: "release an aborted request's reserved blocks when vLLM's finish_requests frees it "
    "(ChunkedPrefillSpyreScheduler releases them only for ids it sees finish inside update_from_output)",
    PAUSED_FIX: "count the decodes the batch-tkv limit paused as unfinished requests (ChunkedPrefillSpyreScheduler "
    "moves them out of running, and vLLM's get_num_unfinished_requests counts only running and waiting, so with "
    "every unfinished request paused the engine reports no work and never steps them again)",
}


def named(fault: str | None) -> str | None:
    if fault is not None and fault not in CATALOG:
        raise PluginUnavailable(f"fault={fault!r}: not one of the sendnn adapter's faults ({', '.join(CATALOG)})")
    return fault


def fixes(options: Mapping[str, Any]) -> frozenset[str]:
    # The bundled runtime's own options (a pool, a layout, seams) are refused or ignored by boot.sizes_of.
    known = {"fix", "num_blocks", "layout", "max_num_batched_tokens", "batched_decode", "seams"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise PluginUnavailable(f"runtime option {unknown[0]!r}: the sendnn adapter takes 'fix' (--sendnn-fix)")
    raw = options.get("fix") or os.environ.get(ENV_FIX, "")
    names = {n.strip() for n in (raw.split(",") if isinstance(raw, str) else raw) if n.strip()}
    bad = sorted(names - set(FIXES))
    if bad:
        raise PluginUnavailable(f"--sendnn-fix={bad[0]!r}: no such fix (known: {', '.join(FIXES)})")
    return frozenset(names)


def _ours(runtime: Any, runner: Any) -> bool:
    return runtime.observer is not None and runner.model is runtime.observer.model


def install(fault: str | None, fixes_: frozenset[str], hooks: Hooks, runtime: Any) -> None:
    """Class-level patches, in place before the engine (and its warmup) is built."""
    from sendnn_inference.model_executor.model_loader import spyre
    from sendnn_inference.v1.worker.spyre_model_runner import ChunkedPrefillModelRunner as Runner

    if fault in ("slot-off-by-one", "swapped-table-rows"):

        def decode(original: Any) -> Any:
            def hooked(runner: Any, data: Any) -> Any:
                out = original(runner, data)
                if _ours(runtime, runner) and runtime.slot.phase == "serving":
                    if fault == "slot-off-by-one":
                        out.slot_mapping.add_(1)
                    elif out.block_table.shape[0] >= 2:
                        out.block_table[[0, 1]] = out.block_table[[1, 0]].clone()
                return out

            return hooked

        hooks.wrap(Runner, "_prepare_decode", decode)
    elif fault == "padding-into-real-block":

        def prefill(original: Any) -> Any:
            def hooked(runner: Any, req_id: str) -> Any:
                out = original(runner, req_id)
                if _ours(runtime, runner) and runtime.slot.phase == "serving":
                    pad = out.slot_mapping < BLOCK_SIZE
                    own = runner._get_blocks(req_id)[0]
                    out.slot_mapping[pad] = own * BLOCK_SIZE + out.slot_mapping[pad] % BLOCK_SIZE
                return out

            return hooked

        hooks.wrap(Runner, "_prepare_chunked_prefill", prefill)
    elif fault == "eager-forward":

        def forward(original: Any) -> Any:
            def hooked(model: Any, *args: Any, **kwargs: Any) -> Any:
                slot = runtime.slot
                if slot is None or slot.phase != "serving" or kwargs.get("is_prompt", True):
                    return original(model, *args, **kwargs)
                model._compiled_forward = None  # the plugin's forward then calls fms_model itself
                try:
                    return original(model, *args, **kwargs)
                finally:
                    model._compiled_forward = slot

            return hooked

        hooks.wrap(spyre.SpyreCausalLM, "forward", forward)


def install_on_engine(fault: str | None, fixes_: frozenset[str], hooks: Hooks, runtime: Any) -> None:
    """Patches on the built engine's own objects, after warmup."""
    from sendnn_inference.v1.worker.spyre_model_runner import ChunkedPrefillModelRunner as Runner

    sched = runtime.scheduler
    if ABORT_FIX in fixes_ or fault is not None:
        hooks.wrap(sched, "finish_requests", lambda original: _release_on_finish(sched, original))
    if PAUSED_FIX in fixes_ or fault is not None:
        hooks.wrap(sched, "get_num_unfinished_requests", lambda original: _counting_paused(sched, original))
    if fault == "static-table-width":

        def mark(original: Any) -> Any:
            def hooked(runner: Any, model_input: Any) -> Any:
                out = original(runner, model_input)
                if _ours(runtime, runner) and not model_input.is_prompt:
                    table = model_input.block_table
                    getattr(table, "_dynamo_dynamic_indices", set()).discard(1)
                    torch._dynamo.mark_static(table, 1)
                return out

            return hooked

        hooks.wrap(Runner, "_mark_input_tensors", mark)
    elif fault == "leaked-reservation":

        def update(original: Any) -> Any:
            def hooked(*args: Any, **kwargs: Any) -> Any:
                held = dict(sched.reserved_blocks)
                out = original(*args, **kwargs)
                for rid in sched.finished_req_ids:  # ended inside this update: put their reservations back
                    if held.get(rid, 0) > 0 and rid not in sched.reserved_blocks:
                        sched.reserved_blocks[rid] = held[rid]
                        sched.total_reserved_blocks += held[rid]
                return out

            return hooked

        hooks.wrap(sched, "update_from_output", update)


def _release_on_finish(sched: Any, original: Any) -> Any:
    """The outside fix: whatever ends a request through `finish_requests` (an abort between
    steps is one) releases its reservation at once, as a finish inside a step already does."""

    def finish_requests(*args: Any, **kwargs: Any) -> Any:
        finished = original(*args, **kwargs)
        for req in finished or ():
            sched.total_reserved_blocks -= sched.reserved_blocks.pop(req.request_id, 0)
            sched.request_last_decode_step.pop(req.request_id, None)
        return finished

    return finish_requests


def _counting_paused(sched: Any, original: Any) -> Any:
    """The outside fix: a paused decode is unfinished work, so the engine keeps stepping, and the
    next schedule resumes it as soon as the batch-tkv limit allows."""

    def get_num_unfinished_requests() -> int:
        return int(original()) + len(sched.paused_decoding_requests)

    return get_num_unfinished_requests
