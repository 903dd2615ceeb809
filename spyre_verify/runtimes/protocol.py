"""The runtime protocol: exactly what a runtime offers so that spyre-verify can check it.

A runtime is named by a factory, `module:attr`, called with the harness's `Settings`. What
it returns must satisfy `Runtime` (the core every checker relies on) and may offer optional
capabilities, each listed by name in `runtime.capabilities` with its attributes (`CAPABILITIES`). A
checker names the capabilities it needs (`Checker.needs`); one whose capability is absent
is reported as *not run*, never as passing. Everything here is structural: a runtime never
imports spyre_verify, it only offers the attributes named here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# The kinds of event a runtime emits to observers (`on_<kind>` methods), and when.
EVENTS = {
    "dispatch": "before a step's kernels run: kernel, bucket, batch (request_ids, seq_lens), phase, step",
    "compile": "a kernel compiled a graph: kernel, bucket, phase (warmup or serving), seconds, graph_id",
    "token": "a request got a token: request_id, token, step, logits (a tensor, or None)",
    "request": "a request was accepted: request_id, prompt, max_tokens, stop_token_ids, ignore_eos",
    "finish": "a request ended: request_id, reason (length, stop or abort), tokens, step",
    "step": "a step finished: step, kind, bucket, finished",
    "block_table": "(paging) a step's table: kernel, bucket, step, request_ids, left_pads, seq_lens, tkv, "
    "block_table (one row per padded row), owners (the pool's block -> owner map as the kernels are about to "
    "run: a live read-only view, so no owner is looked up unless a rule asks; read it in the handler, copy it "
    "to keep it), num_blocks, null_block (and, with prefix caching, `holders`: each registered block in use -> "
    "every request holding it; those are read-only and in no request's `owners`, which then lists private "
    "blocks only; a runtime that shares no block may leave it out)",
    "call": "(optional; the bundled runtime, only while someone listens) one call of a compiled kernel: kernel, "
    "bucket, phase; with graph_hit it shows a call no graph served (an eager fallback)",
    "graph_hit": "(optional, as call) a compiled graph served a call: kernel, bucket (the call's), graph_id, "
    "graph_bucket (the bucket the graph was compiled for)",
    "state": "(design_contract) the batch after a step, or after an abort: step (for an abort, the next step's "
    "number), kind (prefill, decode, mixed, idle or abort), admitted (the request this step started to "
    "prefill, or None), tkv (0 on the ragged layout), rows (each running row: request_id, left_pad, blocks "
    "(its real blocks in position order), num_cached, generated, reserved (blocks still promised to it)), "
    "waiting (the queue's ids, live: copy to keep), finished, free_blocks, prefill (ragged: the prompt being "
    "prefilled, its request_id, computed, prompt_len, blocks and reserved, or None); contract-conformance compares it with "
    "its model of the contract after every step",
    "kv_write": "(paging) every KV slot a step writes, one event a step, before its kernels run: step, slots "
    "(block * block_size + offset), writers (the request writing each slot; None for a padding position, which "
    "only a runtime with `padding_sink` may write, and only into that block), owners (as for block_table; "
    "with prefix caching also `holders`, as for block_table: none of those blocks may be written)",
    "cache_hit": "(prefix caching) at admission, before the step's dispatches: step, request_id, blocks (the "
    "leading prompt blocks found in the cache, in order; they join its table, and its first chunk starts at "
    "len(blocks) * block_size), hashes (the runtime's own, never judged)",
    "cache_register": "(prefix caching) at the end of a step, before its finishes: step, request_id, index (the "
    "request's block number: positions index * block_size onward), block (now full, and read-only from here), "
    "hash, parent (the previous block's hash, or None)",
    "cache_evict": "(prefix caching) an allocation took a cached free block back, before the step's dispatches: "
    "step, block, hash",
}

# The optional capabilities and what each offers; `check_runtime` verifies the attributes.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    # Block tables over a pool with a reserved null block: `block_table` and `kv_write` events.
    "paging": ("null_block", "num_blocks"),
    # An unpadded, unpaged eager run of the same model, the judge of output equivalence:
    # `reference(prompt, max_tokens, stop_token_ids=(), ignore_eos=False)` returns its `tokens`,
    # `logits` (one row a token, or empty) and `reason` ("length" or "stop").
    "reference": ("reference",),
    # KV blocks' contents and owners, so the harness can checksum blocks nobody should write:
    # `kv_blocks(blocks)`, every cache tensor (each layer's K and V) indexed by `blocks`, shaped
    # [len(blocks), block_size, ...] (dim 1 the offset within the block; a cache laid out otherwise
    # is permuted to this), and `block_owners()`, every allocated block -> the request owning it.
    "kv_cache": ("kv_blocks", "block_owners"),
    # Calls of compiled kernels through the serving entry point: `preflight_call(bucket)`, one call
    # of a warm bucket on the buffers serving uses (after warmup it must not compile), and
    # `controls()`, calls no warm graph serves, each with `name`, `bucket` and `call()`.
    "control_calls": ("preflight_call", "controls"),
    # The runtime's own compile accounting, compared with the harness's count: `kernel_accounts()`,
    # kernel -> its `calls` (bucket -> calls), `served` ((call's bucket, graph's bucket) -> graph
    # hits) and `compiles` (its compile events).
    "compile_accounting": ("kernel_accounts",),
    # A per-sequence decode kernel beside the batched one, chosen when the harness builds the
    # runtime with `options["batched_decode"] = False`: check's per-sequence pass needs it.
    "per_sequence_decode": (),
    # The runtime schedules as its layout's contract says (CONTRACT.md). A runtime of one's own
    # declares it as data (`contract`, `spyre_verify.runtimes.declared`) and the harness grants this; the
    # bundled runtime claims it with `config` a `runtime.config.RuntimeConfig` and `builder` for
    # probing. The contract checkers, the reachable-set oracle and the coverage traffic need it.
    "design_contract": (),
    # `reservations()`: request id -> blocks the scheduler holds in reserve for it. Liveness then
    # holds every reservation to a live request (`leaked-reservation`).
    "reservations": ("reservations",),
    # `padding_sink`: a block the runtime writes padding positions' KV into on purpose and never
    # reads unmasked (the real plugin's block 0). A `kv_write` writer of None is a padding position;
    # it may land there and nowhere else, and KV integrity leaves that block out.
    "padding_sink": ("padding_sink",),
}

# Optional attributes any runtime may carry, read as data (CONTRACT.md, "Declaring a contract").
DECLARATIONS = {
    "contract": "the contract it follows: layout ('padded' or 'ragged'), block_size, max_model_len, max_num_seqs "
    "and any other value the layout reads, under RuntimeConfig's names (`spyre_verify.runtimes.declared.DECLARABLE`)",
    "layers": "the compiled calls one dispatch makes, one per model layer (graph reuse expects that many hits)",
    "rules": "rule name -> one sentence saying where the runtime departs from CONTRACT.md",
    "refusal": "the ValueError subclass add_request and abort refuse with",
}
# A runtime may also ship its own fault catalog, `faults()`: fault name -> the checker that must
# catch it (`spyre_verify.runtimes` reads it; `check` runs each as a control).

CORE = (
    "name",
    "config",
    "capabilities",
    "steps",
    "finished",
    "subscribe",
    "warm_plan",
    "ladders",
    "warmup",
    "add_request",
    "step",
    "abort",
    "has_work",
    "pool_snapshot",
    "close",
)

# Wraps a Dynamo backend for one kernel: (kernel name, backend) -> backend. The harness counts
# compiles and graph hits with it, so the runtime must compile every kernel through it.
BackendWrapper = Callable[[str, Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class Settings:
    """What the harness asks a factory for. A runtime maps what it understands and ignores the
    rest; `native` is the bundled runtime's full config, built from the CLI's flags and env."""

    block_size: int = 64
    max_model_len: int = 2048
    max_num_seqs: int = 8
    backend: str = "inductor"
    device: str = "cpu"
    wrap_backend: BackendWrapper | None = None
    fault: str | None = None  # one of the runtime's own `faults()`, seeded for a control run
    native: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)


class Bucket(Protocol):
    """A compiled shape: hashable, printable, naming its kernel."""

    @property
    def kernel(self) -> str: ...


class ModelView(Protocol):
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_id(self) -> int: ...


class ConfigView(Protocol):
    """What workloads are drawn from: the sizes every runtime has."""

    @property
    def block_size(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def model(self) -> ModelView: ...


class Finished(Protocol):
    @property
    def tokens(self) -> Sequence[int]: ...
    @property
    def reason(self) -> str: ...


@runtime_checkable
class Runtime(Protocol):
    """The core. A request that can never be served is refused at `add_request` with a
    ValueError naming why, leaving the runtime unchanged; `abort` of an unknown or ended id
    raises ValueError too. A runtime may name a narrower ValueError subclass it refuses with as
    `refusal`, so a ValueError from a bug is not taken for a refusal. Warmup compiles
    `warm_plan()` and nothing else."""

    name: str
    config: ConfigView
    capabilities: frozenset[str]
    steps: int
    finished: Mapping[str, Finished]

    def subscribe(self, observer: Any) -> Callable[[], None]: ...
    def warm_plan(self) -> Sequence[Bucket]: ...
    def ladders(self) -> Mapping[str, tuple[int, ...]]: ...
    def warmup(self, progress: Callable[[int, int, Any], None] | None = None) -> None: ...
    def add_request(
        self,
        prompt_token_ids: object,
        max_tokens: object,
        request_id: object = None,
        *,
        stop_token_ids: object = (),
        ignore_eos: object = False,
    ) -> str: ...
    def step(self) -> Any: ...
    def abort(self, request_id: object) -> Any: ...
    def has_work(self) -> bool: ...
    def pool_snapshot(self) -> object: ...
    def close(self) -> None: ...


Factory = Callable[[Settings], Runtime]


def missing(runtime: object) -> list[str]:
    """What `runtime` lacks of the protocol: core attributes, and those of each capability it claims."""
    out = [name for name in CORE if not hasattr(runtime, name)]
    claimed: object = getattr(runtime, "capabilities", frozenset())
    if not isinstance(claimed, frozenset):
        return [*out, f"capabilities (a frozenset of names, got {type(claimed).__name__})"]
    for cap in sorted(claimed):
        if cap not in CAPABILITIES:
            out.append(f"capability {cap!r} (unknown; known: {', '.join(CAPABILITIES)})")
            continue
        out += [f"{attr} (for {cap})" for attr in CAPABILITIES[cap] if not hasattr(runtime, attr)]
    return out


def layout_of(runtime: Any) -> str:
    """The layout (DESIGN "layout") whose contract a runtime follows: its config's `layout`, and
    padded for a config without one (the layout every runtime had before the ragged one)."""
    return str(getattr(runtime.config, "layout", "padded"))
