"""The ragged layout's config fields as the hunt draws them (`strategies.draw_config` reads them
after every padded field, so a padded case reads the same bytes it always did)."""

from __future__ import annotations

from typing import Any

from runtime.config import ENV_QUERY_BUCKETS
from spyre_verify.hunt.tape import Draw, choices
from spyre_verify.oracle.derive import budget


def draw_ragged_fields(
    draw: Draw, max_model_len: int, max_num_seqs: int, kwargs: dict[str, Any], env: dict[str, str]
) -> None:
    """The ragged layout's fields, each shrinking toward its default (DESIGN "The ragged layout",
    Config and Ladders): the token budget T from max_num_seqs (the least it accepts) up to a little
    above max_model_len, so small budgets split prompts into many chunks; the batched kernel's
    entry target E at 1..4, so chunked tables have several chunks; now and then a query ladder
    override (the rungs above 1, increasing, the last one T; none with T = 1); and, read last, prefix
    caching (DESIGN "Prefix caching": on by default) off in one config of four."""
    ch = choices(draw)
    L, S = max_model_len, max_num_seqs
    kwargs["layout"] = "ragged"
    if ch.flag():
        kwargs["max_num_batched_tokens"] = ch.between(S, max(S, L + 2))
    if ch.flag():
        kwargs["batched_decode_entries"] = ch.between(1, 4)
    T = budget(kwargs.get("max_num_batched_tokens"), L, S)
    if T > 1 and ch.flag():
        rungs: set[int] = set()
        while len(rungs) < 4 and (r := ch.between(0, T - 1)) > 1:
            rungs.add(r)
        env[ENV_QUERY_BUCKETS] = ",".join(map(str, [*sorted(rungs), T]))
    if ch.between(0, 3) == 3:
        kwargs["enable_prefix_caching"] = False
