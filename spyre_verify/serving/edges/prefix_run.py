"""What the prefix-cache edges (`edges.prefix`) are served with: fresh prompt tokens no other
traffic draws (`Fresh`), the cache events each scenario causes (`CacheLog`), one scenario's run on
the drained runtime (`PrefixRun`, `prefix_scenario`), and the sizes that fit them to a config."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from spyre_verify.oracle.derive import prefix_caching, token_budget, usable_blocks
from spyre_verify.serving.edges.protocol import Edge, EdgeRun, listed
from spyre_verify.serving.serve_loop import Feed, judging, serve
from spyre_verify.serving.workload import Arrival

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
            stats = serve(engine, feed, **judging(checkers), max_steps=bound)
        finally:
            detach()
        self.run.accepted, self.run.rejected = self.run.accepted + stats.accepted, self.run.rejected + stats.rejected
        self.ids = {s.role: rid for s, rid in zip(sent, feed.ids, strict=False)}
        # Several requests, each with its role: `sent.requests[]`, not one add's fields.
        self.edge.sent = {
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
        self.edge.did = {
            "request_ids": self.ids,
            "finish_reasons": {
                role: (str(finished[rid].reason) if rid in finished else None) for role, rid in self.ids.items()
            },
            "from_cache": {role: self.log.got(self.ids.get(role)) for role in self.ids},
            "registered": {role: len(self.log.registered.get(rid or "", {})) for role, rid in self.ids.items()},
            "evicted": len(self.log.evicted),
            "cache_events": self.log.events,
            "steps": stats.steps,
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


def sizes(engine: Any) -> tuple[int, int, int, int, int]:
    """(bs, L, T, S, U): block size, max_model_len, the step token budget, max_num_seqs, usable blocks."""
    config = engine.config  # the harness's: T and U derived from its raw fields, as the oracle does
    return config.block_size, config.max_model_len, token_budget(config), config.max_num_seqs, usable_blocks(config)


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
