"""Ladder agreement, by behaviour: the ladders each component actually uses equal the oracle's.

A component's ladder is what it does, not what it reports. The metadata builder is
probed over every batch shape the config allows (decode at every tkv with every row
count, prefill at every length) and its ladder is read off the buckets it picks; each
pick is also compared with the oracle's key for that shape. Warmup's ladder is read
off the compile events the backend saw. Both are compared with the ladders
`spyre_verify.oracle.derive` computes from the config: a builder that rounds with an
inline ladder of its own is caught whether or not it goes through a seam.

`probe_builder` and `warm_disagreements` are shared with the hunt's ladders property.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from runtime.bucketer import Bucket, ChunkedKey
from runtime.config import RuntimeConfig
from runtime.events import SERVING, CompileEvent
from runtime.metadata import MetadataBuilder, SeqState
from spyre_verify.checks.disagreement import Disagreement, Shape, rungs_of
from spyre_verify.checks.ragged_probe import probe_ragged
from spyre_verify.checks.violations import Checker
from spyre_verify.oracle.derive import Ladders, ceil_div, chunked_key, decode_key, ladders, prefill_key

DIMENSIONS = ("kv_blocks", "num_seqs", "prefill_tokens")


def describe(shape: Shape) -> str:
    kind, a, b = shape
    return (
        f"a prefill with the batch at position {a} (tkv {a})"
        if kind == "prefill"
        else f"a decode of {a} row{'s' * (a != 1)} writing position {b} (tkv {b})"
    )


# -- the builder, probed ---------------------------------------------------------------------------
def probe_shapes(config: RuntimeConfig) -> Iterator[Shape]:
    """Every batch shape the config allows: prefill at every length, decode at every tkv and row count."""
    for tkv in range(1, config.max_model_len + 1):
        yield ("prefill", tkv, 0)
    for tkv in range(config.max_model_len):
        for rows in range(1, config.max_num_seqs + 1):
            yield ("decode", rows, tkv)


@functools.lru_cache(maxsize=8192)  # a few hundred distinct rows serve every config (SeqState is frozen)
def _row(i: int, bs: int, tkv: int) -> SeqState:
    # A row that ends at tkv. Even rows have all but their last block padded, odd rows
    # no padding: rounding that reads cached lengths instead of tkv shows either way.
    lp = max(tkv - 1, 0) // bs * bs if i % 2 == 0 else 0
    blocks = tkv // bs - lp // bs + 1
    return SeqState(f"probe-{i}", tuple(range(1, blocks + 1)), tkv - lp, lp)


def build(builder: MetadataBuilder, bs: int, shape: Shape, rows: list[SeqState] | None = None) -> Bucket:
    """The bucket the builder picks for one synthetic batch of `shape` (no pool, no tensors);
    `rows`, when given, are the decode rows at that tkv (at least as many as the shape has)."""
    kind, a, b = shape
    if kind == "prefill":
        return builder.build_prefill(SeqState("probe-0", tuple(range(1, ceil_div(a, bs) + 1)), a, 0), a).bucket
    rows = rows if rows is not None else [_row(i, bs, b) for i in range(a)]
    return builder.build_decode(rows[:a], b).bucket


def expected(lad: Ladders, shape: Shape) -> Bucket | None:
    kind, a, b = shape
    return prefill_key(lad, a) if kind == "prefill" else decode_key(lad, a, b)


def probe_builder(builder: MetadataBuilder, config: RuntimeConfig) -> list[Disagreement]:
    """Probe every shape; the builder's ladders (rungs it picks) and keys against the oracle's.
    A ragged config's builder is probed by `checks.ragged_probe`."""
    lad = ladders(config)
    if lad.ragged:
        return probe_ragged(builder, config)
    seen: dict[str, dict[int, tuple[Shape, Bucket]]] = {d: {} for d in DIMENSIONS}
    mismatches: list[tuple[Shape, Bucket, Bucket | None]] = []
    bs, at = config.block_size, -1
    rows: list[SeqState] = []
    picked: set[Bucket] = set()  # buckets whose rungs are in `seen`: the first shape of a rung stays
    for shape in probe_shapes(config):
        if shape[0] == "decode" and shape[2] != at:  # the rows of one tkv serve every row count
            at = shape[2]
            rows = [_row(i, bs, at) for i in range(config.max_num_seqs)]
        try:
            got = build(builder, bs, shape, rows)
        except Exception as e:  # a builder that cannot build a valid shape is itself a finding
            msg = f"the builder failed on {describe(shape)}: {type(e).__name__}: {e}"
            return [Disagreement("builder-error", "builder", "bucket key", msg, expected(lad, shape), shape)]
        if got not in picked:
            picked.add(got)
            for dim, r in rungs_of(got).items():
                seen[dim].setdefault(r, (shape, got))
        want = expected(lad, shape)
        if got != want:
            mismatches.append((shape, got, want))
    out = []
    truth = lad.as_dict()
    for dim in DIMENSIONS:
        mine = tuple(sorted(seen[dim]))
        if mine != truth[dim]:
            out.append(_builder_divergence(lad, dim, mine, truth[dim], seen[dim]))
    if mismatches and not out:
        shape, got, want = mismatches[0]
        msg = (
            f"the builder dispatched {got} for {describe(shape)}, where the oracle's key is {want} "
            f"({len(mismatches)} probed shapes differ); its ladders agree, so its rounding is wrong"
        )
        out.append(Disagreement("key-mismatch", "builder", "bucket key", msg, got, shape))
    return out


