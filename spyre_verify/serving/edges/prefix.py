"""Prefix-cache edges (DESIGN "Prefix caching (ragged layout)"): on a ragged config with caching on,
`check` serves, after the protocol edges (`spyre_verify.serving.edges.protocol`), one scenario per cache rule, sized
from the config so that none depends on the workload's luck: a hit after its source ended, a block
shared while its source runs, a collision probe (equal tokens under different parents), a whole
prompt cached, and an eviction. Each is recorded in `result.edges` with what the runtime did."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spyre_verify.serving.edges.prefix_run import (
    MOST_FILLERS as MOST_FILLERS,
)
from spyre_verify.serving.edges.prefix_run import (
    Fresh as Fresh,
)
from spyre_verify.serving.edges.prefix_run import (
    PrefixRun,
    Sent,
    prefix_scenario,
)
from spyre_verify.serving.edges.prefix_run import (
    caching_on as caching_on,
)
from spyre_verify.serving.edges.prefix_run import (
    fillers as fillers,
)
from spyre_verify.serving.edges.prefix_run import (
    sizes as sizes,
)
from spyre_verify.serving.edges.protocol import EdgeRun
from spyre_verify.serving.workload import Arrival


def prefix_edges(run: EdgeRun) -> EdgeRun:
    """DESIGN "Prefix caching": one scenario a rule of the cache, each served alone once the runtime
    has drained, with prompts of fresh tokens (`Fresh`) sized from the config, so every rule is
    exercised whatever the workload shared: `prefix_hit`, `while_running`, `collision_probe`,
    `whole_prompt`, `eviction`."""
    engine = run.engine
    fresh = Fresh(run.vocab, engine.config.block_size)
    for name, rule, scenario in PREFIX_SCENARIOS:
        with prefix_scenario(run, name, rule) as s:
            if engine.has_work():
                s.edge.note = "not exercised: a request of an earlier scenario had not ended"
                continue
            scenario(s, fresh)
    return run


def prefix_hit(s: PrefixRun, fresh: Fresh) -> None:
    """a prompt that shares the first k full blocks of an ended request's prompt, then diverges, starts
    from those k blocks, cached free (DESIGN "Admission", "References")."""
    bs, L, _, _, _ = sizes(s.run.engine)
    k = min(2, (L - 3) // bs)
    if k < 1:
        s.edge.note = f"not exercised: a prompt of a whole block and one token more, with 2 to generate, needs max_model_len >= {bs + 3}"
        return
    a = fresh.tokens(k * bs + 1)
    r = max(1, min(bs - 1, L - 2 - k * bs))
    b = fresh.after(a[: k * bs], r, unlike=a)
    s.serve(
        [
            Sent("A", Arrival(0, a, 1, ignore_eos=True), f"{len(a)} fresh tokens"),
            Sent(
                "B",
                Arrival(0, b, 2, ignore_eos=True),
                f"A's first {k} blocks, then {r} token{'s' * (r != 1)} of its own",
            ),
        ]
    )
    s.expect({"A": 0, "B": k}, f"B started from A's {k} cached blocks")


def while_running_plan(engine: Any, k: int) -> tuple[int, list[int]] | None:
    """(A's max_tokens, the fillers' block counts) for `while_running` with k shared blocks, or None
    when no plan fits: A (k blocks and a token) outlives B and then one-token fresh requests that
    take U - k blocks, beside A's reservation. That is as many allocations as can come before a
    block B freed, at the tail of the free list, is taken back: B's private block and the shared
    ones are freed last, and A keeps one private block. Of the filler sizes that fit, the fewest steps."""
    bs, L, T, _, U = sizes(engine)
    p, need, best = k * bs + 1, U - k, None
    for f in range(1, min(U, (L - 2) // bs + 1) + 1):
        blocks = [f] * (need // f) + ([need % f] if need % f else [])
        if len(blocks) > MOST_FILLERS:
            continue
        steps = sum(-(-((r - 1) * bs + 1) // max(1, T - 1)) for r in blocks)  # A decodes beside each chunk
        M = steps + 3  # A's first token, its decode beside B's chunk, one per filler step, one after
        reservation = -(-(p + M - 1) // bs)
        if p + M <= L and reservation + k + 1 <= U and reservation + f <= U and (best is None or best[0] > M):
            best = (M, blocks)
    return best


def while_running(s: PrefixRun, fresh: Fresh) -> None:
    """A prompt that shares a running request's first k full blocks holds them with it (two
    references); when it ends they stay with the running one, whose next dispatches still list them,
    and no allocation takes them back while it runs, however many fresh requests go through the pool
    (DESIGN "References"). The fresh requests come where the pool can go round within max_model_len
    (`while_running_plan`); elsewhere A still decodes twice after B ends."""
    bs, L, T, S, U = sizes(s.run.engine)
    if S < 2:
        s.edge.note = "not exercised: max_num_seqs 1 runs one request at a time"
        return
    shares = [k for k in (2, 1) if k * bs + 4 <= L and -(-(k * bs + 3) // bs) + k + 1 <= U]
    if not shares:
        s.edge.note = (
            f"not exercised: no request of a whole block and a token that decodes 3 tokens fits beside another "
            f"sharing its block (max_model_len {L}, block_size {bs}, {U} usable blocks)"
        )
        return
    k, M, blocks = next(((k, *p) for k in shares if (p := while_running_plan(s.run.engine, k))), (shares[0], 3, []))
    a = fresh.tokens(k * bs + 1)
    b = fresh.after(a[: k * bs], 1, unlike=a)
    at = -(-len(a) // T)  # A's prompt is computed, so A runs, when B arrives
    more = (fillers(fresh, bs, L, max(blocks), sum(blocks), at) or []) if blocks else []
    s.serve(
        [
            Sent("A", Arrival(0, a, M, ignore_eos=True), f"{len(a)} fresh tokens"),
            Sent(
                "B", Arrival(at, b, 1, ignore_eos=True), f"A's first {k} blocks, then 1 token of its own, once A runs"
            ),
            *more,
        ]
    )
    rid_a = s.ids.get("A")
    shared = s.ids.get("B") in s.log.hits and rid_a not in s.log.ended_at_hit.get(s.ids.get("B") or "", {rid_a})
    s.edge.did["A_running_at_B_hit"] = shared
    s.edge.did["fresh_blocks"] = sum(blocks)
    after = (
        f"then {len(more)} fresh requests took {sum(blocks)} blocks while A ran"
        if more
        else f"then A ran on (the pool of {U} blocks cannot go round within max_model_len {L})"
    )
    s.expect({"A": 0, "B": k}, f"B held A's {k} blocks with A, {after}")
    if s.edge.followed and not shared:
        s.edge.followed, s.edge.note = None, "not as planned: A had ended when B hit"


def collision_probe(s: PrefixRun, fresh: Fresh) -> None:
    """Equal hashes mean equal prefixes: R1 and R2 are two blocks each, with equal second blocks after
    different first ones, so R3, R2's prompt and a token, hits R2's two blocks and never R1's second,
    still cached (DESIGN "Full blocks and hashes"). R2 takes two blocks from the head of the free
    list: with at least 4 usable blocks R1's, at its tail, stay cached."""
    bs, L, _, _, U = sizes(s.run.engine)
    if 2 * bs + 2 > L:
        s.edge.note = (
            f"not exercised: two whole blocks and one token, with one to generate, need max_model_len >= {2 * bs + 2}"
        )
        return
    x1, x2, y = fresh.block(), fresh.block(), fresh.block()
    s.serve(
        [
            Sent("R1", Arrival(0, x1 + y, 1, ignore_eos=True), "block X1, then block Y"),
            Sent("R2", Arrival(0, x2 + y, 1, ignore_eos=True), "block X2, then the same block Y"),
            Sent("R3", Arrival(0, x2 + y + fresh.tokens(1), 1, ignore_eos=True), "R2's two blocks, then 1 token"),
        ]
    )
    r2 = s.log.registered.get(s.ids.get("R2") or "", {})
    r3 = s.ids.get("R3") or ""
    mine = s.log.hits.get(r3) == tuple(r2[j][0] if j in r2 else None for j in range(2))
    s.edge.did["R3_hit_R2s_blocks"] = mine
    # Whether the probe could bite: R1's second block, the one a parentless hash would serve, still cached.
    y1 = s.log.hashes(s.ids.get("R1")).get(1)
    s.edge.did["R1_block_1_cached_at_R3"] = (
        y1 is not None and r3 in s.log.evicted_at_hit and y1 not in s.log.evicted_at_hit[r3]
    )
    s.expect({"R1": 0, "R2": 0, "R3": 2}, "R2 missed (its first block is its own), R3 hit R2's two blocks")
    if s.edge.followed and not mine:
        s.edge.followed, s.edge.note = None, "not as planned: R3's hit blocks are not the ones R2 registered"
    elif s.edge.followed and U < 4:
        s.edge.note += f" (with {U} usable blocks R2 took R1's back: the probe could not bite)"


