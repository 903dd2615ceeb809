"""The foreign runtime's parts without tensors: config, ladders, buckets, pool, scheduler, layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from spyre_verify.runtimes.protocol import Settings
from tests.foreign.block_pool import NULL_BLOCK, BlockPool
from tests.foreign.buckets import DECODE, PREFILL, Bucket, Bucketer, exponential, rung_up
from tests.foreign.config import Config, ModelDims
from tests.foreign.faults import FAULTS, Faults
from tests.foreign.layout import lay_out
from tests.foreign.scheduler import Scheduler


def test_ladders_are_exponential_with_the_cap_as_top_rung() -> None:
    assert exponential(1) == (1,)
    assert exponential(4) == (1, 2, 4)
    assert exponential(6) == (1, 2, 4, 6)
    assert exponential(9) == (1, 2, 4, 8, 9)
    assert Bucketer(Config(block_size=4, max_model_len=33, max_num_seqs=3)).ladders() == {
        "batch": (1, 2, 3),
        "blocks": (1, 2, 4, 8, 9),
    }


def test_rung_up_picks_the_next_rung_and_refuses_off_ladder_sizes() -> None:
    ladder = (1, 2, 4, 8)
    assert [rung_up(ladder, n) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    for bad in (0, 9):
        with pytest.raises(ValueError, match=f"size {bad}"):
            rung_up(ladder, bad)


def test_buckets_print_and_key_on_rows_and_the_longest_row() -> None:
    b = Bucketer(Config(block_size=4, max_model_len=32, max_num_seqs=4))
    assert str(Bucket(DECODE, 4, 8)) == "decode(4, 8)"
    assert b.decode_bucket([1, 5, 9]) == Bucket(DECODE, 4, 4)  # 3 rows, 9 tokens = 3 blocks
    assert b.decode_bucket([4]) == Bucket(DECODE, 1, 1)
    assert b.prefill_bucket(17) == Bucket(PREFILL, 1, 8)
    assert b.off_ladder_blocks() == 3


def test_warm_plan_is_every_bucket_once_largest_first() -> None:
    b = Bucketer(Config(block_size=4, max_model_len=32, max_num_seqs=4))
    plan = b.warm_plan()
    assert len(plan) == len(set(plan)) == b.all_buckets() == 3 * 4 + 4
    assert {p for p in plan if p.kernel == PREFILL} == {Bucket(PREFILL, 1, k) for k in (1, 2, 4, 8)}
    sizes = [p.batch * p.blocks for p in plan]
    assert sizes == sorted(sizes, reverse=True) and plan[0] == Bucket(DECODE, 4, 8)
    skipped = set(plan) - set(Bucketer(Config(), skip_top_decode=True).warm_plan())
    assert skipped == {Bucket(DECODE, n, 8) for n in (1, 2, 4)}


BAD_CONFIGS: list[tuple[Callable[[], object], str]] = [
    (lambda: Config(block_size=3), "block_size"),
    (lambda: Config(block_size=32), "block_size"),
    (lambda: Config(block_size=True), "block_size"),
    (lambda: Config(max_model_len=1), "max_model_len"),
    (lambda: Config(max_num_seqs=0), "max_num_seqs"),
    (lambda: Config(num_blocks=8), "num_blocks"),  # one 32-token request needs 8 blocks plus the null block
    (lambda: Config(backend="no-such-backend"), "backend"),
    (lambda: Config(device="nowhere"), "device"),
    (lambda: ModelDims(hidden=30, heads=4), "model.hidden"),
    (lambda: ModelDims(eos_token_id=64), "model.eos_token_id"),
]


@pytest.mark.parametrize(("build", "field"), BAD_CONFIGS, ids=[f for _, f in BAD_CONFIGS])
def test_bad_config_names_the_field(build: Callable[[], object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}="):
        build()


def test_config_from_settings_defaults_the_pool_and_reads_options() -> None:
    base: dict[str, Any] = {"block_size": 4, "max_model_len": 30, "max_num_seqs": 3, "backend": "eager"}
    assert Config.from_settings(Settings(**base)).num_blocks == 3 * 8 + 1
    c = Config.from_settings(Settings(**base, options={"num_blocks": 9, "seed": 5}))
    assert (c.num_blocks, c.model.seed) == (9, 5)
    with pytest.raises(ValueError, match="fault='nope'"):
        Faults.named("nope")
    assert Faults.named("mask-leak") == Faults(mask_leak=True)
    assert set(FAULTS.values()) <= {"dispatch-coverage", "padding-validity", "graph-reuse", "output-equivalence"}


def test_pool_never_hands_out_the_null_block_and_checks_owners() -> None:
    pool = BlockPool(4)
    a = pool.allocate("a", 3)
    assert NULL_BLOCK not in a and not pool.can_allocate(1)
    with pytest.raises(AssertionError, match="owned by a"):
        pool.deallocate("b", a[:1])
    pool.deallocate("a", a)
    assert pool.num_free == 3 and pool.owner == {}


def drive(s: Scheduler, token: int = 1) -> tuple[str, list[str]] | None:
    """One step with a fake model that always answers `token`."""
    plan = s.schedule()
    if plan is None:
        return None
    kind, seqs = plan
    s.postprocess(kind, seqs, [token] * len(seqs))
    return kind, [q.request_id for q in seqs]


def test_scheduler_admits_fifo_one_prefill_a_step_up_to_max_num_seqs() -> None:
    s = Scheduler(Config(max_num_seqs=2), BlockPool(Config(max_num_seqs=2).total_blocks))
    for i in range(3):
        s.add([1, 2, 3], 4, f"r{i}", (), True)
    assert [drive(s) for _ in range(3)] == [("prefill", ["r0"]), ("prefill", ["r1"]), ("decode", ["r0", "r1"])]
    assert [q.request_id for q in s.waiting] == ["r2"]


def test_reservation_holds_a_request_back_until_blocks_return() -> None:
    cfg = Config(num_blocks=9)  # room for one 32-token request
    s = Scheduler(cfg, BlockPool(9))
    s.add([1] * 20, 12, "long", (), True)  # 31 cached positions: all 8 blocks
    s.add([1], 1, "short", (), True)
    assert drive(s) == ("prefill", ["long"])
    assert all(drive(s) == ("decode", ["long"]) for _ in range(11))
    assert s.running == [] and s.pool.num_free == 8
    assert drive(s) == ("prefill", ["short"])


def test_stop_beats_length_and_eos_unless_ignored() -> None:
    s = Scheduler(Config(), BlockPool(Config().total_blocks))
    eos = s.config.model.eos_token_id
    a = s.add([1], 1, "a", (7,), False)
    b = s.add([1], 5, "b", (), True)
    c = s.add([1], 5, "c", (), False)
    for q, token, reason in ((a, 7, "stop"), (b, eos, None), (c, eos, "stop")):
        q.output.append(token)
        assert q.stop_reason(token, eos) == reason


def test_layout_pads_right_with_the_null_block() -> None:
    cfg = Config(max_num_seqs=4)
    s = Scheduler(cfg, BlockPool(cfg.total_blocks))
    s.add([1] * 9, 3, "a", (), True)
    s.add([1] * 2, 3, "b", (), True)
    drive(s), drive(s)
    kind, seqs = s.schedule()  # type: ignore[misc]
    lay = lay_out(kind, seqs, Bucketer(cfg))
    a, b = (q.blocks for q in seqs)
    assert lay.bucket == Bucket(DECODE, 2, 4) and lay.seq_lens == (10, 3)
    assert lay.table == ((*a[:3], 0), (b[0], 0, 0, 0))
    assert lay.slots == ((a[2] * 4 + 1,), (b[0] * 4 + 2,)) and lay.positions == (9, 2)
