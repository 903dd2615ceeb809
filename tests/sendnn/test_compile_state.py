"""Each runtime compiles the plugin's graphs afresh: a second engine built in the same process (as
`hunt` reopens one after a failing example, or a test session builds several) compiles the same
two graphs as the first, and each serves only its own phase's calls.

Dynamo keys what it learns about a frame's shapes (automatic dynamic) by the code object, not by
the `torch.compile` instance, so what one engine's warmup saw would otherwise make the next
engine's prefill graph symbolic in dimensions the plugin never marked, general enough to serve
a decode call (graph-reuse's `foreign-graph`)."""

from __future__ import annotations

from typing import Any

import torch

from spyre_verify.runtimes import open_runtime
from spyre_verify.runtimes.protocol import Settings
from tests.sendnn.helpers import SENDNN, SIZES


def graph_signature(gm: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each input of a compiled graph with its shape, symbols as written (`s17`) beside sizes."""
    out = []
    for node in gm.graph.nodes:
        value = node.meta.get("example_value") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor):
            out.append((node.name, tuple("sym" if not str(d).isdigit() else str(d) for d in value.shape)))
        elif value is not None:
            out.append((node.name, ("sym" if not str(value).isdigit() else str(value),)))
    return tuple(out)


def warm_engine() -> tuple[list[Any], set[tuple[Any, Any]]]:
    """One engine warmed up and preflighted: the signature of each graph it compiled, and the
    (call's bucket, serving graph's bucket) pairs where a graph served another bucket's call."""
    signatures: list[Any] = []

    def wrap(kernel: str, backend: Any) -> Any:
        def recording(gm: Any, example_inputs: Any, *rest: Any, **kw: Any) -> Any:
            signatures.append(graph_signature(gm))
            return backend(gm, example_inputs, *rest, **kw)

        return recording

    rt = open_runtime(SENDNN, Settings(**SIZES, wrap_backend=wrap))
    try:
        rt.warmup()
        for bucket in rt.warm_plan():
            rt.preflight_call(bucket)
        foreign = {(call, graph) for call, graph in rt.kernel_accounts()["model"].served if call != graph}
    finally:
        rt.close()
    return signatures, foreign


def test_a_second_engine_of_the_process_compiles_the_same_graphs_as_the_first() -> None:
    torch._dynamo.reset()  # the first engine from a fresh compile state, whatever ran before
    first, first_foreign = warm_engine()
    second, second_foreign = warm_engine()
    assert len(first) == 2 and first_foreign == set()
    assert second_foreign == set(), f"a graph served another bucket's call: {sorted(map(str, second_foreign))}"
    assert second == first
