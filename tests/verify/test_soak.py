"""`spyre-verify soak` in-process: a short clean soak passes, a live-block-padding soak fails
naming the block and both requests, the time limit bounds a run, bad flags exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from spyre_verify.cli.main import main
from spyre_verify.report import read_json

SHORT = ["soak", "--requests", "60", "--sample", "20", "--integrity-every", "5", "--backend", "eager"]


def soak(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict, str]:
    code = main([*SHORT, "--out", str(tmp_path), *extra])
    err = capsys.readouterr().err
    name = next(p for p in tmp_path.glob("soak*.json"))
    assert name.with_suffix(".md").exists()
    return code, read_json(name), err


def test_short_soak_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, p, err = soak(tmp_path, capsys)
    assert code == 0 and p["verdict"] == "pass" and p["reasons"] == []
    q = p["requests"]
    assert q["planned"] == q["submitted"] == q["accepted"] == q["finished"] == 60
    # Stop tokens and aborts are mixed in; a request aborted while waiting is never admitted.
    assert sum(q["finished_by_reason"].values()) == 60 and list(q["finished_by_reason"]) == ["length", "stop", "abort"]
    assert q["finished_by_reason"]["abort"] > 0 and q["admitted"] <= 60
    assert q["unfinished"] == 0 and q["waited"] > 0
    assert p["violations"]["total"] == 0 and p["blocks"]["leaked"] == 0
    assert p["blocks"]["free_at_end"] == p["blocks"]["usable"] == 7
    assert p["reference"]["sample_size"] == 20 and p["reference"]["tokens_match"] is True
    assert p["kv_integrity"]["checks"] >= p["steps"] // 5 > 0
    assert "warmup: compiling" in err and "soak PASS: 0 violations, 0 leaked blocks, 60/60 finished" in err
    assert f"{q['finished_by_reason']['abort']} abort ({q['aborts_missed']} aborts missed)" in err


def test_live_block_padding_soak_names_the_block_and_both_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, p, err = soak(tmp_path, capsys, "--fault", "live-block-padding")
    assert code == 1 and p["verdict"] == "fail" and p["fault"] == "live-block-padding"
    lp = p["live_padding"]
    assert lp["block"] == 1 and lp["row_request"] != lp["owner"]
    for needle in ("block 1", f"{lp['row_request']}'s row", f"owned by live request {lp['owner']}"):
        assert needle in lp["message"] and needle in err
    assert p["violations"]["by_kind"]["padding-validity/live-padding"] == lp["count"] > 0
    assert p["requests"]["finished"] == 60 and p["blocks"]["leaked"] == 0  # only the padding is wrong


def test_time_limit_stops_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, p, err = soak(tmp_path, capsys, "--time-limit", "1e-9")
    assert code == 1 and p["time_limit_hit"] is True
    assert p["requests"]["submitted"] < 60 and any("time limit" in r for r in p["reasons"])
    assert "fails because: time limit" in err


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--requests", "0"], "--requests=0"),
        (["--sample", "-1"], "--sample=-1"),
        (["--integrity-every", "0"], "--integrity-every=0"),
        (["--time-limit", "nan"], "--time-limit=nan"),
        (["--fault", "no-such-fault"], "unknown fault 'no-such-fault'"),
        (["--requests", "many"], "--requests"),
        (["--block-size", "3"], "block_size=3"),
    ],
)
def test_bad_flags_exit_2(flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["soak", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_tracker_admits_every_request_a_dispatch_computes() -> None:
    """A runtime that prefills two requests in one dispatch admits both: neither one's blocks are a leak."""
    from runtime.bucketer import BATCHED, PREFILL, BatchedKey, Bucket, PrefillKey
    from runtime.events import BatchInfo, DispatchEvent, FinishEvent, RequestEvent
    from spyre_verify.soak.run import Tracker

    t = Tracker()
    for rid in ("a", "b", "c"):
        t.on_request(RequestEvent(rid, (1,), 4))
    both = BatchInfo(("a", "b"), (1, 1), (0, 0), 1)
    t.on_dispatch(DispatchEvent(PREFILL, Bucket(PREFILL, PrefillKey(4)), both, "serving", 0))
    assert t.in_flight == {"a", "b"} and t.admitted == {"a": 0, "b": 0}
    later = BatchInfo(("a", "b", "c"), (2, 2, 1), (0, 0, 1), 2)
    t.on_dispatch(DispatchEvent(BATCHED, Bucket(BATCHED, BatchedKey(4, 1, True, False)), later, "serving", 1))
    t.on_finish(FinishEvent("a", "length", (5,), 1))
    # "c" first computed in step 1 (it waited); "a" and "b" keep the step that admitted them.
    assert t.in_flight == {"b", "c"} and t.admitted == {"a": 0, "b": 0, "c": 1} and t.waited == 1


def test_a_builder_batching_below_the_threshold_fails_the_soak_by_the_batched_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39's probe B1 in soak: a ragged step is judged as a whole, not only by the hunt."""
    ragged = ("--layout", "ragged", "--max-num-seqs", "5", "--max-model-len", "8", "--block-size", "2")
    ragged += ("--fault", "builder-batches-from-two", "--requests", "20")
    code, p, _ = soak(tmp_path, capsys, *ragged)
    assert code == 1 and p["verdict"] == "fail"
    assert p["violations"]["by_kind"].get("dispatch-coverage/batched-rule", 0) > 0, p["violations"]["by_kind"]
