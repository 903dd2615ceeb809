"""A declared contract: how any runtime, with types of its own, is held to a layout's rules.

A runtime declares, as plain data, the contract it follows (`contract`: the layout and the
config values that layout reads) and how many compiled calls one dispatch makes (`layers`).
The harness validates the declaration with the rules it applies to its own config
(`runtime.config.validate`) before any work, builds its own config from it, and from then on
sees the runtime through `Declared`: buckets in the contract's plain form, `(kernel, *ints)`
such as `("attend", 1, 1)`, become the oracle's buckets, so a foreign `attend(1, 1)` is the
oracle's `attend(1, 1)`; every contract check runs on it (CONTRACT.md, "Declaring a contract").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spyre_verify.errors import UsageError

# The values a declaration may carry: RuntimeConfig's names for what a layout reads.
SIZES = ("block_size", "max_model_len", "max_num_seqs")
DECLARABLE = (
    "layout",
    *SIZES,
    "num_blocks",
    "kv_buckets",
    "min_batched_seqs",
    "batched_decode",
    "max_batch_tkv_limit",
    "max_num_batched_tokens",
    "batched_decode_entries",
    "query_buckets",
    "enable_prefix_caching",  # ragged: a runtime that shares no cached block declares False
)
LADDERS = ("kv_buckets", "query_buckets")
MODELLED = ("padded", "ragged")  # "none": the layout-free rules only
EVENT_BUCKETS = ("bucket", "graph_bucket")


class DeclarationError(UsageError):
    """A declared contract the harness cannot honour: the CLI refuses it with one line, exit 2."""


def _plain(name: str, value: object) -> object:
    """A declared value as RuntimeConfig takes it: ladders as tuples of ints, everything else as is."""
    if name in LADDERS and isinstance(value, list | tuple):
        return tuple(value)
    return value


def declared_config(declaration: object, model: Any = None) -> Any:
    """The harness's own config for a declaration: `layout` and the sizes required, every other
    key one of `DECLARABLE`, each value held to the rules the harness's own config is held to.
    `model` (vocab, EOS, layers) is the runtime's, for the workloads drawn from it."""
    from runtime.config import ModelDims, RuntimeConfig
    from runtime.errors import ConfigError

    if not isinstance(declaration, Mapping):
        raise DeclarationError(f"contract must be a mapping of config values, got {type(declaration).__name__}")
    unknown = sorted(str(k) for k in declaration if k not in DECLARABLE)
    if unknown:
        raise DeclarationError(f"contract: unknown key {unknown[0]!r}; a contract declares {', '.join(DECLARABLE)}")
    lacking = [k for k in ("layout", *SIZES) if k not in declaration]
    if lacking:
        raise DeclarationError(f"contract: {lacking[0]!r} is missing; declare layout, {', '.join(SIZES)}")
    if declaration["layout"] not in MODELLED:
        raise DeclarationError(
            f"contract: layout={declaration['layout']!r} is not a layout the harness models; declare "
            f"{' or '.join(MODELLED)}, or leave `contract` out (CONTRACT.md, 'Runtimes outside the two layouts')"
        )
    values = {k: _plain(k, v) for k, v in declaration.items()}
    dims = ModelDims() if model is None else _dims(model)
    try:
        return RuntimeConfig(**values, model=dims)  # type: ignore[arg-type]
    except ConfigError as e:  # named by the declaration's key, not by the variable that sets it for the bundled one
        raise DeclarationError(f"contract: {re.sub(r' [(]SPYRE_[A-Z_]+[)]', '', str(e))}") from e
    except TypeError as e:  # a value of a type no rule reads (a ladder given as a string)
        raise DeclarationError(f"contract: {e}") from e


def _dims(model: Any) -> Any:
    from runtime.config import ModelDims

    vocab, eos, layers = model
    return ModelDims(vocab_size=vocab, eos_token_id=eos, num_layers=layers, hidden_size=4, num_heads=1, mlp_size=4)


@functools.lru_cache(maxsize=65536)
def as_bucket(plain: Any) -> Any:
    """The oracle's bucket for a bucket in the contract's plain form: `(kernel, *ints)`, or any
    object with `kernel` and `values()` (the bundled keys' form). A bundled bucket is itself."""
    from runtime.keys import KEY_TYPES, Bucket

    if isinstance(plain, Bucket):
        return plain
    if isinstance(plain, tuple) and plain and isinstance(plain[0], str):
        kernel, fields = plain[0], plain[1:]
    else:
        raise DeclarationError(f"bucket {plain!r} is not in the plain form (kernel, *ints), e.g. ('attend', 1, 1)")
    key_type = KEY_TYPES.get(kernel)
    if key_type is None:
        raise DeclarationError(
            f"bucket {plain!r}: unknown kernel {kernel!r}; the contract's are {', '.join(KEY_TYPES)}"
        )
    try:
        return Bucket(kernel, key_type(*fields))
    except TypeError as e:
        raise DeclarationError(f"bucket {plain!r}: {kernel} takes {key_type.__name__}'s fields: {e}") from e


class PlainEvent:
    """An event as the checkers read it: every field the runtime's, its buckets the oracle's."""

    __slots__ = ("_event",)

    def __init__(self, event: Any) -> None:
        self._event = event

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._event, name)
        if name in EVENT_BUCKETS:
            return as_bucket(value)
        if name == "buckets":
            return tuple(as_bucket(b) for b in value)
        return value

    def __repr__(self) -> str:
        return f"PlainEvent({self._event!r})"


