"""Per-example costs a hunt switches off while Hypothesis runs its properties, and puts back.

Profiled on `spyre-verify hunt` (cProfile, one core): besides the checks and the drawing,
two costs paid on every example had nothing to do with the hunt.

- **Garbage collection.** An example allocates thousands of short-lived objects; at
  CPython's default threshold (700) a young collection ran every other example, and each
  full one walked the ~300k objects torch and Hypothesis had built: a fifth to a third of
  a property's time. `quiet_gc` freezes what exists before the run (the collector stops
  walking it) and collects the young every 50,000 allocations instead. Cycles are still
  collected, only less often.
- **numpy's global generator.** Around every example Hypothesis saves, seeds and restores
  each generator registered with it, so that a test drawing from one is deterministic.
  numpy's state is 2.5 KB of Mersenne Twister: ~70 us an example, 5 to 20% of a property.
  No hunt property draws from numpy (the runtime runs tensor-free here), so
  `numpy_unmanaged` takes it off Hypothesis's list for the run. Python's own `random`
  stays managed. This reaches into `hypothesis.internal.entropy`; if that ever changes
  shape, the context does nothing and the hunt is only slower.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Fewer, cheaper garbage collections for the length of the block."""
    before, ours = gc.get_threshold(), gc.get_freeze_count() == 0  # frozen by someone else: theirs to thaw
    if ours:
        gc.freeze()
    gc.set_threshold(50_000, 20, 10)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if ours:
            gc.unfreeze()


@contextlib.contextmanager
def numpy_unmanaged() -> Iterator[None]:
    """Hypothesis leaves numpy's global generator alone for the length of the block."""
    taken = _take_numpy()
    try:
        yield
    finally:
        if taken is not None:
            from hypothesis.internal import entropy

            key, wrapper = taken
            entropy.RANDOMS_TO_MANAGE[key] = wrapper


def _take_numpy() -> tuple[Any, Any] | None:
    """Remove Hypothesis's numpy wrapper from the generators it manages; (key, wrapper) to put back."""
    if "numpy" not in sys.modules:
        return None
    try:
        from hypothesis.internal import entropy

        entropy.get_seeder_and_restorer(0)  # registers numpy's wrapper now, if it was not yet
        wrapper = entropy.NP_RANDOM
        managed = entropy.RANDOMS_TO_MANAGE
        key = next((k for k, r in list(managed.items()) if r is wrapper), None)
        if wrapper is None or key is None:
            return None
        del managed[key]
        return key, wrapper
    except Exception:  # Hypothesis's internals moved: keep its default behaviour
        return None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Both of the above."""
    with quiet_gc(), numpy_unmanaged():
        yield
