"""Benchmark figures on the compiled attention kernels: batched against per-sequence
decode (4) and batched decode against the memory roofline (5).

Both compile `runtime.attention`'s kernels directly with `torch.compile(dynamic=False)`
at the top bucket: num_seqs = max_num_seqs rows, each holding the top KV rung of
distinct, randomly placed blocks, as a full pool hands them out, in the runtime's own
cache layout (`runtime.paged_attention.cache_shapes`). On CUDA (`--device cuda`) every
timed region starts and ends with `torch.cuda.synchronize()`, so a time covers the GPU's
work and not just the launches.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from runtime import attention
from runtime.compiler import fresh_function
from runtime.config import RuntimeConfig
from runtime.paged_attention import cache_shapes
from spyre_verify.bench.figures import Figure, Plan, ratio_figure
from spyre_verify.bench.timing import alternate, calls_for, per_call, synchronizer
from spyre_verify.messages import Progress
from spyre_verify.oracle.derive import ladders, usable_blocks


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
        """Bytes of K and V the decode must read: every position a real row attends
        (left_pad..tkv), K and V, once. Masked slots of a row's first block are read but not counted."""
        attended = (self.tkv - self.left_pads + 1).clamp(min=0)[self.row_real]
        heads, dim = self.q.shape[1:]
        return 2 * int(attended.sum()) * heads * dim * self.k_cache.element_size()

    @property
    def block_bytes(self) -> int:
        """Bytes of every real row's whole blocks, K and V: what a block-granular kernel reads."""
        per_block = self.k_cache[0].numel() * self.k_cache.element_size()
        return 2 * int(self.row_real.sum()) * self.table.shape[1] * per_block

    def batched_args(self) -> tuple[Any, ...]:
        a = (self.q, self.out, self.k_cache, self.v_cache, self.table, self.left_pads, self.row_real, self.tkv)
        return (*a, False, True)

    def row_args(self, i: int) -> tuple[Any, ...]:
        return (self.q[i : i + 1], self.k_cache, self.v_cache, self.table[i], self.left_pads[i : i + 1], self.tkv)


def top_bucket(config: RuntimeConfig, seed: int = 0, device: str = "cpu") -> TopBucket:
    gen = torch.Generator().manual_seed(seed)
    m, bs, s = config.model, config.block_size, config.max_num_seqs
    k = ladders(config).kv_blocks[-1]  # DESIGN's top rung, which the runtime's ladder must also top out at
    k_shape, v_shape = cache_shapes(config)
    usable = usable_blocks(config)  # DESIGN's pool, not the runtime's word for it
    assert usable >= s * k, f"a pool of {usable} blocks cannot hold {s} rows of {k}"
    # Distinct real block ids (never the null block 0), scattered over the pool.
    ids = torch.randperm(usable, generator=gen)[: s * k] + 1
    tkv = k * bs - 1  # the last position of the top rung: every block is attended
    top = TopBucket(
        q=torch.randn(s, m.num_heads, m.head_dim, generator=gen),
        out=torch.zeros(s, m.num_heads, m.head_dim),
        k_cache=torch.randn(k_shape, generator=gen),
        v_cache=torch.randn(v_shape, generator=gen),
        table=ids.reshape(s, k),
        left_pads=torch.randint(0, bs, (s,), generator=gen),
        row_real=torch.ones(s, dtype=torch.bool),
        tkv=torch.tensor([tkv]),
    )
    return TopBucket(**{f: getattr(top, f).to(device) for f in top.__dataclass_fields__})


def compiled(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    return torch.compile(fresh_function(fn), backend=backend, dynamic=False, fullgraph=True)


def split_overhead(batched: float, loop: float, rows: int) -> tuple[float, float]:
    """(per-call cost, batched kernel work) in seconds, from batched = work + call and
    loop = work + rows * call: the loop does the batched kernel's work in `rows` calls."""
    call = max(0.0, (loop - batched) / (rows - 1))
    return call, max(0.0, batched - call)


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
        "device": str(top.q.device),
        "k_cache_shape": list(top.k_cache.shape),
        "v_cache_shape": list(top.v_cache.shape),
        "kv_bytes_per_call": top.kv_bytes,
        "block_bytes_per_call": top.block_bytes,
        "seconds_per_side_per_repeat": seconds,
        "threads": threads,
    }


