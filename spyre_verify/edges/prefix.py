"""Prefix-cache edges (DESIGN "Prefix caching (ragged layout)"): on a ragged config with caching on,
`check` serves, after the protocol edges (`spyre_verify.edges.protocol`), one scenario per cache rule, sized
from the config so that none depends on the workload's luck: a hit after its source ended, a block
shared while its source runs, a collision probe (equal tokens under different parents), a whole
prompt cached, and an eviction. Each is recorded in `result.edges` with what the runtime did."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from spyre_verify.edges.protocol import Edge, EdgeRun, listed
from spyre_verify.oracle.derive import prefix_caching
from spyre_verify.serve_loop import Feed, aborts_judged_by, judged_by, serve
from spyre_verify.workload import Arrival

MOST_FILLERS = 64  # fresh requests a scenario may serve to cycle the pool; a larger pool is not exercised
PREFIX_SEED = "spyre-verify prefix edges"  # the fresh tokens' stream: nothing else draws from it


def caching_on(config: Any) -> bool:
    """DESIGN "Prefix caching" Config.: a ragged config with `enable_prefix_caching` unset or on.
    From the raw fields (`derive.prefix_caching`), so any runtime's config can be asked."""
    return getattr(config, "layout", "padded") == "ragged" and prefix_caching(config)


class Fresh:
    """Prompt tokens for the prefix edges: whole blocks drawn from a stream of their own, none of them
    drawn twice, so a scenario's prompts share exactly the blocks it means them to (the workload's
    random prompts meet one of them only by a chance of about its blocks over vocab ** bs)."""

    def __init__(self, vocab: int, bs: int) -> None:
        self.rng, self.vocab, self.bs = random.Random(PREFIX_SEED), vocab, bs
        self.seen: set[tuple[int, ...]] = set()

    def block(self) -> tuple[int, ...]:
        for _ in range(64):
            b = tuple(self.rng.randrange(self.vocab) for _ in range(self.bs))
            if b not in self.seen:
                break
        else:  # a small vocabulary nearly used up: the first block not drawn yet, if any is left
            b = next((c for c in itertools.product(range(self.vocab), repeat=self.bs) if c not in self.seen), b)
        self.seen.add(b)
        return b

    def tokens(self, n: int) -> tuple[int, ...]:
        """n fresh tokens: whole fresh blocks, then the first tokens of one more."""
        out: tuple[int, ...] = ()
        while len(out) < n:
            out += self.block()
        return out[:n]

    def after(self, prefix: tuple[int, ...], n: int, unlike: tuple[int, ...] = ()) -> tuple[int, ...]:
        """`prefix`, then n fresh tokens whose first differs from `unlike`'s token there (a divergence)."""
        tail = list(self.tokens(n))
        if tail and len(unlike) > len(prefix) and tail[0] == unlike[len(prefix)]:
            tail[0] = (tail[0] + 1) % self.vocab
        return prefix + tuple(tail)


class CacheLog:
    """What the runtime said its prefix cache did while one scenario ran, from its events: the blocks
    each request found cached, the blocks registered (request -> index -> block), the blocks evicted,
    and which requests had ended when each hit came."""

    def __init__(self) -> None:
        self.hits: dict[str, tuple[int, ...]] = {}
        self.ended_at_hit: dict[str, frozenset[str]] = {}  # the requests ended when each hit came
        self.evicted_at_hit: dict[str, frozenset[object]] = {}  # and the hashes evicted by then
        self.registered: dict[str, dict[int, tuple[int, object]]] = {}  # request -> index -> (block, hash)
        self.evicted: list[tuple[int, object]] = []  # (block, hash), in order
        self.ended: dict[str, str] = {}
        self.events = 0

    def on_cache_hit(self, ev: Any) -> None:
        self.events += 1
        self.hits[ev.request_id] = tuple(ev.blocks)
        self.ended_at_hit[ev.request_id] = frozenset(self.ended)
        self.evicted_at_hit[ev.request_id] = frozenset(h for _, h in self.evicted)

    def on_cache_register(self, ev: Any) -> None:
        self.events += 1
        self.registered.setdefault(ev.request_id, {})[ev.index] = (ev.block, ev.hash)

    def on_cache_evict(self, ev: Any) -> None:
        self.events += 1
        self.evicted.append((ev.block, ev.hash))

    def hashes(self, rid: str | None) -> dict[int, object]:
        """`rid`'s registered blocks' hashes, by index (a block id is reused; a hash names one prefix)."""
        return {j: h for j, (_, h) in self.registered.get(rid or "", {}).items()}

    def on_finish(self, ev: Any) -> None:
        self.ended[ev.request_id] = ev.reason

    def got(self, rid: str | None) -> int:
        """Blocks `rid` found in the cache (0: no hit)."""
        return len(self.hits.get(rid, ())) if rid is not None else 0


