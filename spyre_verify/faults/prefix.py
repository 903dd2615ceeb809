"""Seeded faults of prefix caching (DESIGN "Prefix caching (ragged layout)"), for the fault catalog.

Each is a patch of the component it breaks, written the way a developer would write the bug, in the
style of `spyre_verify.faults.ragged`: a function returning a context manager that holds the bug
while entered. The catalog (`faults/__init__.py`) registers them, for the ragged layout only and
only where prefix caching is on and the fault can show (each entry's `inert` says why not). The
edge scenarios (`spyre_verify.serving.edges.prefix.prefix_edges`) make every one show on any config that has
caching on, whatever the seeded workload happened to share:

- `start_one_block_early` (`prefix-write-shared`): `RaggedScheduler._admit` recomputes the last
  block of a hit of h "to be safe": it counts (and reports) h - 1 blocks from the cache and starts
  the prompt at `(h - 1) * bs`, but keeps all h shared blocks in the table instead of drawing a
  fresh one for the block it recomputes, so the first chunk writes into a registered block (held
  by it, and by the request that registered it while that one runs). padding-validity flags the
  write (`shared-block-write`), contract-conformance the start (the contract starts at h * bs).
  The tokens stay right: the KV it writes equals what was there.
- `parentless_hash` (`prefix-hash-ignores-parent`): `prefix_cache.chain_hash` hashes a block's
  tokens alone, so two prompts whose block j holds equal tokens after different prefixes share a
  hash. The collision-probe edge makes a third prompt hit the other prefix's block: prefix-cache
  flags it (`cache-collision`), contract-conformance (the hit and the tables differ from the
  model's) and output-equivalence (the KV read is another context's) may too. Inert where a hit
  covers at most one block (max_model_len below 2 * bs + 2): a first block has no parent.
- `free_on_any_drop` (`prefix-evicts-referenced`): `BlockPool.free` returns a shared block to the
  free list when any holder drops it, forgetting the other holders, as a free written before
  blocks could be shared does. In the while-running edge B, sharing A's blocks, ends first: A's
  next dispatch lists blocks the pool no longer counts A holding, and padding-validity flags it
  (`foreign-block`) on every config where two live requests can share a block. Where the pool can
  go round while A runs (the edge then sends fresh requests through it: the check config, the
  production defaults), an allocation takes a block back while A still reads it, and prefix-cache
  flags that (`freed-while-referenced`), contract-conformance and output-equivalence too. Such a
  free checks nothing, so the runtime never raises: two holders that end in the same step (the
  workload's shared prompts do) leave no trace but the free list's order. The catalog names
  padding-validity because prefix-cache needs that allocation, which a small max_model_len beside
  a large pool cannot bring while A runs (block 2, max_model_len 12, 24 blocks, budget 4: at least
  12 steps of fresh prompts, where A lives at most 9).
- `uncapped_lookup` (`prefix-uncapped-lookup`): the lookup is capped at floor(p / bs) blocks, not
  floor((p - 1) / bs), so a prompt of whole blocks that is cached entirely hits every block and has
  no token left to compute. The scheduler then does the plausible patch-up rather than crash (the
  real scheduler asserts a chunk of at least one token): it backs off one token and recomputes the
  prompt's last one (c = p - 1) to get its logits, writing position p - 1 into the last hit block,
  registered and shared. prefix-cache flags it (`hit-uncapped`), padding-validity
  (`shared-block-write`) and contract-conformance too. The tokens stay right (the KV written
  equals what was there), so output-equivalence cannot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from unittest import mock

from runtime import prefix_cache, ragged_scheduler
from runtime.block_pool import BlockPool
from runtime.config import RuntimeConfig
from runtime.ragged_scheduler import RaggedScheduler
from runtime.scheduler import Admission
from spyre_verify.oracle.derive import prefix_caching


def caching_off(c: RuntimeConfig) -> str | None:
    """Why a prefix-caching fault breaks nothing on `c` (a ragged config), or None."""
    if not prefix_caching(c):
        return "prefix caching is off (enable_prefix_caching=False, SPYRE_PREFIX_CACHING=0)"
    return None


def most_hit(c: RuntimeConfig) -> int:
    """The most blocks one hit can cover: a prompt of at most max_model_len - 1 tokens (one is
    generated) hits at most floor((p - 1) / bs) of them."""
    return (c.max_model_len - 2) // c.block_size


def never_hits(c: RuntimeConfig) -> str | None:
    """Why a fault in what a hit does breaks nothing on `c`, or None: caching is off, or no prompt
    that fits max_model_len is long enough to hit a block."""
    if (why := caching_off(c)) is not None:
        return why
    if most_hit(c) < 1:
        return f"no prompt within max_model_len {c.max_model_len} can hit a block of {c.block_size} tokens"
    return None


def one_block_hits(c: RuntimeConfig) -> str | None:
    """Why a hash that ignores the parent breaks nothing on `c`, or None: a hit covers at most one
    block, whose hash has no parent anyway."""
    if (why := caching_off(c)) is not None:
        return why
    if most_hit(c) < 2:
        return f"a hit covers at most {max(0, most_hit(c))} block within max_model_len {c.max_model_len}: no parent"
    return None


def no_whole_prompt(c: RuntimeConfig) -> str | None:
    """Why an uncapped lookup breaks nothing on `c`, or None: no prompt of whole blocks fits."""
    if (why := caching_off(c)) is not None:
        return why
    if c.block_size > c.max_model_len - 1:
        return f"no prompt of a whole block of {c.block_size} tokens fits max_model_len {c.max_model_len}"
    return None


def shared_by_none(c: RuntimeConfig) -> str | None:
    """Why a fault in dropping shared references breaks nothing on `c`, or None: caching is off, or
    one request runs at a time, so no block is ever held by two live requests."""
    if (why := never_hits(c)) is not None:
        return why
    if c.max_num_seqs < 2:
        return "max_num_seqs 1: no block is ever held by two live requests"
    return None


@contextlib.contextmanager
def start_one_block_early() -> Iterator[None]:
    """`RaggedScheduler._admit` that, after a hit of h blocks, "recomputes the last hit block": it
    counts h - 1 blocks as computed and as the hit, so the prompt starts at (h - 1) * bs, but the
    table keeps all h shared blocks (no fresh block is drawn for the one recomputed), so the first
    chunk writes its KV again into the registered block."""
    original = RaggedScheduler._admit

    def _admit(self: RaggedScheduler, adm: Admission) -> tuple[tuple[int, int], ...]:
        hit = original(self, adm)
        if hit:
            req = self.prefilling
            assert req is not None
            req.computed = (len(hit) - 1) * self.bs  # the bug: the last hit block is recomputed in place
            return hit[:-1]
        return hit

    with mock.patch.object(RaggedScheduler, "_admit", _admit):
        yield


@contextlib.contextmanager
def parentless_hash() -> Iterator[None]:
    """`prefix_cache.chain_hash` without the parent: a block's hash is its own tokens'."""

    def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
        return hash(tuple(tokens))

    with mock.patch.object(prefix_cache, "chain_hash", chain_hash):
        yield


@contextlib.contextmanager
def free_on_any_drop() -> Iterator[None]:
    """`BlockPool.free` as it was before blocks could be shared, holders bolted on: it releases
    whatever its caller lists, each block leaving its private owner or all its holders for the free
    list. A block another request still holds is freed with the caller's reference."""

    def free(self: BlockPool, owner: str, blocks: list[int]) -> None:
        for b in blocks:
            self._owner.pop(b, None)
            self._holders.pop(b, None)  # the bug: the other holders' references go with the caller's
            self._free[b] = None
        left = self._drawn.pop(owner, 0) - len(blocks)
        if left:
            self._drawn[owner] = left

    with mock.patch.object(BlockPool, "free", free):
        yield


@contextlib.contextmanager
def uncapped_lookup() -> Iterator[None]:
    """The lookup capped at floor(p / bs) blocks; a prompt found whole then recomputes its last
    token (c = p - 1), writing it into the last hit block, to have logits for its first token."""
    original = RaggedScheduler._admit

    def lookup(pool: BlockPool, prompt: Sequence[int], bs: int) -> tuple[list[int], list[int]]:
        cap = len(prompt) // bs  # the bug: every whole block, so a whole prompt can hit
        blocks, hashes = [], []
        for h in prefix_cache.block_hashes(prompt[: cap * bs], bs):
            if (b := pool.cached(h)) is None:
                break
            blocks.append(b)
            hashes.append(h)
        return blocks, hashes

    def _admit(self: RaggedScheduler, adm: Admission) -> tuple[tuple[int, int], ...]:
        hit = original(self, adm)
        req = self.prefilling
        if req is not None and req.computed >= len(req.prompt):
            req.computed = len(req.prompt) - 1  # nothing left to compute: redo the last token for its logits
        return hit

    with mock.patch.object(ragged_scheduler, "lookup", lookup), mock.patch.object(RaggedScheduler, "_admit", _admit):
        yield
