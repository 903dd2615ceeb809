"""DESIGN "Prefix caching (ragged layout)": chain hashes of full blocks, the lookup at admission
and the registration at the end of a step. The pool (`runtime.block_pool`) keeps the references,
the registered hashes and the free list; this module decides what to look up and register."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.block_pool import BlockPool


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """A block's hash: its parent's (the request's previous block; None for the first) with its
    own token ids, so equal hashes mean equal prefixes. Python hashes ints and tuples the same in
    every process."""
    return hash((parent, tuple(tokens)))


def block_hashes(tokens: Sequence[int], bs: int, start: int = 0, parent: int | None = None) -> list[int]:
    """The chain hashes of the full blocks of `tokens` from block `start` on, chained from `parent`."""
    out: list[int] = []
    for j in range(start, len(tokens) // bs):
        parent = chain_hash(parent, tokens[j * bs : (j + 1) * bs])
        out.append(parent)
    return out


@dataclass(frozen=True)
class Registered:
    """A block registered at the end of a step: the request's `index`-th block, under `hash`."""

    request_id: str
    index: int
    block: int
    hash: int
    parent: int | None


def lookup(pool: BlockPool, prompt: Sequence[int], bs: int) -> tuple[list[int], list[int]]:
    """The leading full prompt blocks whose chain hash is registered, with their hashes, capped at
    floor((p - 1) / bs) blocks so that at least one prompt token is computed."""
    cap = (len(prompt) - 1) // bs
    blocks, hashes = [], []
    for h in block_hashes(prompt[: cap * bs], bs):
        if (b := pool.cached(h)) is None:
            break
        blocks.append(b)
        hashes.append(h)
    return blocks, hashes


def register_full(
    pool: BlockPool, request_id: str, tokens: Sequence[int], written: int, blocks: list[int], hashes: list[int], bs: int
) -> list[Registered]:
    """Register each of a request's blocks that its `written` KV positions now fill and that has no
    hash yet; `hashes` (the request's chain so far) grows by each. A hash registered already keeps
    its first block: this one stays private, but the chain goes on through its hash."""
    out: list[Registered] = []
    for j in range(len(hashes), written // bs):
        parent = hashes[-1] if hashes else None
        h = chain_hash(parent, tokens[j * bs : (j + 1) * bs])
        hashes.append(h)
        if pool.register(blocks[j], h):
            out.append(Registered(request_id, j, blocks[j], h, parent))
    return out
