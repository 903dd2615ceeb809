"""`spyre-verify check` under a binding volumetric limit passes: no decode goes over the limit,
every request (stop tokens and aborts included) equals the reference, coverage is complete,
and the report counts the finishes by reason. The same sizes with the never-binding default
fail: the volume rule had nothing to judge (`not-observed`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spyre_verify.cli.main import main

FLAGS = ["--max-model-len", "16", "--max-num-seqs", "4", "--num-blocks", "17", "--backend", "eager"]


@pytest.mark.parametrize("limit", ["20", None])
def test_check_passes_with_a_binding_limit(
    limit: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--max-batch-tkv-limit", limit] if limit else []
    code = main(["check", *FLAGS, *extra, "--no-controls", "--out", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["tokens_match_reference"] is True
    [volume] = [c for c in report["checks"] if c["name"] == "volume-limit"]
    assert volume["decodes"] > 0 and volume["violations"] == []
    if limit:
        assert code == 0 and report["verdict"] == "pass" and report["not_observed"] == [], report["checks"]
        assert volume["status"] == "pass" and volume["observed"]["could_bind"] is True
    else:  # 4 rows * 16 positions = 64 is all this config allows: the default limit cannot bind
        # Verified as it runs (no limit imposed), and the verdict says the rule was not exercised.
        assert code == 0 and report["verdict"] == "pass" and report["not_observed"] == []
        assert volume["status"] == "pass" and volume["observed"]["could_bind"] is False
        assert (
            err.strip()
            .splitlines()[-1]
            .endswith("volume rule not exercised: its limit 64 cannot bind (give --max-batch-tkv-limit below 64)")
        )
    cov = report["coverage"]
    assert cov["served"] == cov["reachable"] > 0 and not cov["uncovered"]
    by_reason = report["workload"]["finished_by_reason"]
    assert list(by_reason) == ["length", "stop", "abort"] and all(by_reason.values()), by_reason
    if limit:
        assert volume["limit"] == 20 and volume["peak_volume"] <= 20
    else:  # the same traffic without the limit goes over 20: the limit above really bound
        assert volume["limit"] == 64 and volume["peak_volume"] > 20
