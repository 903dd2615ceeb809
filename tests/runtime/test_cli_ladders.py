"""`spyre-verify ladders`: the JSON payload, and config rejections as exit 2 with one stderr line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spyre_verify.cli.main import main

ENV_VARS = ("SPYRE_ATTN_KV_BUCKETS", "SPYRE_BATCHED_DECODE", "SPYRE_DYNAMO_BACKEND")
ACCEPTANCE = ["ladders", "--block-size", "64", "--max-model-len", "2048", "--max-num-seqs", "8"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


def test_acceptance_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    payload = run_json(capsys, [*ACCEPTANCE, "--json"])
    assert {"kv_blocks", "num_seqs", "prefill_tokens", "num_blocks", "usable_blocks", "buckets"} <= set(payload)
    assert payload["kv_blocks"] == [1, 2, 4, 8, 16, 32]
    assert payload["num_seqs"] == [2, 4, 8]
    assert payload["prefill_tokens"] == [64 * t for t in range(1, 33)]
    assert (payload["num_blocks"], payload["usable_blocks"]) == (257, 256)
    buckets = payload["buckets"]
    assert isinstance(buckets, dict) and set(buckets) == {"decode", "batched", "prefill"}
    assert buckets["decode"] == [[1], [2], [4], [8], [16], [32]]
    assert [len(buckets[k]) for k in ("decode", "batched", "prefill")] == [6, 30, 32]
    assert [2, 1, False, True] in buckets["batched"] and [2, 1, True, False] not in buckets["batched"]


def test_json_honours_kv_override_env(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPYRE_ATTN_KV_BUCKETS", "128,2048")
    payload = run_json(capsys, [*ACCEPTANCE, "--json"])
    assert payload["kv_blocks"] == [2, 32]
    assert payload["env_overrides"] == {"SPYRE_ATTN_KV_BUCKETS": "128,2048"}
    assert {tuple(k) for k in payload["buckets"]["decode"]} == {(2,), (32,)}


def test_json_pool_override(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["ladders", "--block-size", "64", "--max-model-len", "256", "--max-num-seqs", "4", "--num-blocks", "6"]
    payload = run_json(capsys, [*argv, "--json"])
    assert (payload["num_blocks"], payload["usable_blocks"]) == (6, 5)
    assert [4, 4, False, True] not in payload["buckets"]["batched"]
    assert any(p["key"] == [4, 4, False, True] and "pool" in p["reason"] for p in payload["pruned"])


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ACCEPTANCE) == 0
    out = capsys.readouterr().out
    assert "kv_blocks: [1, 2, 4, 8, 16, 32]" in out and "num_seqs: [2, 4, 8]" in out


def assert_rejected(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    assert lines[0].startswith("spyre-verify ladders: error: ")
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


def test_bad_block_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert_rejected(capsys, ["ladders", "--block-size", "48"], "block_size=48", "power of two")


def test_zero_block_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert_rejected(capsys, ["ladders", "--block-size", "0"], "block_size=0", "positive")


def test_too_small_num_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    assert_rejected(capsys, [*ACCEPTANCE, "--num-blocks", "10"], "num_blocks=10", "need at least 33")


def test_non_integer_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert_rejected(capsys, ["ladders", "--max-model-len", "2k"], "--max-model-len='2k'", "integer")


def test_bad_kv_buckets_env(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPYRE_ATTN_KV_BUCKETS", "64,abc")
    assert_rejected(capsys, [*ACCEPTANCE, "--json"], "SPYRE_ATTN_KV_BUCKETS", "'abc'", "not an integer")


def test_kv_buckets_env_not_covering_max_model_len(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPYRE_ATTN_KV_BUCKETS", "64,1024")
    assert_rejected(capsys, ACCEPTANCE, "SPYRE_ATTN_KV_BUCKETS", "does not cover max_model_len=2048")


def test_unknown_backend_env(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPYRE_DYNAMO_BACKEND", "tvm")
    assert_rejected(capsys, ACCEPTANCE, "SPYRE_DYNAMO_BACKEND='tvm'", "unknown backend")


def test_unknown_backend_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert_rejected(capsys, [*ACCEPTANCE, "--backend", "tvm"], "--backend", "invalid choice: 'tvm'", "inductor")


def test_bad_batched_decode_env(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPYRE_BATCHED_DECODE", "yes")
    assert_rejected(capsys, ACCEPTANCE, "SPYRE_BATCHED_DECODE='yes'", "0 or 1")


def test_unknown_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert_rejected(capsys, ["ladders", "--blocksize", "64"], "unrecognized arguments")


def test_console_script_rejection() -> None:
    # Next to this interpreter, or on PATH (tox's light envs borrow the shared env's bin).
    found = Path(sys.executable).with_name("spyre-verify")
    script = found if found.exists() else Path(shutil.which("spyre-verify") or "spyre-verify")
    assert script.exists(), "the spyre-verify console script is not installed"
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    proc = subprocess.run(
        [str(script), "ladders", "--block-size", "3"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert "block_size=3" in proc.stderr and "power of two" in proc.stderr


@pytest.mark.parametrize("layout", ["padded", "ragged"])
def test_production_sizes_are_judged_exact_by_the_closed_form(capsys: pytest.CaptureFixture[str], layout: str) -> None:
    argv = ["ladders", "--layout", layout, "--block-size", "64", "--max-model-len", "32768", "--max-num-seqs", "64"]
    payload = run_json(capsys, [*argv, *(["--max-num-batched-tokens", "2048"] if layout == "ragged" else []), "--json"])
    exact = payload["exactness"]
    assert isinstance(exact, dict) and exact["exact"] is True and exact["method"] == "exact (closed form)"
    assert exact["reachable"] == exact["warm"] == sum(payload["counts"].values()) > 80  # type: ignore[union-attr]


def test_a_warm_set_missing_a_reachable_bucket_exits_1_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.bucketer import SpyreAttnBucketer

    real = SpyreAttnBucketer.warm_set
    monkeypatch.setattr(
        SpyreAttnBucketer, "warm_set", lambda self: frozenset(b for b in real(self) if str(b) != "decode(4,)")
    )
    assert main(ACCEPTANCE) == 1
    out = capsys.readouterr().out.splitlines()[-1]
    assert (
        out.strip() == "exactness: warm set != reachable set (exact (closed form)): missing ['decode(4,)'], extra none"
    )
