"""The kernel figures' plumbing: `--device cuda` (exit 2 without CUDA, kernel figures only
with it), synchronised timing, the bytes the roofline counts, and figure 4's split of its
two timings into per-call cost and kernel work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.config import RuntimeConfig
from runtime.paged_attention import KVCache
from spyre_verify.bench import kernels, timing
from spyre_verify.cli.bench import plan_from_args
from spyre_verify.cli.main import build_parser, main

TOY = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4)


def test_device_cuda_without_cuda_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--tiny", "--device", "cuda", "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "--device cuda: CUDA is not available" in err


def test_device_cuda_runs_the_kernel_figures_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    parse = build_parser().parse_args
    plan = plan_from_args(parse(["bench", "--device", "cuda"]))
    assert (plan.device, plan.only) == ("cuda", ("4", "5"))
    assert plan_from_args(parse(["bench", "--device", "cuda", "--only", "5"])).only == ("5",)
    assert plan_from_args(parse(["bench"])).device == "cpu"
    assert main(["bench", "--device", "cuda", "--only", "1,4", "--out", str(tmp_path)]) == 2


def test_a_timed_region_is_bracketed_by_synchronisation() -> None:
    log: list[str] = []
    timing.per_call(lambda: log.append("call"), 3, lambda: log.append("sync"))
    assert log == ["sync", "call", "call", "call", "sync"]
    assert timing.synchronizer("cuda:0") is torch.cuda.synchronize
    assert timing.synchronizer("cpu") is not torch.cuda.synchronize


def test_the_roofline_counts_the_attended_positions_of_the_real_rows() -> None:
    top = kernels.top_bucket(TOY, seed=3)
    m, bs, rows = TOY.model, TOY.block_size, TOY.max_num_seqs
    rung = top.table.shape[1]
    tkv = rung * bs - 1
    pads = top.left_pads.tolist()
    assert int(top.tkv) == tkv and any(pads)  # some rows start inside their first block
    attended = sum(tkv - lp + 1 for lp in pads)
    assert top.kv_bytes == 2 * attended * m.num_heads * m.head_dim * 4
    assert top.block_bytes == 2 * rows * rung * bs * m.num_heads * m.head_dim * 4 > top.kv_bytes
    top.row_real[1:] = False  # a padded row's blocks are not the kernel's to read
    assert top.kv_bytes == 2 * (tkv - pads[0] + 1) * m.num_heads * m.head_dim * 4


def test_the_figures_drive_the_runtimes_cache_layout() -> None:
    top = kernels.top_bucket(TOY)
    cache = KVCache(TOY)
    assert top.k_cache.shape == cache.k[0].shape and top.v_cache.shape == cache.v[0].shape


def test_split_overhead_recovers_call_cost_and_work() -> None:
    call, work = kernels.split_overhead(batched=120e-6, loop=260e-6, rows=8)
    assert call == pytest.approx(20e-6) and work == pytest.approx(100e-6)
    assert kernels.split_overhead(batched=100e-6, loop=90e-6, rows=8) == (0.0, 100e-6)  # noise: no negative cost
    remedy = kernels._batched_remedy(call, work, 40e-6, 8)
    assert "= 2.17 with work 100 us and call 20 us" in remedy and "work <= 2.5 x call (50 us here)" in remedy
    assert "a plain read of the same KV takes 40 us" in remedy
