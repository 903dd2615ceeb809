"""Benchmark figures on the compiled attention kernels: batched against per-sequence
decode (4) and batched decode against the memory roofline (5).

Both compile `runtime.attention`'s kernels directly with `torch.compile(dynamic=False)`
at the top bucket: num_seqs = max_num_seqs rows, each holding the top KV rung of
distinct, randomly placed blocks, as a full pool hands them out.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from runtime import attention
from runtime.bucketer import SpyreAttnBucketer
from runtime.compiler import fresh_function
from runtime.config import RuntimeConfig
from spyre_verify.bench.figures import Figure, Plan, ratio_figure
from spyre_verify.messages import Progress


@dataclass
class TopBucket:
    """Inputs of one batched decode at (max_num_seqs, top KV rung), all rows real."""

    q: torch.Tensor
    out: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    table: torch.Tensor
    left_pads: torch.Tensor
    row_real: torch.Tensor
    tkv: torch.Tensor

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V the decode must read: every row's blocks, once."""
        per_block = self.k_cache[0].numel() * self.k_cache.element_size()
        return 2 * self.table.numel() * per_block

    def batched_args(self) -> tuple[Any, ...]:
        a = (self.q, self.out, self.k_cache, self.v_cache, self.table, self.left_pads, self.row_real, self.tkv)
        return (*a, False, True)

    def row_args(self, i: int) -> tuple[Any, ...]:
        return (self.q[i : i + 1], self.k_cache, self.v_cache, self.table[i], self.left_pads[i : i + 1], self.tkv)


def top_bucket(config: RuntimeConfig, seed: int = 0) -> TopBucket:
    gen = torch.Generator().manual_seed(seed)
    m, bs, s = config.model, config.block_size, config.max_num_seqs
    k = SpyreAttnBucketer(config).kv_blocks[-1]  # the runtime's own top rung: the bench drives it
    shape = (config.total_blocks, bs, m.num_heads, m.head_dim)
    assert config.usable_blocks >= s * k, f"a pool of {config.usable_blocks} blocks cannot hold {s} rows of {k}"
    # Distinct real block ids (never the null block 0), scattered over the pool.
    ids = torch.randperm(config.total_blocks - 1, generator=gen)[: s * k] + 1
    tkv = k * bs - 1  # the last position of the top rung: every block is attended
    return TopBucket(
        q=torch.randn(s, m.num_heads, m.head_dim, generator=gen),
        out=torch.zeros(s, m.num_heads, m.head_dim),
        k_cache=torch.randn(shape, generator=gen),
        v_cache=torch.randn(shape, generator=gen),
        table=ids.reshape(s, k),
        left_pads=torch.randint(0, bs, (s,), generator=gen),
        row_real=torch.ones(s, dtype=torch.bool),
        tkv=torch.tensor([tkv]),
    )


