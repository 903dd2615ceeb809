"""The README's table of one mixed ragged step is what the runtime runs (it stays true)."""

from __future__ import annotations

from pathlib import Path

from runtime.config import RuntimeConfig
from spyre_verify.serving.sim import Sim

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_mixed_step_is_the_runtimes() -> None:
    sim = Sim(RuntimeConfig(layout="ragged", block_size=4, max_model_len=64, max_num_seqs=5, max_num_batched_tokens=8))
    # Prompts that share no block: with prefix caching (on by default) E would start from a hit.
    for rid, prompt, token in (("A", 6, 1), ("B", 4, 2), ("C", 3, 3), ("D", 2, 4)):
        sim.add_request([token] * prompt, 30, rid)
        sim.step()
    sim.add_request([5] * 20, 5, "E")
    sim.step()  # E's first chunk
    plan = sim.step()  # the README's step
    assert plan.kind == "mixed"
    assert [(d.request_id, d.start) for d in plan.decodes] == [("A", 10), ("B", 7), ("C", 5), ("D", 3)]
    assert plan.chunk is not None and (plan.chunk.start, plan.chunk.query_len) == (4, 4)
    assert [str(b) for b in plan.buckets] == ["chunked(4, 4, 1)", "attend(2, 8)"]
    text = README.read_text()
    for cell in ("`chunked(4, 4, 1)`", "`attend(2, 8)`", "position 10", "position 3", "positions 4..7"):
        assert cell in text, cell


def test_below_four_rows_each_decodes_alone() -> None:
    """DESIGN: the ragged layout batches from 4 rows, as the real bucketer does."""
    sim = Sim(RuntimeConfig(layout="ragged", block_size=4, max_model_len=64, max_num_seqs=5, max_num_batched_tokens=8))
    for rid in "ABC":
        sim.add_request([1] * 3, 30, rid)
        sim.step()
    plan = sim.step()
    assert [str(b) for b in plan.buckets] == ["attend(2, 1)", "attend(2, 1)", "attend(1, 1)"]  # n = 5, 4, 3