def batched_figure(plan: Plan, progress: Progress) -> Figure:
    config, budget, sync = plan.mode.batched, plan.mode.kernel_seconds, synchronizer(plan.device)
    top = top_bucket(config, device=plan.device)
    rows = range(config.max_num_seqs)
    progress(f"figure 4: batched vs per-sequence decode with {plan.backend} on {plan.device} ({len(rows)} seqs)")
    batched = compiled(attention.make_batched(), plan.backend)
    single = compiled(attention.make_decode(), plan.backend)
    with torch.no_grad():
        want = torch.cat([single(*top.row_args(i)) for i in rows])
        got = batched(*top.batched_args()).clone()
        match = bool(torch.allclose(got, want, atol=1e-5, rtol=1e-4))
        pairs = alternate(
            lambda: batched(*top.batched_args()),
            lambda: [single(*top.row_args(i)) for i in rows],
            plan.repeats,
            budget,
            sync,
        )
        # The batched kernel's floor as a memory problem: one read of the same bytes, contiguous.
        stream = torch.randn(top.kv_bytes // top.k_cache.element_size(), device=plan.device)
        read = _med([per_call(stream.sum, calls_for(stream.sum, budget / 4, sync), sync) for _ in range(plan.repeats)])
    call, work = split_overhead(_med([p[0] for p in pairs]), _med([p[1] for p in pairs]), len(rows))
    return ratio_figure(
        "4",
        "Batched decode speedup: per-sequence loop / batched",
        [loop / one for one, loop in pairs],
        target=3.0,
        direction=">=",
        baseline=f"batched {_ms(p[0] for p in pairs)} ms vs loop of {len(rows)} calls {_ms(p[1] for p in pairs)} ms",
        backend=plan.backend,
        judged_under="inductor",
        notes=[
            "top bucket: num_seqs = max_num_seqs, top KV rung, distinct random blocks; target: issue 17",
            "the loop calls the per-sequence kernel on row views (no staging copies), which flatters the loop",
            f"batched rows equal the per-sequence results: {match}",
            f"split of the medians: per-call cost {call * 1e6:.0f} us, batched kernel work {work * 1e6:.0f} us; "
            f"tensor.sum() reads the same {top.kv_bytes} B in {read * 1e6:.0f} us",
        ],
        settings=_settings(config, top, budget, torch.get_num_threads()),
        # A fast kernel with wrong rows is no speedup: the target needs the rows to equal the loop's.
        conditions={"batched rows equal the per-sequence results": match},
        details={
            "outputs_match": match,
            "per_call_us": call * 1e6,
            "batched_work_us": work * 1e6,
            "read_us": read * 1e6,
        },
        remedy=_batched_remedy(call, work, read, len(rows)),
    )


def _batched_remedy(call: float, work: float, read: float, rows: int) -> str:
    """Why the ratio is what it is: rows share no KV, so the loop loses only its extra calls."""
    ratio = (work + rows * call) / (work + call) if work + call > 0 else float("nan")
    need = (rows - 3) / 2  # (work + rows * call) / (work + call) >= 3  <=>  work <= need * call
    return (
        f"rows share no blocks, so the loop does the batched kernel's work too and loses only its {rows - 1} "
        f"extra calls: ratio = (work + {rows} x call) / (work + call) = {ratio:.2f} with work {work * 1e6:.0f} us "
        f"and call {call * 1e6:.0f} us. 3x needs work <= {need:g} x call ({need * call * 1e6:.0f} us here); a plain "
        f"read of the same KV takes {read * 1e6:.0f} us, so the kernel is compute bound: inductor accumulates each "
        "16-lane output in one register, one dependent FMA per 16 floats, and takes an exp per score. A kernel "
        "with several accumulators per tile (vLLM's CPU paged attention) could; on a GPU the work is microseconds "
        "and the per-call cost dominates (run --device cuda)"
    )


def roofline_figure(plan: Plan, progress: Progress) -> Figure:
    config, budget, sync = roofline_config(plan), plan.mode.kernel_seconds, synchronizer(plan.device)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # this figure alone: the whole machine's bandwidth
    try:
        top = top_bucket(config, device=plan.device)
        progress(
            f"figure 5: decode vs streaming read of {top.kv_bytes / 1e6:.0f} MB with {plan.backend} on "
            f"{plan.device}, {torch.get_num_threads()} threads"
        )
        batched = compiled(attention.make_batched(), plan.backend)
        # The same bytes, contiguous, read by one reduction.
        stream = torch.randn(top.kv_bytes // top.k_cache.element_size(), device=plan.device)
        with torch.no_grad():
            got = batched(*top.batched_args()).clone()
            match, err = matches_eager(top, got)
            stream.sum()
            pairs = alternate(lambda: batched(*top.batched_args()), stream.sum, plan.repeats, budget, sync)
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
            f"compiled decode rows equal the eager per-sequence decode: {match} (largest difference {err:.2g})",
            "bytes counted: K and V of every position a real row attends (left_pad..tkv), once: "
            f"{top.kv_bytes} B; the kernel reads whole blocks ({top.block_bytes} B), the masked slots of each "
            "row's first block uncounted",
            "against tensor.sum() over a contiguous tensor of the counted bytes, alternating in one process",
            "target stated for inductor on CPU; all CPU threads for this figure only"
            + (f"; on {plan.device} {GPU_ROWS}x the rows, so launches do not dominate" if plan.device != "cpu" else ""),
        ],
        settings=settings,
        details={"kernel_gbps": kernel_bw, "stream_gbps": stream_bw, "outputs_match": match, "max_abs_error": err},
        remedy=_roofline_remedy(plan.backend),
        # Bandwidth from a kernel that skips work is no bandwidth: its output must be the eager kernel's.
        conditions={"the compiled decode's rows equal the eager per-sequence decode's": match},
    )


