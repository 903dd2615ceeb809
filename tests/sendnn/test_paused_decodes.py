"""The second finding on the real plugin: below a batch-tkv limit of max_model_len x max_num_seqs,
`ChunkedPrefillSpyreScheduler` pauses the decodes that do not fit, moving them out of `running`,
and vLLM's `get_num_unfinished_requests` counts only running and waiting. Once every unfinished
request is paused the engine says it has no work, so a server never steps them again; liveness
names them as soon as the serve loop finds it idle. With the adapter's outside fix (`--sendnn-fix
paused-decodes-unfinished`) they count as work, and every request ends."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spyre_verify.checks.liveness import Liveness
from spyre_verify.runtimes import open_runtime
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.sendnn.faults import PAUSED_FIX
from spyre_verify.serving.serve_loop import DRAINED, idles_judged_by, serve
from spyre_verify.serving.workload import Arrival
from tests.sendnn.helpers import SENDNN, SIZES

# Two rows fit the limit only while both are within one block (tkv <= 128 of max_model_len 256),
# so the third request's decodes pause beside the second's. What the protocol hunt shrank it to.
TIGHT = SimpleNamespace(max_batch_tkv_limit=256)
THREE = [Arrival(0, tuple(5 + (i + j) % 400 for j in range(64)), 192, ignore_eos=True) for i in range(3)]


@pytest.mark.parametrize("fix", [None, PAUSED_FIX])
def test_paused_decodes_are_left_unfinished_on_an_idle_engine_unless_fixed(fix: str | None) -> None:
    rt = open_runtime(SENDNN, Settings(**SIZES, native=TIGHT, options={"fix": fix} if fix else {}))
    try:
        rt.warmup()
        sched = rt.scheduler
        assert ("get_num_unfinished_requests" in vars(sched)) == (fix is not None)  # the fix, on this engine only
        liveness = Liveness()
        liveness.attach(rt)
        stats = serve(rt, THREE, on_rejected=None, on_idle=idles_judged_by([liveness]), max_steps=2_000)
        assert stats.stopped is DRAINED and stats.accepted == 3, stats
        unfinished = sorted(set(rt.tokens) - set(rt.finished))
        if fix is None:
            assert unfinished and [r.request_id for r in sched.paused_decoding_requests] == unfinished
            assert [v.kind for v in liveness.violations] == ["never-ended"], liveness.violations
            assert f"had not ended: {', '.join(unfinished)}" in liveness.violations[0].message
        else:
            assert not unfinished and not sched.paused_decoding_requests and liveness.ok, liveness.violations
            assert all(len(f.tokens) == 192 for f in rt.finished.values())
    finally:
        rt.close()
    assert "get_num_unfinished_requests" not in vars(sched)
