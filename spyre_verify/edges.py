"""The edge traffic served after the seeded workload: requests at the edge of admission, aborts
of running requests right after another's prefill, and (ragged) a prompt split into chunks beside
decoding rows. Each is a short list of `workload` items, served like the workload."""

from __future__ import annotations

import math

from runtime.config import RuntimeConfig
from spyre_verify.workload import LONG_TOKENS, Abort, Arrival, Item


def boundary_arrivals(config: RuntimeConfig) -> list[Item]:
    """Requests at the edge of admission: for a few prompt lengths, the longest output that
    fits once the prompt is padded to a block (ragged: unpadded; DESIGN admits it), one token
    more and zero tokens (DESIGN refuses both at `add_request`). Above a max_model_len of
    LONG_TOKENS the admitted one is aborted two steps after it arrives: the edge is whether it is
    admitted, and serving each to the end took thousands of steps (the seeded workload already
    runs one request to max_model_len)."""
    bs, L, vocab = config.block_size, config.max_model_len, config.model.vocab_size
    long = L > LONG_TOKENS
    out: list[Item] = []
    step = arrived = 0
    for p in sorted({1, bs - 1, bs, bs + 1, L - 1, L} - {0}):
        prompt = tuple((5 * i + 1) % vocab for i in range(p))
        room = L - (p if getattr(config, "layout", "padded") == "ragged" else math.ceil(p / bs) * bs)
        fits = [Arrival(step, prompt, room)] if room >= 1 else []
        out += [*fits, Arrival(step, prompt, max(1, room + 1)), Arrival(step, prompt, 0)]
        out += [Abort(step + 2, arrived)] if long and fits else []
        arrived += len(fits) + 2
        step += 3 if long else 0
    return out


def abort_edges(config: RuntimeConfig) -> list[Item]:
    """Aborts of running requests, which a seeded workload's long queue makes rare: `a` runs,
    `b` joins, `a` is aborted right after `b`'s prefill (DESIGN "Reachable.": a state no
    natural finish reaches), then `b`, alone, is aborted and the batch empties. Then, where
    two blocks and three tokens fit, the same with a strip: `c` of bs + 1 tokens runs at tkv
    2 bs, one-token `d` joins with a whole block of left padding, and aborting `c` must strip
    it at once (DESIGN "Abort."); `d` decodes once alone before its abort. All ignore the EOS,
    so they run until aborted; an abort that finds its request ended is a miss."""
    bs, L = config.block_size, config.max_model_len
    mt = max(1, min(4, L - bs))
    edges: list[Item] = [
        Arrival(0, (1,), mt, ignore_eos=True),
        Arrival(1, (2, 3), mt, ignore_eos=True),
        Abort(2, 0),
        Abort(3, 1),
    ]
    if 2 * bs + 3 <= L and config.max_num_seqs >= 2:
        edges += [
            Arrival(4, (1,) * (bs + 1), 2, ignore_eos=True),
            Arrival(5, (1,), 3, ignore_eos=True),
            Abort(6, 2),
            Abort(7, 3),
        ]
    return edges


def chunk_edges(config: RuntimeConfig) -> list[Item]:
    """Ragged layout: the longest prompt prefilled beside decoding rows, so that it takes several
    chunks and later chunks start past 0 (DESIGN "Budget."). Up to two one-token requests
    decode while it prefills; each asks for 4 tokens, so they hold few blocks and end during
    its chunks, and the prompt's last chunk runs with fewer rows beside it. At the embedded
    config (block_size 4, max_model_len 16, 4 seqs, budget 8) the 15-token prompt takes
    chunks of 6, 6 and 3. Nothing for the padded layout, which prefills a prompt whole."""
    if not config.ragged or config.max_model_len < 3:
        return []
    rows = min(config.max_num_seqs - 1, 2)
    edges: list[Item] = [Arrival(i, (1,), 4, ignore_eos=True) for i in range(rows)]
    return [*edges, Arrival(rows, (2,) * (config.max_model_len - 1), 1, ignore_eos=True)]
