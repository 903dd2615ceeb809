"""The contract model's endings and volume rule, written from DESIGN: `abort` (waiting or
running; the reservation returns and the strip applies at once), `step(stopped=...)`
(a row the caller names ends after its token), and the projected-peak admission."""

from __future__ import annotations

import pytest

from runtime.config import RuntimeConfig
from spyre_verify.oracle.model import ContractModel

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=17, backend="eager")


def model(**changes: object) -> ContractModel:
    return ContractModel(CONFIG.with_(**changes))


def test_abort_of_a_waiting_request_leaves_the_queue_and_nothing_else() -> None:
    m = model()
    m.add("a", 3, 5)
    m.add("b", 2, 5)
    m.step()  # a prefills
    s = m.abort("b")
    assert (s.kind, s.finished, s.rules) == ("abort", ("b",), ("abort",))
    assert [w.request_id for w in m.waiting] == [] and [r.request_id for r in m.rows] == ["a"]
    assert m.reserved == 2 and m.tkv == 4


def test_abort_right_after_a_joiners_prefill_strips_at_once() -> None:
    m = model()
    m.add("a", 3, 8)
    m.add("b", 6, 3)
    m.step()  # a alone at tkv 4 (lp 1)
    m.step()  # b joins: shift 4 -> tkv 8, a has lp 5, b lp 2
    assert m.last.rules == ("shift", "admission") and m.tkv == 8
    s = m.abort("a")
    # b alone has lp 2 < one block: nothing to strip; a's whole reservation returns.
    assert (s.finished, s.strip, m.tkv) == (("a",), 0, 8)
    assert m.reserved == m.rows[0].reservation
    m2 = model()
    m2.add("a", 6, 3)
    m2.add("b", 1, 4)
    m2.step()  # a at tkv 8 (lp 2)
    m2.step()  # b joins at tkv 8 with lp 7
    s = m2.abort("a")  # b alone: one whole padding block stripped right away
    assert (s.strip, s.rules, m2.tkv, m2.rows[0].left_pad) == (1, ("abort", "strip"), 4, 3)


def test_aborting_the_last_row_empties_the_batch_to_tkv_zero() -> None:
    m = model()
    m.add("a", 5, 4)
    m.step()
    m.abort("a")
    assert (m.tkv, m.rows, m.reserved, m.has_work()) == (0, [], 0, False)


def test_abort_of_an_unknown_or_ended_request_is_refused_and_changes_nothing() -> None:
    m = model()
    m.add("a", 1, 1)
    m.step()  # a finishes at its prefill
    assert m.abort_refusal("a") == "it has ended" and m.abort_refusal("zz") == "no such request (or it ended long ago)"
    before = (m.tkv, list(m.rows), list(m.waiting), m.reserved, m.last)
    with pytest.raises(LookupError, match="cannot abort 'zz': no such request"):
        m.abort("zz")
    assert (m.tkv, list(m.rows), list(m.waiting), m.reserved, m.last) == before


def test_a_stopped_row_ends_after_its_token_and_only_a_row_that_stepped_can_stop() -> None:
    m = model()
    m.add("a", 2, 6)
    m.add("b", 2, 6)
    m.step()  # a prefills
    s = m.step(stopped={"a"})  # b's prefill: a generated nothing, so it cannot stop here
    assert s.admitted == "b" and s.finished == ()
    s = m.step(stopped={"a"})  # a decode: both rows generate; a's token was a stop token
    assert (s.finished, s.rules) == (("a",), ("decode", "stop"))
    assert [r.request_id for r in m.rows] == ["b"] and m.reserved == m.rows[0].reservation
    s = m.step(stopped=["b"])  # the last row stops: the batch empties
    assert (s.finished, m.tkv) == (("b",), 0)


def test_a_joiner_stopping_on_its_first_token_ends_at_its_prefill() -> None:
    m = model()
    m.add("a", 3, 5)
    s = m.step(stopped=("a",))
    assert (s.kind, s.finished, m.rows, m.tkv) == ("prefill", ("a",), [], 0)


def test_volume_refuses_admission_when_the_projected_peak_exceeds_the_limit() -> None:
    # a: prompt 4, 8 tokens, so 7 decodes; b: prompt 4, 5 tokens, 4 decodes, both at tkv 4:
    # peak = max(2 * (4 + 4), 1 * (4 + 7)) = 16.
    for limit, joins in ((16, True), (15, False)):
        m = model(max_batch_tkv_limit=limit)
        m.add("a", 4, 8)
        m.add("b", 4, 5)
        m.step()
        assert (m.step().admitted == "b") is joins, limit
    assert model(max_batch_tkv_limit=11).reject_reason(4, 8) is None  # alone: 4 + 7 = 11
    assert "exceeds max_batch_tkv_limit=10" in (model(max_batch_tkv_limit=10).reject_reason(4, 8) or "")
    assert model(max_batch_tkv_limit=1).reject_reason(4, 1) is None  # one token: no decode step at all


def test_a_long_run_keeps_only_live_requests_and_the_last_ended_ids() -> None:
    from spyre_verify.oracle.model import RECENT

    m = ContractModel(CONFIG)
    for i in range(RECENT + 10):
        m.add(f"r{i}", 1, 1)  # a one-token request ends at its prefill
        assert m.step().finished == (f"r{i}",)
    assert m.known == {} and len(m.ended) == RECENT and m.added == RECENT + 10
    assert m.abort_refusal(f"r{RECENT + 9}") == "it has ended"
    assert m.abort_refusal("r0") == "no such request (or it ended long ago)"