class PlainObserver:
    """An observer as a declared runtime's `subscribe` gets it: the same handlers, plain events."""

    def __init__(self, observer: Any) -> None:
        self.observer = observer

    def __getattr__(self, name: str) -> Callable[[Any], Any]:
        if not name.startswith("on_"):
            raise AttributeError(name)
        handler = getattr(self.observer, name)
        if not callable(handler):  # a handler that declines (None): the bus skips it
            raise AttributeError(name)
        return lambda event: handler(PlainEvent(event))


@dataclass(frozen=True)
class PlainControl:
    control: Any

    @property
    def name(self) -> str:
        return str(self.control.name)

    @property
    def bucket(self) -> Any:
        return as_bucket(self.control.bucket)

    def call(self) -> Any:
        return self.control.call()


@dataclass(frozen=True)
class PlainAccount:
    calls: Mapping[Any, int]
    served: Mapping[tuple[Any, Any], int]
    compiles: list[Any]


def _account(a: Any) -> PlainAccount:
    calls = {as_bucket(b): n for b, n in a.calls.items()}
    served = {(as_bucket(b), as_bucket(g)): n for (b, g), n in a.served.items()}
    return PlainAccount(calls, served, [PlainEvent(e) for e in a.compiles])


class Declared:
    """A runtime that declared its contract, as every checker sees it: `config` is the harness's
    config built from the declaration, `capabilities` gain `design_contract`, and every bucket
    it hands over is the oracle's. Everything else passes through."""

    # The builder probe needs the bundled builder's interface: a runtime's own builder is its own.
    builder = None

    def __init__(self, runtime: Any, config: Any) -> None:
        self._runtime, self.config = runtime, config
        self.reported_config = runtime.config  # the runtime's own, as its reports show it
        self.capabilities = frozenset(runtime.capabilities) | {"design_contract"}
        self.declared_fields = tuple(runtime.contract)
        self._own: dict[Any, Any] = {}  # the oracle's bucket -> the runtime's own, for calls back

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def warm_plan(self) -> list[Any]:
        out = []
        for b in self._runtime.warm_plan():
            self._own[as_bucket(b)] = b
            out.append(as_bucket(b))
        return out

    def subscribe(self, observer: Any) -> Any:
        return self._runtime.subscribe(PlainObserver(observer))

    def preflight_call(self, bucket: Any) -> None:
        if not self._own:
            self.warm_plan()
        self._runtime.preflight_call(self._own.get(bucket, bucket))

    def controls(self) -> list[PlainControl]:
        return [PlainControl(c) for c in self._runtime.controls()]

    def kernel_accounts(self) -> dict[str, PlainAccount]:
        return {k: _account(a) for k, a in self._runtime.kernel_accounts().items()}


def layers_of(runtime: Any) -> int | None:
    """The compiled calls one dispatch makes, as the runtime declares them (`layers`), else None."""
    n = getattr(runtime, "layers", None)
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def declare(runtime: Any, given: str) -> Any:
    """`runtime` as the checkers see it: wrapped in `Declared` when it declares a contract the
    harness models, else itself. A declaration the harness cannot honour, or a claim of
    `design_contract` with no declaration and no config of the harness's type, is refused here,
    at start-up, naming what is wrong (`given`: how the user named the runtime)."""
    from runtime.config import RuntimeConfig

    n = getattr(runtime, "layers", None)
    if (n is not None and layers_of(runtime) is None) or (isinstance(n, int) and n < 1):
        raise DeclarationError(f"{given}: layers={n!r}: declare the compiled calls one dispatch makes, an int >= 1")
    if not hasattr(runtime, "contract"):
        if "design_contract" in runtime.capabilities and not isinstance(runtime.config, RuntimeConfig):
            raise DeclarationError(
                f"{given}: claims design_contract, but its config is a {type(runtime.config).__name__}, not the "
                "harness's RuntimeConfig; declare the contract as data instead (`contract = {'layout': ..., "
                "'block_size': ...}`, CONTRACT.md 'Declaring a contract') and drop design_contract"
            )
        return runtime
    decl = runtime.contract
    if isinstance(decl, Mapping) and decl.get("layout") == "none":
        return runtime  # the layout-free rules only, as for a runtime that declares nothing
    if "design_contract" in runtime.capabilities:
        raise DeclarationError(
            f"{given}: declares a contract and claims design_contract; the harness grants it, drop it"
        )
    model = runtime.config.model
    try:
        config = declared_config(decl, (model.vocab_size, model.eos_token_id, layers_of(runtime) or 1))
    except DeclarationError as e:
        raise DeclarationError(f"{given}: {e}") from e
    return Declared(runtime, config)


def expected_config(harness: Any, runtime: Any) -> Any:
    """The config a run judges a declared runtime by: what the harness asked the factory for (the
    sizes, and every other value its flags or environment set), the declaration for the rest, the
    layout included. A declared value that differs from one asked for is `config-mismatch`
    (contract-conformance), so the harness's own word stands here."""
    from dataclasses import fields, replace

    from runtime.config import RuntimeConfig
    from spyre_verify.oracle.derive import token_budget

    if not isinstance(runtime, Declared):
        return harness
    declared = runtime.config
    same_layout = harness.layout == declared.layout
    defaults = {f.name: f.default for f in fields(RuntimeConfig)}
    asked = {f for f in DECLARABLE if f in SIZES or (same_layout and getattr(harness, f) != defaults[f])}
    asked -= {"layout"}
    if same_layout and declared.ragged:
        asked.add("max_num_batched_tokens")  # the factory was given the budget (`runtimes.settings_for`)
    changes = {f: getattr(declared, f) for f in DECLARABLE if f not in asked}
    if "max_num_batched_tokens" in asked and harness.max_num_batched_tokens is None:
        # DESIGN's default budget, derived: the runtime's own property would make its word the expected value.
        changes["max_num_batched_tokens"] = token_budget(harness)
    return replace(harness, **changes, model=declared.model)