def _builder_divergence(
    lad: Ladders, dim: str, mine: tuple[int, ...], truth: tuple[int, ...], seen: dict[int, tuple[Shape, Bucket]]
) -> Disagreement:
    only, lacks = sorted(set(mine) - set(truth)), sorted(set(truth) - set(mine))
    got: Bucket | None
    if only:
        shape, got = seen[only[0]]
        show = f"{describe(shape)} dispatched {got}, where the oracle's key is {expected(lad, shape)}"
    else:
        shape = _shape_on(lad, dim, lacks[0])
        show = f"the oracle's key for {describe(shape)} is {expected(lad, shape)}, a rung the builder never picks"
        got = expected(lad, shape)
    msg = (
        f"the builder's {dim} ladder {list(mine)} differs from the oracle's {list(truth)}: "
        f"rungs only the builder has {only}, rungs it lacks {lacks}; e.g. {show}"
    )
    return Disagreement("ladder-divergence", "builder", dim, msg, got, shape)


def _shape_on(lad: Ladders, dim: str, rung: int) -> Shape:
    """The smallest shape whose oracle key sits on `rung` of `dim`."""
    if dim == "prefill_tokens":
        return ("prefill", rung, 0)
    if dim == "num_seqs":
        return ("decode", rung, 0)
    return ("decode", 1, (rung - 1) * lad.block_size)


class Counted:
    """A builder whose build calls are counted: ladder agreement reports the shapes it probed, not
    the shapes it planned to (a probe that stopped at a builder error probed fewer)."""

    BUILDS = ("build_prefill", "build_decode", "build_attend", "build_chunked", "build_step")

    def __init__(self, builder: Any) -> None:
        self._builder, self.built = builder, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._builder, name)
        if name not in self.BUILDS:
            return attr

        def build(*args: Any, **kwargs: Any) -> Any:
            self.built += 1
            return attr(*args, **kwargs)

        return build


# -- warmup, from the compile events ---------------------------------------------------------------
def warm_disagreements(warm: Iterable[Bucket], config: RuntimeConfig, source: str) -> list[Disagreement]:
    """Every bucket warmup compiled sits on the oracle's ladders.

    Rungs warmup lacks are named but not flagged here: a rung no batch state reaches
    is rightly never compiled, and warmup-exactness judges which are missing.
    """
    lad = ladders(config)
    truth = lad.as_dict()
    seen: dict[str, dict[int, Bucket]] = {d: {} for d in truth}
    for b in sorted(warm):
        for dim, r in rungs_of(b).items():
            seen.setdefault(dim, {}).setdefault(r, b)
    off = (_off_chunked(lad, b, source) for b in sorted(warm) if isinstance(b.key, ChunkedKey))
    out = [d for d in off if d is not None]
    for dim in truth:
        mine = tuple(sorted(seen[dim]))
        only = sorted(set(mine) - set(truth[dim]))
        if only:
            lacks = sorted(set(truth[dim]) - set(mine))
            b = seen[dim][only[0]]
            msg = (
                f"warmup's {dim} ladder {list(mine)} ({source}) is not on the oracle's {list(truth[dim])}: "
                f"rungs only warmup has {only}, rungs it lacks {lacks}; e.g. it compiled {b}"
            )
            out.append(Disagreement("ladder-divergence", "warmup", dim, msg, b))
    return out


def _off_chunked(lad: Ladders, b: Bucket, source: str) -> Disagreement | None:
    """A chunked key warmup compiled that no (num_seqs rung, KV rung) pair of the oracle's gives."""
    keys = {chunked_key(lad, n, kv) for n in lad.num_seqs for kv in lad.kv_blocks}
    if b in keys:
        return None
    msg = f"warmup compiled {b} ({source}), a chunked key no pair of the oracle's num_seqs and kv_blocks rungs gives"
    return Disagreement("ladder-divergence", "warmup", "chunked shape", msg, b)


class LadderAgreement(Checker):
    name = "ladder-agreement"
    needs = frozenset({"design_contract"})
    judged_by: tuple[str, ...] = ("probed_shapes", "warmup_compiles")

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        self.compiled: set[Bucket] = set()
        self.probed = 0  # batch shapes the builder was probed with

    def attach(self, engine: Any) -> None:
        super().attach(engine)
        # The probe needs no tensors, so it runs before warmup, on the builder serving will use.
        c = engine.config
        # A declared runtime need not offer the bundled builder's interface: without it, its ladders
        # are read off what warmup compiles, and each served key is dispatch-coverage's `wrong-key`.
        builder = getattr(engine, "builder", None)
        if builder is None:
            self.judged_by = ("warmup_compiles",)
            return
        counted = Counted(builder)
        found = probe_builder(counted, c)  # type: ignore[arg-type]  # the builder, its builds counted
        self.probed = counted.built
        for d in found:
            self._flag(d)

    def on_compile(self, ev: CompileEvent) -> None:
        if ev.phase != SERVING:
            self.compiled.add(ev.bucket)

    def finish(self, engine: Any) -> None:
        for d in warm_disagreements(self.compiled, engine.config, "from the compile events"):
            self._flag(d)

    def observed(self) -> dict[str, Any]:
        return {"probed_shapes": self.probed, "warmup_compiles": len(self.compiled)}

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "stats": self.observed()}

    def _flag(self, d: Disagreement) -> None:
        kernel = d.bucket.kernel if d.bucket is not None else None
        batch = d.batch or (describe(d.shape) if d.shape is not None else None)
        self.flag(d.kind, d.message, kernel=kernel, bucket=str(d.bucket) if d.bucket else None, batch=batch)
