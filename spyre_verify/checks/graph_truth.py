"""Graph reuse's judgements of what the runner says about its own graphs, each against
something the runner does not own: a compile's label against the bucket its graph's inputs
give, a preflight against the graph the counting backend saw serve it, serving calls against
the hits the counting backend counted, and Dynamo's limits against the oracle's warm graphs.
Each returns findings as (kernel, message, bucket); `GraphReuse` flags them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from runtime.bucketer import Bucket
from spyre_verify.checks.counting import CallLedger, CountedGraph
from spyre_verify.oracle.graph_keys import graph_bucket, warm_graphs

LIMITS = ("recompile_limit", "accumulated_recompile_limit")
Finding = tuple[str, str, str | None]  # (kernel, message, bucket)


def shapes_text(shapes: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name} {list(shape)}" for name, shape in sorted(shapes.items()))


def limit_findings(config: Any) -> tuple[dict[str, Any], list[Finding]]:
    """Dynamo's limits, as the engine set them, against the graphs each kernel must hold warm.

    Both limits count per code object (checked on torch 2.13: each kernel has its own), and
    past either one Dynamo runs the kernel eagerly, or with fullgraph raises, on a bucket
    warmup should have compiled. Returns the limits and counts for the report, and findings.
    """
    per_kernel, method = warm_graphs(config)
    limits = {name: int(getattr(torch._dynamo.config, name)) for name in LIMITS}
    found: list[Finding] = []
    for kernel, buckets in sorted(per_kernel.items()):
        for name, limit in limits.items():
            if len(buckets) > limit:
                message = (
                    f"{kernel}: {len(buckets)} warm graphs ({', '.join(map(str, buckets))}) but Dynamo's {name} "
                    f"is {limit}: past it {len(buckets) - limit} of them would run eagerly or fail to compile"
                )
                found.append((kernel, message, None))
    return {**limits, "warm_graphs": {k: len(v) for k, v in per_kernel.items()}, "walk": method}, found


def mislabel(kernel: str, index: int, ev: Any, graph: CountedGraph) -> str | None:
    """Why compile `index` of `kernel` is mislabelled, or None; raises LookupError when unmapped."""
    key = graph_bucket(kernel, graph.shapes)
    if key is None:
        raise LookupError(kernel)
    if key == ev.bucket:
        return None
    return (
        f"{kernel} graph {index}, compiled in {ev.phase}, is labelled {ev.bucket} but its inputs "
        f"({shapes_text(graph.shapes)}) are those of {key}"
    )


def wrong_graphs(bucket: Bucket, graphs: Sequence[CountedGraph], hits_before: Sequence[int]) -> list[str]:
    """The graphs that served a preflight of `bucket` whose inputs give another bucket."""
    out = []
    for i, g in enumerate(graphs):
        key = graph_bucket(bucket.kernel, g.shapes)
        if g.hits > (hits_before[i] if i < len(hits_before) else 0) and key is not None and key != bucket:
            out.append(
                f"{bucket}: the preflight call was served by {bucket.kernel} graph {i}, whose inputs "
                f"({shapes_text(g.shapes)}) are those of {key}"
            )
    return out


def shortfalls(ledger: CallLedger, counted: dict[str, int]) -> list[Finding]:
    """Kernels whose serving dispatches imply more calls than the counting backend saw hits."""
    found: list[Finding] = []
    for kernel, expected in sorted(ledger.expected.items()):
        if counted[kernel] >= expected:
            continue
        short = ledger.first_short.get(kernel)
        first = (
            f"; first short: {short.bucket} at step {short.step} ({short.counted} of {short.expected}){short.layer()}"
            if short
            else ""
        )
        message = (
            f"{kernel}: serving dispatches imply {expected} calls but the harness's counting backend saw "
            f"{counted[kernel]} compiled-graph hits{first}: calls ran without the compiled kernel"
        )
        found.append((kernel, message, short.bucket if short else None))
    return found
