"""The edge traffic served after the seeded workload (`serve_edges`).

- `edges.protocol`: on a `design_contract` runtime, requests at the edge of admission, aborts of
  running requests and (ragged) a prompt in chunks; on every runtime, the protocol edges, one
  scenario a refusal and ending rule of CONTRACT "Requests", and `EdgeRules`, the judge of last
  resort for them.
- `edges.prefix`: on a ragged config with prefix caching on, one scenario per cache rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spyre_verify.checks.violations import Checker
from spyre_verify.serving.edges.prefix import caching_on, prefix_edges
from spyre_verify.serving.edges.protocol import (
    Edge,
    EdgeRules,
    EdgeRun,
    abort_edges,
    boundary_arrivals,
    chunk_edges,
    ending_breach,
    fitting_tokens,
    next_id,
    protocol_edges,
)
from spyre_verify.serving.serve_loop import serve_judged

__all__ = [
    "Edge",
    "EdgeRules",
    "EdgeRun",
    "abort_edges",
    "boundary_arrivals",
    "chunk_edges",
    "ending_breach",
    "fitting_tokens",
    "next_id",
    "protocol_edges",
    "serve_edges",
]


def serve_edges(
    engine: Any, contract: bool, result: Any, progress: Callable[[str], None] | None, checkers: Sequence[Checker]
) -> None:
    """The edge traffic after the workload. With the contract: the edge of admission, each request
    admitted or refused exactly as DESIGN says, aborts of running requests (which the workload's
    queue makes rare) and (ragged) a prompt in chunks. On every runtime: the protocol edges, one
    scenario a refusal and ending rule, recorded in `result.edges`; where the config has prefix
    caching on, the prefix-cache edges after them (`prefix_edges`), recorded there too."""
    config = engine.config
    for edges in (boundary_arrivals(config), abort_edges(config), chunk_edges(config)) if contract else ():
        edge = serve_judged(engine, edges, progress, checkers)
        result.requests, result.rejected = result.requests + edge[0], result.rejected + edge[1]
    if progress:
        progress("edges: aborts of an ended, a refused and an unknown id; stop tokens, EOS and max_tokens 1")
    run = protocol_edges(engine, checkers, into=result.edges)
    if caching_on(config):
        if progress:
            progress("edges: prefix caching: a hit, a shared live block, a collision probe, a whole prompt, eviction")
        prefix_edges(run)
    result.requests, result.rejected = result.requests + run.accepted, result.rejected + run.rejected
