"""The finding on the real plugin: `ChunkedPrefillSpyreScheduler` releases a request's reserved
blocks only for ids it sees finish inside `update_from_output`, so an abort between steps leaves
its reservation behind for good. With the adapter's outside fix (`--sendnn-fix
abort-reservation-leak`) the abort releases it."""

from __future__ import annotations

import pytest

from spyre_verify.runtimes import open_runtime
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.sendnn.faults import ABORT_FIX
from tests.sendnn.helpers import SENDNN, SIZES, serve


@pytest.mark.parametrize("fix", [None, ABORT_FIX])
def test_an_aborted_decoding_request_keeps_its_reservation_unless_fixed(fix: str | None) -> None:
    rt = open_runtime(SENDNN, Settings(**SIZES, options={"fix": fix} if fix else {}))
    try:
        rt.warmup()
        sched = rt.scheduler
        assert ("finish_requests" in vars(sched)) == (fix is not None)  # the fix, on this engine only
        idle = rt.pool_snapshot()
        rid = rt.add_request([5 + i for i in range(10)], 150, ignore_eos=True)
        rt.step()
        rt.step()
        assert len(rt.tokens[rid]) == 2  # prefilled, then one decode
        held = rt.reservations().get(rid, 0)
        assert held > 0, "a request with 150 tokens to go reserves blocks for them"
        done = rt.abort(rid)
        assert done.reason == "abort" and rid in rt.finished and not rt.has_work()
        # The next steps run another request: the aborted one's reservation is judged after them.
        other = rt.add_request([7, 8, 9], 3, ignore_eos=True)
        ran = serve(rt)
        assert ran and all(r.kind != "idle" for r in ran) and rt.finished[other].reason == "length"
        if fix is None:
            assert rt.reservations().get(rid) == held
            assert rt.pool_snapshot() != idle and sched.total_reserved_blocks >= held
        else:
            assert rid not in rt.reservations()
            assert rt.pool_snapshot() == idle and sched.total_reserved_blocks == 0
    finally:
        rt.close()
    assert "finish_requests" not in vars(sched) and "update_from_output" not in vars(sched)