def compiled(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    return torch.compile(fresh_function(fn), backend=backend, dynamic=False, fullgraph=True)


def per_call(fn: Callable[[], Any], iters: int) -> float:
    """Mean seconds of one `fn()` over `iters` calls."""
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def calls_for(fn: Callable[[], Any], seconds: float) -> int:
    """How many calls of `fn` take about `seconds` (at least one); `fn` must be warm."""
    return max(1, min(1000, round(seconds / per_call(fn, 1))))


def alternate(a: Callable[[], Any], b: Callable[[], Any], repeats: int, seconds: float) -> list[tuple[float, float]]:
    """(a, b) seconds per call, repeat by repeat, swapping which goes first."""
    out = []
    ia, ib = calls_for(a, seconds), calls_for(b, seconds)
    for r in range(repeats):
        if r % 2:
            tb, ta = per_call(b, ib), per_call(a, ia)
        else:
            ta, tb = per_call(a, ia), per_call(b, ib)
        out.append((ta, tb))
    return out


def _settings(config: RuntimeConfig, top: TopBucket, seconds: float, threads: int) -> dict[str, Any]:
    m = config.model
    return {
        "num_seqs": config.max_num_seqs,
        "kv_blocks": int(top.table.shape[1]),
        "block_size": config.block_size,
        "max_model_len": config.max_model_len,
        "heads": m.num_heads,
        "head_dim": m.head_dim,
        "dtype": "float32",
        "kv_bytes_per_call": top.kv_bytes,
        "seconds_per_side_per_repeat": seconds,
        "threads": threads,
    }


def batched_figure(plan: Plan, progress: Progress) -> Figure:
    config, budget = plan.mode.batched, plan.mode.kernel_seconds
    top = top_bucket(config)
    progress(f"figure 4: batched vs per-sequence decode with {plan.backend} ({config.max_num_seqs} seqs)")
    batched = compiled(attention.make_batched(), plan.backend)
    single = compiled(attention.make_decode(), plan.backend)
    rows = range(config.max_num_seqs)
    with torch.no_grad():
        want = torch.cat([single(*top.row_args(i)) for i in rows])
        got = batched(*top.batched_args()).clone()
        match = bool(torch.allclose(got, want, atol=1e-5, rtol=1e-4))
        pairs = alternate(
            lambda: batched(*top.batched_args()), lambda: [single(*top.row_args(i)) for i in rows], plan.repeats, budget
        )
    return ratio_figure(
        "4",
        "Batched decode speedup: per-sequence loop / batched",
        [loop / one for one, loop in pairs],
        target=1.0,
        direction=">=",
        baseline=f"batched {_ms(p[0] for p in pairs)} ms vs loop of {len(rows)} calls {_ms(p[1] for p in pairs)} ms",
        backend=plan.backend,
        judged_under="inductor",
        notes=[
            "top bucket: num_seqs = max_num_seqs, top KV rung, distinct random blocks; target (implied): "
            "the batched kernel must beat a loop of per-sequence calls",
            "the loop calls the per-sequence kernel on row views (no staging copies), which flatters the loop",
            f"batched rows equal the per-sequence results: {match}",
        ],
        settings=_settings(config, top, budget, torch.get_num_threads()),
        details={"outputs_match": match},
        remedy=(
            "the batched kernel does the loop's work in one call, so it only saves per-call cost (Dynamo guards, "
            f"launch); under {plan.backend} that saving is small next to the attention itself. Compare the "
            "generated code of both graphs (TORCH_LOGS=output_code)"
        ),
    )


def roofline_figure(plan: Plan, progress: Progress) -> Figure:
    config, budget = plan.mode.roofline, plan.mode.kernel_seconds
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # this figure alone: the whole machine's bandwidth
    try:
        top = top_bucket(config)
        progress(
            f"figure 5: decode vs streaming read of {top.kv_bytes / 1e6:.0f} MB with {plan.backend}, "
            f"{torch.get_num_threads()} threads"
        )
        batched = compiled(attention.make_batched(), plan.backend)
        stream = torch.randn(top.kv_bytes // top.k_cache.element_size())  # the same bytes, contiguous
        with torch.no_grad():
            batched(*top.batched_args())
            stream.sum()
            pairs = alternate(lambda: batched(*top.batched_args()), stream.sum, plan.repeats, budget)
        settings = _settings(config, top, budget, torch.get_num_threads())
    finally:
        torch.set_num_threads(threads)
    kernel_bw = [top.kv_bytes / k / 1e9 for k, _ in pairs]
    stream_bw = [top.kv_bytes / s / 1e9 for _, s in pairs]
    return ratio_figure(
        "5",
        "Decode vs memory roofline: KV bytes/s / streaming-read bytes/s",
        [k / s for k, s in zip(kernel_bw, stream_bw, strict=True)],
        target=0.7,
        direction=">=",
        baseline=f"decode {_med(kernel_bw):.1f} GB/s vs tensor.sum() {_med(stream_bw):.1f} GB/s",
        backend=plan.backend,
        judged_under="inductor",
        notes=[
            "the batched kernel's KV bytes (each row's blocks, K and V, read once) per second, against "
            "tensor.sum() over a contiguous tensor of the same bytes, alternating in one process",
            "target stated for inductor on CPU; all CPU threads for this figure only",
        ],
        settings=settings,
        details={"kernel_gbps": kernel_bw, "stream_gbps": stream_bw},
        remedy=_roofline_remedy(plan.backend),
    )


def _roofline_remedy(backend: str) -> str:
    if backend != "inductor":
        return (
            f"{backend} runs the graph op by op: the gather copies every block into a fresh tensor and each "
            "einsum reads the copy again. The target is for inductor: run with --backend inductor"
        )
    return (
        "inductor already fuses the kernel into one loop nest that indexes the cache through the block table "
        "(no gather copy), but it vectorises along head_dim: per (sequence, head, token) a 16-wide dot product, "
        "a horizontal reduction, block-table index arithmetic and a bounds check, so the loop is compute bound, "
        "not memory bound. A decode kernel vectorised across tokens (K stored [blocks, heads, head_dim, "
        "block_size], one FMA per 16 tokens, one reduction per row, flash-decoding style) would stream instead"
    )


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _ms(xs: Any) -> str:
    return f"{_med([x * 1e3 for x in xs]):.3f}"
