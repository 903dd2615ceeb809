"""The README's table of one mixed ragged step is what the runtime runs (it stays true)."""

from __future__ import annotations

from pathlib import Path

from runtime.config import RuntimeConfig
from spyre_verify.sim import Sim

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_mixed_step_is_the_runtimes() -> None:
    sim = Sim(RuntimeConfig(layout="ragged", block_size=4, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=8))
    sim.add_request([1] * 6, 30, "A")
    sim.step()
    sim.add_request([1] * 4, 30, "B")
    sim.step()
    sim.step()
    sim.add_request([1] * 20, 5, "C")
    sim.step()  # C's first chunk
    plan = sim.step()  # the README's step
    assert plan.kind == "mixed"
    assert [(d.request_id, d.start) for d in plan.decodes] == [("A", 9), ("B", 6)]
    assert plan.chunk is not None and (plan.chunk.start, plan.chunk.query_len) == (6, 6)
    assert [str(b) for b in plan.buckets] == ["chunked(2, 4, 1)", "attend(4, 8)"]
    text = README.read_text()
    for cell in ("`chunked(2, 4, 1)`", "`attend(4, 8)`", "position 9", "position 6", "positions 6..11"):
        assert cell in text, cell
