"""Where the hunt's strategies get their choices: Hypothesis's own draws, or one byte string.

Every `draw_*` function in `hunt.strategies` and `hunt.config` reads its choices through
`Choices` (`between(lo, hi)`, `flag()`, `keep()`), from either source:

- `Drawn`: one Hypothesis draw per choice. The public strategies (`strategies.configs`,
  `batch_states`, ...) use it, so a property of your own shrinks structurally.
- `Tape`: the hunt's properties draw one `bytes` value per case (`hunt.cases`) and read
  every choice from it. Hypothesis spends about 20 us on each choice it records (spans,
  the data tree, constraints); a dispatch case made ~45 of them, so drawing it cost more
  than checking it. A tape is one choice however long the trace.

A tape still shrinks to a readable case. Hypothesis shrinks a byte string by zeroing it
and then lowering each byte in turn. A field reads one byte (two for a wide range) mapped
in order onto `lo..hi`: a lower byte never reads a larger value, a zero byte reads `lo`,
and bytes past the end read as zeros. The strategies put the plain case at every field's
`lo` (no early stop, no abort, the trace ends), and a round or an add of a trace carries
one `keep` byte: zeroing it drops that item and leaves every later field reading as it
did, where deleting the item's bytes would shift them all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")

# Hypothesis validates every new strategy object, and even its memo of st.integers(a, b)
# costs ~20 us a lookup; a plain memo makes a config-dependent draw cost no construction.
ints: Callable[[int, int], st.SearchStrategy[int]] = functools.cache(st.integers)
BOOLS = st.booleans()


class Choices(Protocol):
    """A source of choices: an int in `lo..hi` (inclusive; `lo` is the simplest), or a bool (False is)."""

    def between(self, lo: int, hi: int) -> int: ...

    def flag(self) -> bool: ...

    def keep(self) -> bool:
        """Whether the item about to be read stays in the case (the caller reads it either way)."""
        ...


@dataclass(frozen=True, slots=True)
class Drawn:
    """Choices drawn from Hypothesis one by one: `ints(lo, hi)` and `BOOLS`."""

    draw: st.DrawFn

    def between(self, lo: int, hi: int) -> int:
        return self.draw(ints(lo, hi))

    def flag(self) -> bool:
        return self.draw(BOOLS)

    def keep(self) -> bool:
        return True  # Hypothesis deletes an item by deleting its draws


# How often a tape reads a field's simplest value, else about uniform over its range, as
# Hypothesis draws a bounded int (its simplest value a third of the time when drawn alone).
# Chosen so that a case comes out as large as Hypothesis's own draws made it (1,000 examples,
# seed 0, before -> after): a ladders config's max_model_len 13.3 -> 13.0 and max_num_seqs
# 3.7 -> 3.8; a dispatch trace's events 10.1 -> 11.2 and dispatches 18.6 -> 17.2. A trace's
# rounds each draw "another round?", so there Hypothesis's bias made traces more alike, not shorter.
CONFIG_PLAIN = 1 / 5
TRACE_PLAIN = 1 / 32


class Tape:
    """Choices read in order from one byte string; past its end every byte reads as zero.

    A field reads one byte, or two when its range has more values than the bytes not read
    as `lo`: a `plain` share of the raw values read `lo`, the rest spread evenly over `lo..hi`
    in order, so a lower raw value never reads a larger one and zero reads `lo`.
    """

    __slots__ = ("at", "data", "plain")

    def __init__(self, data: bytes, plain: float = CONFIG_PLAIN) -> None:
        self.data = data
        self.at = 0  # bytes read so far (may pass the end)
        self.plain = (int(256 * plain), int(65536 * plain))  # raw values below these read lo

    def between(self, lo: int, hi: int) -> int:
        span = hi - lo + 1
        if span <= 1:
            if span < 1:
                raise ValueError(f"an empty range: {lo}..{hi}")
            return lo  # one value: no byte spent
        at, one, two = self.at, *self.plain
        if span <= 256 - one:  # one byte, when the values not read as lo can hold every value
            self.at = at + 1
            raw, size, simple = (self.data[at] if at < len(self.data) else 0), 256, one
        elif span <= 65536 - two:
            self.at = at + 2
            chunk = self.data[at : at + 2].ljust(2, b"\0")
            raw, size, simple = (chunk[0] << 8) | chunk[1], 65536, two
        else:
            raise ValueError(f"a range of {span} values: a tape reads at most {65536 - two}")
        return lo if raw < simple else lo + (raw - simple) * span // (size - simple)

    def flag(self) -> bool:
        return self.between(0, 1) == 1

    def keep(self) -> bool:
        """A byte that drops the item when zero (1 in 256 at random). The item is read either
        way, so what follows reads the same: shrinking deletes an item by zeroing one byte,
        where deleting its bytes would shift every later field."""
        at = self.at
        self.at = at + 1
        return at < len(self.data) and self.data[at] != 0

    @property
    def exhausted(self) -> bool:
        """Whether a read went past the end (the rest read as zeros)."""
        return self.at > len(self.data)


Draw = st.DrawFn | Choices


def choices(draw: Draw) -> Choices:
    """`draw` as Choices: a Tape or Drawn as it is, a Hypothesis draw function wrapped in Drawn."""
    return draw if isinstance(draw, (Tape, Drawn)) else Drawn(draw)  # type: ignore[arg-type]


def tape_cases(read: Callable[[bytes], T], size: int) -> st.SearchStrategy[T]:
    """Cases read from one `size`-byte string (by `read`, through `Tape`s): one Hypothesis choice a case."""
    return st.binary(min_size=size, max_size=size).map(read)
