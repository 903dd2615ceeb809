"""Dynamo's limits are process-wide: only an open engine changes them, and closing it puts them back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.events import EventBus
from runtime.limits import COMPILE_HEADROOM
from runtime.paged_attention import PagedAttention

CONFIG = RuntimeConfig(block_size=4, max_model_len=64, max_num_seqs=4, backend="eager")
DYNAMO = torch._dynamo.config


def limits() -> tuple[int, int]:
    return DYNAMO.recompile_limit, DYNAMO.accumulated_recompile_limit


@pytest.fixture(autouse=True)
def dynamo_defaults() -> Iterator[None]:
    """Dynamo's defaults for the test: engines other tests never closed may have raised them."""
    with DYNAMO.patch(recompile_limit=8, accumulated_recompile_limit=256):
        yield


def test_an_open_engine_holds_the_limit_it_needs_and_close_restores_the_global_config() -> None:
    before = limits()
    needed = len(list(SpyreAttnBucketer(CONFIG).candidates())) + COMPILE_HEADROOM
    assert needed > before[0], "the config needs more than Dynamo's default, or the test shows nothing"
    with Engine(CONFIG) as engine:
        assert DYNAMO.recompile_limit == needed
        assert DYNAMO.accumulated_recompile_limit >= 4 * needed
    assert limits() == before
    engine.close()  # closing twice changes nothing
    assert limits() == before


def test_a_configured_limit_applies_only_while_the_engine_is_open() -> None:
    before = limits()
    with Engine(CONFIG.with_(recompile_limit=2)):
        assert DYNAMO.recompile_limit == 2
    assert limits() == before


def test_nested_engines_restore_in_reverse_order() -> None:
    before = limits()
    with Engine(CONFIG), Engine(CONFIG.with_(recompile_limit=3)):
        assert DYNAMO.recompile_limit == 3
    assert limits() == before


def test_building_the_attention_kernels_leaves_dynamo_alone() -> None:
    before = limits()
    PagedAttention(CONFIG, SpyreAttnBucketer(CONFIG), EventBus())
    assert limits() == before
