"""The runtime under test as the no-compile hunts see it: built once per (config, fault)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from runtime.bucketer import Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder
from runtime.ragged_metadata import RaggedBuilder
from runtime.warmup import Seams, warm_plan
from spyre_verify import faults
from spyre_verify.oracle.derive import Ladders, ladders


@dataclass(frozen=True)
class World:
    """The runtime under test, built once per (config, fault)."""

    config: RuntimeConfig  # after the fault's configure step
    fault: str | None
    seams: Seams
    builder: MetadataBuilder
    warm: frozenset[Bucket]  # the planned warm set: the runtime's answer, judged here
    lad: Ladders  # the oracle's ladders for `config`
    ragged: RaggedBuilder | None = None  # the ragged layout's builder (a ragged config's steps use it)


# Bounded: hits come from the strategy and the property asking for the same config,
# and from shrinking nearby.
@functools.lru_cache(maxsize=1024)
def world(config: RuntimeConfig, fault: str | None = None) -> World:
    seams = Seams()
    if fault is not None:
        config, seams = faults.get(fault).apply(config)
    b = SpyreAttnBucketer(config)  # the runtime's own instance: the system under test
    builder = MetadataBuilder(b)
    ragged = RaggedBuilder(b) if config.ragged else None
    return World(config, fault, seams, builder, frozenset(warm_plan(b, seams)), ladders(config), ragged)
