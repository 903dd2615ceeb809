"""Each fault of the catalog visibly changes what its checker judges, shown here directly (no
spyre-verify checker): a serving dispatch warmup never compiled, a padded table entry that is
not the null block, a graph serving another bucket's calls, tokens unlike the reference's."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch

from spyre_verify.runtimes.protocol import Settings
from tests.foreign.buckets import DECODE
from tests.foreign.conftest import Req, serve, workload
from tests.foreign.engine import ForeignEngine, make
from tests.foreign.faults import FAULTS

TINY: dict[str, Any] = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}


def faulty(name: str) -> ForeignEngine:
    return make(Settings(**TINY, fault=name))


def test_the_catalog_is_offered_and_unknown_faults_refused() -> None:
    with faulty("mask-leak") as e:
        assert e.faults() == FAULTS and len(FAULTS) >= 3
    with pytest.raises(ValueError, match="not one of this runtime's faults"):
        faulty("no-such-fault")


def test_skip_top_decode_dispatches_to_a_bucket_warmup_never_compiled() -> None:
    with faulty("skip-top-decode") as e:
        e.warmup()
        assert max(b.blocks for b in e.warm_plan() if b.kernel == DECODE) == 2 < e.ladders()["blocks"][-1]
        rec = serve(e, [Req([1] * 10, 5)]).rec.events
        late = {c.bucket for c in rec["compile"]}
        assert late and all(c.phase == "serving" and c.bucket.blocks == 4 for c in rec["compile"])
        assert late <= {d.bucket for d in rec["dispatch"]} and not late & set(e.warm_plan())


def test_stale_padding_leaves_earlier_blocks_in_padded_entries() -> None:
    with faulty("stale-padding") as e:
        # The long request's rows fill the table; the short ones that follow leave its blocks behind.
        rec = serve(e, [Req([1] * 12, 4), Req([2] * 2, 8), Req([3], 3)]).rec.events
        stale = [
            (t.step, b)
            for t in rec["block_table"]
            for i, row in enumerate(t.block_table)
            for b in row[math.ceil(t.seq_lens[i] / 4) if i < len(t.request_ids) else 0 :]
            if b != t.null_block
        ]
        assert stale, "every padded entry was the null block"


def test_dynamic_shapes_serves_buckets_with_another_buckets_graph() -> None:
    with faulty("dynamic-shapes") as e:
        e.warmup()
        graphs = Counter(c.bucket for acct in e.kernel_accounts().values() for c in acct.compiles)
        assert set(graphs) < set(e.warm_plan()), "a dynamic graph covers some warm buckets"
        serve(e, workload(seed=1, n=4, max_model_len=16))
        foreign = [(a, g) for acct in e.kernel_accounts().values() for a, g in acct.served if a != g]
        assert foreign


def test_mask_leak_changes_tokens_and_logits() -> None:
    with faulty("mask-leak") as e:
        served = serve(e, workload(seed=1, n=6, max_model_len=16))
        tokens, diff = 0, 0.0
        for rid, r in served.ids.items():
            ref = e.reference(r.prompt, r.max_tokens, r.stop_token_ids, r.ignore_eos)
            tokens += e.finished[rid].tokens != ref.tokens
            rows = [t.logits for t in served.rec.events["token"] if t.request_id == rid]
            n = min(len(rows), len(ref.logits))
            diff = max(diff, float((torch.stack(rows[:n]) - torch.stack(list(ref.logits[:n]))).abs().max()))
        assert tokens >= 1 and diff > 1e-3
