"""Control calls: kernel calls that must compile, made through the serving entry point.

A control is only worth something if it travels the path serving traffic travels, so a
broken serving guard fails it. Every control here calls `PagedAttention.decode` or
`PagedAttention.prefill`, the functions `Engine._run_decode` / `_run_prefill` call for
each layer, with metadata shaped like the builder's, and the caller wraps it in the
same guard serving runs under:

- `size-between-rungs`: prefill metadata for a length that is not a block multiple
  (else decode metadata for a KV width), one no graph was compiled for.
- `foreign-stride`: a prefill on a bucket warmup compiled, with the staging buffers
  swapped for views of the same shape and another stride, as a runtime that stages into
  fresh tensors would have. The entry point slices its arguments from the staging
  buffers, so the buffers are the one thing a control can change without a seam; they
  are put back after each call.

A control compiles nothing the engine can later dispatch to, writes no KV and leaves
the staging buffers as it found them. While one runs, `in_control()` is true, so the
checkers watching the engine record its compile as a control's, not as serving's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import DECODE, PREFILL, Bucket, DecodeKey, PrefillKey
from runtime.events import WARMUP
from runtime.metadata import DecodeMetadata, PrefillMetadata

_CONTROLLING: ContextVar[bool] = ContextVar("spyre_verify_control", default=False)
CONTROL_ID = "control"  # request id of every control's metadata; no such request exists


def in_control() -> bool:
    return _CONTROLLING.get()


@contextmanager
def control_scope() -> Iterator[None]:
    token = _CONTROLLING.set(True)
    try:
        yield
    finally:
        _CONTROLLING.reset(token)


@dataclass(frozen=True)
class Control:
    name: str
    bucket: Bucket
    call: Callable[[], Any]  # one call through the serving entry point


def compiled(engine: Any, kernel: str, phase: str | None = None) -> set[Bucket]:
    """Buckets the kernel's runner has compiled a graph for (in `phase`), from its compile events."""
    return {ev.bucket for ev in engine.attention.runners[kernel].compiles if phase in (None, ev.phase)}


def decode_control(engine: Any, width: int) -> Control:
    """A one-row decode whose block table is `width` null blocks, at the last tkv of that width."""
    att, bs = engine.attention, engine.config.block_size
    tkv = width * bs - 1  # the new token is the width's last position: ceil((tkv + 1) / bs) == width
    md = DecodeMetadata(
        bucket=Bucket(DECODE, DecodeKey(width)),
        tkv=tkv,
        request_ids=(CONTROL_ID,),
        block_table=((NULL_BLOCK,) * width,),
        left_pads=(tkv,),  # all padding but the new token
        seq_lens=(1,),
        slots=(NULL_BLOCK * bs,),  # never written: only the engine writes KV, decode() reads it
        needs_gather=False,
        store_out=False,
    )

    def call() -> Any:
        att.stage_decode(md)
        return att.decode(0, md, torch.zeros_like(att.staging.seq_q))

    return Control("size-between-rungs", md.bucket, call)


def prefill_md(engine: Any, tokens: int) -> PrefillMetadata:
    bs = engine.config.block_size
    return PrefillMetadata(
        bucket=Bucket(PREFILL, PrefillKey(tokens)),
        tkv=tokens,
        request_id=CONTROL_ID,
        left_pad=0,
        prompt_len=tokens,
        block_table=(NULL_BLOCK,) * -(-tokens // bs),
        slots=(),  # never written: prefill() only attends over the q/k/v it is given
    )


def prefill_size_control(engine: Any, tokens: int) -> Control:
    att, md = engine.attention, prefill_md(engine, tokens)
    qkv = torch.zeros_like(att.staging.prefill_q[:tokens])
    return Control("size-between-rungs", md.bucket, lambda: att.prefill(0, md, qkv, qkv, qkv))


def fresh_size_control(engine: Any) -> Control | None:
    """A size the engine has no graph for; None when every size has one.

    A prefill length that is not a block multiple comes first: no builder that pads to
    blocks dispatches it, so the control's graph can never serve (and hide) a later cold
    dispatch. Then a decode width, then any prefill length. Chosen from what the runners
    compiled, so it is fresh however often it is asked for (the plugin's audit runs one
    per `graph_audit` block).
    """
    st, bs = engine.attention.staging, engine.config.block_size
    lengths = range(1, st.prefill_q.shape[0] + 1)
    prefills = compiled(engine, PREFILL)
    tokens = next((t for t in lengths if t % bs and Bucket(PREFILL, PrefillKey(t)) not in prefills), None)
    if tokens is not None:
        return prefill_size_control(engine, tokens)
    decodes = compiled(engine, DECODE)
    width = next((k for k in range(1, st.seq_table.shape[0] + 1) if Bucket(DECODE, DecodeKey(k)) not in decodes), None)
    if width is not None:
        return decode_control(engine, width)
    tokens = next((t for t in lengths if Bucket(PREFILL, PrefillKey(t)) not in prefills), None)
    return prefill_size_control(engine, tokens) if tokens is not None else None


def stride_control(engine: Any) -> Control:
    """A prefill on a warm bucket whose staging buffers have twice the row stride."""
    att, bs = engine.attention, engine.config.block_size
    st = att.staging
    warm = sorted(compiled(engine, PREFILL, WARMUP))
    tokens = warm[0].key.tokens if warm and isinstance(warm[0].key, PrefillKey) else min(bs, st.prefill_q.shape[0])
    md = prefill_md(engine, tokens)
    shape = st.prefill_q.shape
    foreign = [
        torch.zeros((2 * shape[0], *shape[1:]), dtype=st.prefill_q.dtype, device=st.prefill_q.device)[::2]
        for _ in range(3)
    ]
    qkv = torch.zeros_like(st.prefill_q[:tokens])

    def call() -> Any:
        saved = st.prefill_q, st.prefill_k, st.prefill_v
        st.prefill_q, st.prefill_k, st.prefill_v = foreign
        try:
            return att.prefill(0, md, qkv, qkv, qkv)
        finally:
            st.prefill_q, st.prefill_k, st.prefill_v = saved

    return Control("foreign-stride", md.bucket, call)


def control_calls(engine: Any) -> list[Control]:
    """Both controls, chosen before either runs (the first one's graph must not steer the second).
    A ragged engine's are `checks.ragged_controls`', through its own entry point."""
    size = fresh_size_control(engine)
    return [*([size] if size is not None else []), stride_control(engine)]
