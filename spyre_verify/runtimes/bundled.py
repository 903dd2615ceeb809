"""The bundled runtime behind the protocol: `runtime.engine.Engine` plus the few answers the
protocol asks for, each read off a public part of the engine. It offers every capability,
`design_contract` included: it is the runtime DESIGN.md describes.

The reference generator is the harness's own (`spyre_verify.oracle.reference`), written from
DESIGN rather than taken from the runtime, so output equivalence stays an independent judge.
It runs on its own model, built from the config's seed when the runtime is built, before
warmup or serving: a serving path that changed the engine's weights or position table in
place would otherwise change the reference with them, and the two would agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runtime.block_pool import NULL_BLOCK
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.errors import RequestError
from runtime.model import TinyTransformer
from runtime.warmup import Seams
from spyre_verify.checks.control_calls import Control, control_calls
from spyre_verify.checks.ragged_controls import ragged_control_calls
from spyre_verify.oracle.reference import ReferenceRun, generate
from spyre_verify.runtimes.protocol import CAPABILITIES, Settings


class BundledRuntime(Engine):
    name = "bundled"
    # Every capability but the real plugin's two: its pool has no padding sink, and its reservations
    # are judged by the contract's own model (contract-conformance).
    capabilities = frozenset(CAPABILITIES) - {"reservations", "padding_sink"}
    refusal = RequestError  # what it raises to refuse; any other ValueError is a bug, not a refusal

    def __init__(self, config: RuntimeConfig, *args: Any, **kwargs: Any) -> None:
        # Built first and from the seed, never copied from the engine's model: shares no tensor with it.
        self.reference_model = TinyTransformer(config)
        super().__init__(config, *args, **kwargs)

    @property
    def null_block(self) -> int:
        return NULL_BLOCK  # the block the pool reserves; the builder's padding is what gets judged

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def warm_plan(self) -> list[Any]:
        return self.recorder.plan()

    def ladders(self) -> dict[str, tuple[int, ...]]:
        return self.bucketer.ladders()

    def pool_snapshot(self) -> object:
        return self.scheduler.snapshot()

    def reference(
        self, prompt: Sequence[int], max_tokens: int, stop_token_ids: Sequence[int] = (), ignore_eos: bool = False
    ) -> ReferenceRun:
        return generate(self.reference_model, list(prompt), max_tokens, stop_token_ids, ignore_eos)

    def kv_blocks(self, blocks: Sequence[int]) -> list[Any]:
        import torch

        cache = self.attention.cache
        idx = torch.tensor(list(blocks), dtype=torch.long, device=cache.k[0].device)
        return cache.read(idx)  # slot-major [n, block_size, heads, head_dim], whatever the storage layout

    def block_owners(self) -> Mapping[int, str]:
        return self.pool.allocated()

    def preflight_call(self, bucket: Any) -> None:
        self.attention.call(bucket, self.attention.args_for(bucket))

    def controls(self) -> list[Control]:
        # Each layout's controls travel its own serving entry point.
        return ragged_control_calls(self) if self.config.ragged else control_calls(self)

    def kernel_accounts(self) -> Mapping[str, Any]:
        return self.attention.runners


def make(settings: Settings) -> BundledRuntime:
    """The factory: `settings.native` is the full RuntimeConfig (the CLI builds it from flags and
    env), else one is built from the generic sizes; `options["seams"]` is a warmup-recipe fault."""
    config = settings.native
    if not isinstance(config, RuntimeConfig):
        config = RuntimeConfig.from_env(
            None,
            block_size=settings.block_size,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            backend=settings.backend,
            device=settings.device,
        )
    seams = settings.options.get("seams", Seams())
    return BundledRuntime(config, seams, wrap_backend=settings.wrap_backend)
