"""Bucket keys: what each kernel is keyed on, in both layouts (DESIGN "bucket")."""

from __future__ import annotations

from dataclasses import astuple, dataclass, field

DECODE = "decode"
BATCHED = "batched"
PREFILL = "prefill"
ATTEND = "attend"  # ragged: the per-sequence kernel, decodes and prefill chunks alike
CHUNKED = "chunked"  # ragged: the batched decode kernel, its blocks walked in chunks
PADDED_KERNELS = (DECODE, BATCHED, PREFILL)
RAGGED_KERNELS = (ATTEND, CHUNKED)
KERNELS = PADDED_KERNELS + RAGGED_KERNELS


class _Key:
    """A bucket key prints as the tuple of its fields, as reports and messages always showed it."""

    def __str__(self) -> str:
        return str(astuple(self))  # type: ignore[call-overload]  # every subclass is a dataclass

    def values(self) -> tuple[int | bool, ...]:
        return tuple(astuple(self))  # type: ignore[call-overload]


@dataclass(frozen=True, order=True)
class DecodeKey(_Key):
    kv_blocks: int


@dataclass(frozen=True, order=True)
class BatchedKey(_Key):
    num_seqs: int
    kv_blocks: int
    needs_gather: bool  # fewer real rows than num_seqs: the kernel gathers them
    store_out: bool  # every row real: the kernel writes its output in place


@dataclass(frozen=True, order=True)
class PrefillKey(_Key):
    tokens: int


@dataclass(frozen=True, order=True)
class AttendKey(_Key):
    kv_blocks: int
    query_len: int  # the query rung: 1 for a decode, any rung for a prefill chunk


@dataclass(frozen=True, order=True)
class ChunkedKey(_Key):
    num_seqs: int
    blocks_per_chunk: int
    num_chunks: int


Key = DecodeKey | BatchedKey | PrefillKey | AttendKey | ChunkedKey
KEY_TYPES: dict[str, type[Key]] = {
    DECODE: DecodeKey,
    BATCHED: BatchedKey,
    PREFILL: PrefillKey,
    ATTEND: AttendKey,
    CHUNKED: ChunkedKey,
}


@dataclass(frozen=True, order=True)
class Bucket:
    kernel: str
    key: Key
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.key) is not KEY_TYPES.get(self.kernel):
            raise TypeError(f"a {self.kernel!r} bucket takes a {KEY_TYPES.get(self.kernel)}, got {self.key!r}")
        # Hashed once: every step looks its bucket up several times. Ints only (the kernel by its
        # index), so the hash is the same in every process and a pickled bucket keeps a valid one.
        object.__setattr__(self, "_hash", hash((KERNELS.index(self.kernel), self.key)))

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return f"{self.kernel}{self.key}"

    @staticmethod
    def parse(kernel: str, values: list[int | bool] | tuple[int | bool, ...]) -> Bucket:
        """A bucket from its JSON form: the kernel and its key's fields in order."""
        if kernel not in KEY_TYPES:
            raise ValueError(f"unknown kernel {kernel!r}: one of {', '.join(KEY_TYPES)}")
        return Bucket(kernel, KEY_TYPES[kernel](*values))