@dataclass(frozen=True)
class Sent:
    """One request of a scenario: its role (A, B, F1 ...), the arrival, and what it is made of."""

    role: str
    arrival: Arrival
    about: str


class PrefixRun:
    """One prefix scenario on the drained runtime: its requests served through the serve loop with
    every checker attached, its record in `edges[]`, and the cache events it drew (`CacheLog`)."""

    def __init__(self, run: EdgeRun, name: str, rule: str) -> None:
        self.run, self.edge = run, Edge(name, rule, {})
        self.log = CacheLog()
        self.ids: dict[str, str | None] = {}
        self.sent: list[Sent] = []
        self.contract = "design_contract" in getattr(run.engine, "capabilities", ())

    def serve(self, sent: list[Sent]) -> None:
        """Serve the requests, each arrival at its step, until the runtime drains (or a bound of steps)."""
        engine, checkers = self.run.engine, self.run.checkers
        self.sent = sent
        cfg = engine.config
        T = max(1, getattr(cfg, "token_budget", cfg.max_model_len) - cfg.max_num_seqs + 1)
        bound = 8 + sum(s.arrival.step + -(-len(s.arrival.prompt) // T) + s.arrival.max_tokens for s in sent)
        feed = Feed([s.arrival for s in sent], engine.steps)
        detach = engine.subscribe(self.log)
        try:
            stats = serve(
                engine,
                feed,
                on_rejected=judged_by(checkers),
                on_abort=aborts_judged_by(checkers),
                max_steps=bound,
            )
        finally:
            detach()
        self.run.accepted, self.run.rejected = self.run.accepted + stats.accepted, self.run.rejected + stats.rejected
        self.ids = {s.role: rid for s, rid in zip(sent, feed.ids, strict=False)}
        a = sent[0].arrival
        self.edge.sent = {
            "prompt": "; ".join(f"{s.role}: {s.about}" for s in sent if not s.role.startswith("F"))
            + (f"; {n} fresh requests" if (n := sum(s.role.startswith("F") for s in sent)) else ""),
            "max_tokens": ", ".join(f"{s.role} {s.arrival.max_tokens}" for s in sent if not s.role.startswith("F")),
            "stop_token_ids": [],
            "ignore_eos": a.ignore_eos,
            "requests": [
                {
                    "role": s.role,
                    "prompt": listed(s.arrival.prompt),
                    "max_tokens": s.arrival.max_tokens,
                    "at_step": s.arrival.step,
                    "about": s.about,
                }
                for s in sent
            ],
        }
        finished = self.run.engine.finished
        reasons = {role: (str(finished[rid].reason) if rid in finished else None) for role, rid in self.ids.items()}
        roles = [s.role for s in sent if not s.role.startswith("F")]
        self.edge.did = {
            "request_ids": self.ids,
            "from_cache": {role: self.log.got(self.ids.get(role)) for role in self.ids},
            "registered": {role: len(self.log.registered.get(rid or "", {})) for role, rid in self.ids.items()},
            "evicted": len(self.log.evicted),
            "cache_events": self.log.events,
            "steps": stats.steps,
            "finish_reason": ", ".join(f"{r} {reasons[r] or 'not ended'}" for r in roles),
            "tokens": "blocks from the cache: " + ", ".join(f"{r} {self.log.got(self.ids.get(r))}" for r in roles),
        }
        if stats.stopped is not None:
            self.edge.did["stopped"] = stats.stopped

    def expect(self, plan: dict[str, int], planned: str) -> None:
        """Hold the cache hits the runtime reported to the scenario's plan (role -> blocks from the
        cache). The plan is DESIGN's on a drained runtime whose cache holds none of the fresh blocks;
        the checkers judge the runtime against DESIGN, so a miss of the plan alone is a note."""
        edge, log = self.edge, self.log
        edge.did["planned"] = plan
        refused = [r for r, rid in self.ids.items() if rid is None]
        if refused:
            edge.note = f"not exercised: the runtime refused {', '.join(refused)}"
        elif any(self.ids.get(r) not in self.run.engine.finished for r in self.ids):
            edge.note = f"not exercised: not every request had ended after {edge.did['steps']} steps"
        elif not log.events:
            edge.note = "not observed: the runtime reported no cache event (cache_hit, cache_register)"
        elif all(log.got(self.ids[r]) == n for r, n in plan.items()):
            edge.followed = True
            edge.note = planned
        else:
            got = ", ".join(f"{r} {log.got(self.ids[r])}" for r in plan)
            want = ", ".join(f"{r} {n}" for r, n in plan.items())
            edge.note = f"not as planned: blocks from the cache {got}, where the plan has {want}" + (
                "" if self.contract else " (the runtime does not claim DESIGN's contract)"
            )


@contextlib.contextmanager
def prefix_scenario(run: EdgeRun, name: str, rule: str) -> Iterator[PrefixRun]:
    """One prefix scenario, filed in `run.edges` with the violations raised while it ran: a scenario
    during which any checker flagged did not keep its rule, whatever its hits were."""
    others = list(run.checkers)
    before = [len(c.violations) for c in others]
    scenario = PrefixRun(run, name, rule)
    edge = scenario.edge
    try:
        yield scenario
    except Exception as e:  # the runtime raised (or a strict checker stopped it): filed, then passed on
        edge.note = f"stopped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise
    finally:
        edge.flagged = [f"{v.check}/{v.kind}" for c, n in zip(others, before, strict=True) for v in c.violations[n:]]
        if edge.flagged and edge.followed is not False:
            edge.followed = False
            edge.note = f"flagged while it ran ({edge.note})" if edge.note else "flagged while it ran"
        run.edges.append(edge)


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


def sizes(engine: Any) -> tuple[int, int, int, int, int]:
    """(bs, L, T, S, U): block size, max_model_len, the step token budget, max_num_seqs, usable blocks."""
    config = engine.config
    bs, L, S = config.block_size, config.max_model_len, config.max_num_seqs
    T = getattr(config, "token_budget", None) or max(min(L, 2048), S)
    total = getattr(config, "total_blocks", None) or engine.num_blocks
    return bs, L, T, S, total - 1


def fillers(fresh: Fresh, bs: int, L: int, most: int, total: int, step: int = 0) -> list[Sent] | None:
    """Fresh one-token requests whose prompts take `total` blocks in all, at most `most` blocks each
    (and each within max_model_len): what cycles the free list. None past MOST_FILLERS of them."""
    most = min(most, (L - 2) // bs + 1)
    if most < 1 or total < 0:
        return None
    out: list[Sent] = []
    while total > 0:
        r = min(most, total)
        p = (r - 1) * bs + 1  # r blocks, the last with one position written
        out.append(Sent(f"F{len(out) + 1}", Arrival(step, fresh.tokens(p), 1, ignore_eos=True), f"{p} fresh tokens"))
        total -= r
        if len(out) > MOST_FILLERS:
            return None
    return out


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
            Sent("B", Arrival(0, b, 2, ignore_eos=True), f"A's first {k} blocks, then {r} tokens of its own"),
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