def whole_prompt(s: PrefixRun, fresh: Fresh) -> None:
    """a prompt that is exactly a cached one, a whole number m of blocks, hits m - 1 of them:
    the lookup is capped at floor((p - 1) / bs), so its last block is computed (DESIGN "Admission")."""
    bs, L, _, _, _ = sizes(s.run.engine)
    m = min(2, (L - 2) // bs)
    if m < 1:
        s.edge.note = (
            f"not exercised: a prompt of a whole block, with 2 tokens to generate, needs max_model_len >= {bs + 2}"
        )
        return
    p = fresh.tokens(m * bs)
    s.serve(
        [
            Sent("A", Arrival(0, p, 1, ignore_eos=True), f"{m * bs} fresh tokens ({m} blocks)"),
            Sent("B", Arrival(0, p, 2, ignore_eos=True), "A's prompt again"),
        ]
    )
    s.expect({"A": 0, "B": m - 1}, f"B hit {m - 1} of its {m} blocks and computed the last")


def eviction(s: PrefixRun, fresh: Fresh) -> None:
    """allocations take cached free blocks least recently freed first, and an ended request frees
    its last block first: after fresh requests take all but one of the usable blocks, A's prompt again
    finds only its first block cached (DESIGN "References", "Admission")."""
    bs, L, _, _, U = sizes(s.run.engine)
    a_full = min(2, (L - 2) // bs)
    keep = a_full - 1
    if a_full < 1:
        s.edge.note = f"not exercised: a prompt of a whole block and one token needs max_model_len >= {bs + 2}"
        return
    more = fillers(fresh, bs, L, U, U - keep)
    if more is None:
        s.edge.note = f"not exercised: cycling {U} usable blocks takes more than {MOST_FILLERS} requests"
        return
    a = fresh.tokens(a_full * bs + 1)
    s.serve(
        [
            Sent("A", Arrival(0, a, 1, ignore_eos=True), f"{len(a)} fresh tokens ({a_full} whole blocks)"),
            *more,
            Sent("A'", Arrival(0, a, 1, ignore_eos=True), "A's prompt again"),
        ]
    )
    mine = set(s.log.hashes(s.ids.get("A")).values())
    s.edge.did["A_blocks_evicted"] = len(mine & {h for _, h in s.log.evicted})
    s.edge.did["fresh_blocks"] = U - keep
    got = "a miss" if keep == 0 else f"a partial hit of {keep} of {a_full} blocks"
    s.expect({"A": 0, "A'": keep}, f"{len(more)} fresh requests took {U - keep} blocks: A' found {got}")


PREFIX_SCENARIOS: tuple[tuple[str, str, Callable[[PrefixRun, Fresh], None]], ...] = (
    ("prefix-hit", "a prompt sharing an ended request's first k full blocks starts from them, cached free", prefix_hit),
    (
        "prefix-while-running",
        "a block two live requests list stays theirs until the last of them ends; no allocation takes it back",
        while_running,
    ),
    (
        "prefix-collision-probe",
        "equal hashes mean equal prefixes: equal tokens after a different first block are not a hit",
        collision_probe,
    ),
    (
        "prefix-whole-prompt",
        "a hit covers at most floor((p - 1) / bs) blocks: a whole cached prompt still computes its last block",
        whole_prompt,
    ),
    (
        "prefix-eviction",
        "allocations take the least recently freed block first, and a request frees its last block first",
        eviction,
    ),
)
PREFIX_NAMES = tuple(name for name, _, _ in PREFIX_SCENARIOS)
