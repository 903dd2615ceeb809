"""The main job on the ragged layout (issue 27's acceptance, without the fault catalog, which
tests/verify/test_faults.py covers fault by fault): quiet, every reachable key served, tokens
equal the reference, and a prompt prefilled in three or more chunks."""

from __future__ import annotations

from runtime.config import RuntimeConfig
from spyre_verify.serving.edges import chunk_edges
from spyre_verify.serving.serve_loop import ignore, serve
from spyre_verify.serving.session import verify
from spyre_verify.serving.sim import Sim

EMBEDDED = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 4, "num_blocks": 8}


def test_chunk_edges_split_the_longest_prompt_in_three() -> None:
    c = RuntimeConfig(layout="ragged", max_num_batched_tokens=8, backend="eager", **EMBEDDED)
    sim, chunks = Sim(c), []
    serve(sim, chunk_edges(c), on_rejected=ignore, on_step=lambda p, _: chunks.append(p.chunk))
    long = [(ch.start, ch.query_len) for ch in chunks if ch is not None and ch.request_id == "req-2"]
    assert long == [(0, 6), (6, 6), (12, 3)]
    assert chunk_edges(c.with_(layout="padded", max_num_batched_tokens=None)) == []


def test_a_ragged_check_passes_with_a_prompt_in_three_chunks() -> None:
    c = RuntimeConfig(layout="ragged", max_num_batched_tokens=8, backend="aot_eager", **EMBEDDED)
    r = verify(c, controls=False)
    assert r.ok, [str(v) for v in r.violations] or r.error
    dispatch, output = r.checker("dispatch-coverage"), r.checker("output-equivalence")
    assert dispatch.coverage["served"] == dispatch.coverage["reachable"] > 0
    assert output.tokens_match
    assert r.most_chunks >= 3
    assert r.checker("volume-limit").status == "not run"
