"""One real Inductor run: warm a tiny config, serve two requests, match the reference."""

from __future__ import annotations

import pytest
import torch

from runtime.config import RuntimeConfig
from runtime.events import SERVING
from spyre_verify.oracle.reference import generate
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

# Six buckets (decode 1, 2; batched (2, 1) and (2, 2); prefill 4, 8) at ~5 s a graph. The suite's
# one inductor run; keep it on tox's `audit` config: the graphs it compiles into the shared
# inductor cache are the ones the audit env then finds there.
TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="inductor")


@pytest.mark.inductor
def test_inductor_warmup_then_serving_matches_reference() -> None:
    engine = Engine(TINY)
    engine.warmup()
    assert {e.bucket for e in engine.recorder.events} == engine.bucketer.warm_set()
    requests = {"a": ([5, 17, 3], 4), "b": ([9], 3), "c": ([2, 4], 2)}
    with torch.compiler.set_stance("fail_on_recompile"):
        for rid, (prompt, max_tokens) in requests.items():
            engine.add_request(prompt, max_tokens, request_id=rid)
            engine.step()
        engine.run_until_done()
    for rid, (prompt, max_tokens) in requests.items():
        assert engine.outputs[rid] == list(generate(engine.model, prompt, max_tokens).tokens), rid
    for runner in engine.attention.runners.values():
        assert not [c for c in runner.compiles if c.phase == SERVING]
        assert runner.calls == runner.hits
    assert engine.pool.num_free == engine.pool.usable