def matches_eager(top: TopBucket, got: torch.Tensor) -> tuple[bool, float]:
    """Whether a batched decode's output `got` equals the per-sequence kernel run eagerly, row by
    row, with no compiler, and the largest absolute difference."""
    eager = attention.make_decode()
    want = torch.cat([eager(*top.row_args(i)) for i in range(top.q.shape[0])])
    err = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
    return bool(torch.allclose(got, want, atol=1e-5, rtol=1e-4)), err


# On a GPU the CPU's 134 MB stream in ~30 us, about one call's launch cost: 8x the rows keeps
# the figure about memory, not launches.
GPU_ROWS = 8


def roofline_config(plan: Plan) -> RuntimeConfig:
    c = plan.mode.roofline
    return c.with_(max_num_seqs=c.max_num_seqs * GPU_ROWS) if plan.device.startswith("cuda") else c


def _roofline_remedy(backend: str) -> str:
    if backend != "inductor":
        return (
            f"{backend} runs the graph op by op: the block-table index copies every block into a fresh tensor and "
            "each product and sum reads a copy again. The target is for inductor: run with --backend inductor"
        )
    return (
        "inductor fuses each half of the kernel into one loop nest that indexes the cache through the block "
        "table (no gather copy) and, with the tiled layout, walks every K and V tile contiguously. What is left "
        "is per-vector work: one FMA, the block-table index and a bounds check per 16 floats, on one "
        "accumulator. The kernel is 7 parallel loops against tensor.sum()'s one, so a core another process "
        "shares stalls it at every barrier: on a busy machine the ratio falls well below its one-thread value "
        "(torch.set_num_threads(1) on both sides). Look at the generated loops (TORCH_LOGS=output_code) for a "
        "strided or repeated walk"
    )


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _ms(xs: Any) -> str:
    return f"{_med([x * 1e3 for x in xs]):.3f}"
