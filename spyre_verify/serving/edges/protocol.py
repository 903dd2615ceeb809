"""The edge traffic served after the seeded workload.

On a `design_contract` runtime: requests at the edge of admission, aborts of running requests
right after another's prefill, and (ragged) a prompt split into chunks beside decoding rows. Each
is a short list of `workload` items, served like the workload.

On every runtime: the protocol edges (`protocol_edges`), one scenario a refusal and ending rule of
CONTRACT "Requests", each served alone on the drained runtime and recorded (`Edge`): what was sent,
what the runtime did, and whether it kept the rule. The checkers judge them as any traffic;
`EdgeRules` flags a broken rule that no other checker flagged while the scenario ran."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.config import RuntimeConfig
from spyre_verify.checks.violations import Checker
from spyre_verify.serving.serve_loop import Feed, aborts_judged_by, idles_judged_by, judged_by, refusal, serve
from spyre_verify.serving.workload import LONG_TOKENS, Abort, Arrival, Item


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


# -- protocol edges: every runtime, every config ------------------------------------------------

EOS_TRIES = 16  # one-token prompts tried for one whose greedy reference run ends in EOS
STEPS = 64  # steps a scenario's request may take to end (it asks for at most MOST tokens)
MOST = 4  # the tokens a scenario's request asks for, at most
UNKNOWN_ID = "spyre-verify-never-issued"  # an id no runtime returned
SHOWN = 8  # a prompt or stop list longer than this is reported by its length
ABORT_RULE = "an abort of an id that is not live raises the runtime's refusal (a ValueError)"
# The kinds another checker names each edge rule by: edge-rules flags a broken rule only when none came up.
SAME_RULE = {
    "silent-abort": {"silent-abort", "divergence"},  # contract-conformance; a divergence: it aborted something
    "stop-ignored": {"finish-reason"},
    "eos-ignored": {"finish-reason"},
    "length-ignored": {"finish-reason"},
}


@dataclass
class Edge:
    """One protocol scenario: what was sent, what the runtime did, and whether it kept the rule
    (`followed` None: not exercised, and `note` says why). `flagged` names the violations
    ("check/kind") raised while it ran: the other checkers', and edge-rules' own where none of
    them named its rule."""

    name: str
    rule: str
    sent: dict[str, Any]
    did: dict[str, Any] = field(default_factory=dict)
    followed: bool | None = None
    note: str = ""
    flagged: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class EdgeRules(Checker):
    """The judge of last resort of the protocol edges: a scenario whose rule the runtime broke while
    no other checker flagged it (`SAME_RULE`) is flagged here, by the rule's kind: `silent-abort` (an abort
    of an ended, refused or unknown id returned instead of raising the runtime's refusal),
    `stop-ignored` (a request went on past one of its stop tokens, or ended on it with another
    reason), `eos-ignored` (the same for EOS without ignore_eos) and `length-ignored` (max_tokens 1
    did not end the request after one token with reason `length`). On a `design_contract` runtime
    contract-conformance catches each first (`silent-abort`, `finish-reason`); without it nothing
    else judges an abort, nor an ending on a runtime without `reference`."""

    name = "edge-rules"
    judged_by = ("exercised",)

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        self.scenarios = self.exercised = 0

    def attach(self, engine: Any) -> None:
        """It observes no event: the scenarios report to it."""

    def judge(self, edge: Edge, kind: str) -> None:
        self.scenarios += 1
        self.exercised += edge.followed is not None
        if edge.followed is False and not SAME_RULE[kind] & {f.split("/")[-1] for f in edge.flagged}:
            edge.flagged.append(f"{self.name}/{kind}")
            self.flag(kind, f"edge scenario {edge.name}: {edge.note}")

    def observed(self) -> dict[str, Any]:
        return {"scenarios": self.scenarios, "exercised": self.exercised}


def fitting_tokens(config: Any, p: int) -> int:
    """The most tokens (up to MOST) a p-token prompt may ask for and be admitted alone: padded (and
    any layout but ragged), the prompt padded to a block must leave room and, from 2 tokens, its
    lone decode peak must fit the volume limit; ragged, unpadded. 0: none fits."""
    L, bs = config.max_model_len, config.block_size
    if getattr(config, "layout", "padded") == "ragged":
        return max(0, min(MOST, L - p))
    used = math.ceil(p / bs) * bs
    most, limit = max(0, min(MOST, L - used)), getattr(config, "max_batch_tkv_limit", None)
    return most if limit is None or most < 2 else max(1, min(most, limit - used + 1))


def ending_breach(tokens: Sequence[int], reason: str, stops: set[int], max_tokens: int) -> str | None:
    """Why an ending breaks CONTRACT "Finishing", or None: a request ends on its first stop token
    with reason stop, else after max_tokens tokens with reason length."""
    first = next((i for i, t in enumerate(tokens) if t in stops), None)
    if first is not None and (first != len(tokens) - 1 or reason != "stop"):
        return (
            f"token {first} ({tokens[first]}) is a stop token, but the request ended after {len(tokens)} "
            f"tokens with reason {reason!r}"
        )
    if first is None and (reason != "length" or len(tokens) != max_tokens):
        return (
            f"it ended with reason {reason!r} after {len(tokens)} tokens, none a stop token, of max_tokens={max_tokens}"
        )
    return None


def next_id(rid: str) -> str:
    """The id after `rid` in the runtime's own numbering (req-7 -> req-8); else one made from it."""
    m = re.fullmatch(r"(.*?)(\d+)", rid)
    return f"{m[1]}{int(m[2]) + 1}" if m else f"{rid}-next"


def listed(tokens: Sequence[int], what: str = "tokens") -> Any:
    return list(tokens) if len(tokens) <= SHOWN else f"{len(tokens)} {what}"


def sent_of(a: Arrival) -> dict[str, Any]:
    stops = listed(a.stop_token_ids, "stop tokens: every token of the vocabulary")
    return {"prompt": listed(a.prompt), "max_tokens": a.max_tokens, "stop_token_ids": stops, "ignore_eos": a.ignore_eos}


class EdgeRun:
    """Serves the protocol edges one at a time on a drained runtime: each request through the serve
    loop, each abort judged as the serve loop judges one, so that every checker sees them."""

    def __init__(self, engine: Any, checkers: Sequence[Checker], into: list[Edge] | None = None) -> None:
        self.engine, self.checkers = engine, checkers
        self.rules = next((c for c in checkers if isinstance(c, EdgeRules) and c.not_run is None), None)
        self.edges = into if into is not None else []
        self.accepted = self.rejected = 0
        config = engine.config
        self.vocab, self.eos = config.model.vocab_size, config.model.eos_token_id
        self.max_tokens = fitting_tokens(config, 1)
        self.prompt = (1,)
        self.reference = "reference" in engine.capabilities

    @contextlib.contextmanager
    def scenario(self, name: str, rule: str, sent: dict[str, Any], kind: str) -> Iterator[Edge]:
        """One scenario: its record, filed with the violations raised while it ran, then judged by
        edge-rules under `kind` when it has none."""
        edge, others = Edge(name, rule, sent), [c for c in self.checkers if c is not self.rules]
        before = [len(c.violations) for c in others]
        yield edge
        edge.flagged = [f"{v.check}/{v.kind}" for c, n in zip(others, before, strict=True) for v in c.violations[n:]]
        self.edges.append(edge)
        if self.rules is not None:
            self.rules.judge(edge, kind)

    def add(self, a: Arrival) -> tuple[str | None, str]:
        """Serve `a` alone until the runtime drains; (its request id, or None and the refusal's words)."""
        feed, why, judge = Feed([a], self.engine.steps), [], judged_by(self.checkers)

        def refused(arrival: Arrival, e: ValueError) -> None:
            judge(arrival, e)
            why.append(f"{type(e).__name__}: {e}")

        stats = serve(
            self.engine,
            feed,
            on_rejected=refused,
            on_abort=aborts_judged_by(self.checkers),
            on_idle=idles_judged_by(self.checkers),
            max_steps=STEPS,
        )
        self.accepted, self.rejected = self.accepted + stats.accepted, self.rejected + stats.rejected
        return feed.ids[0], why[0] if why else ""

    def abort(self, rid: str) -> str | None:
        """Abort `rid`, judged by the checkers as the serve loop judges it; the refusal's words, or None."""
        try:
            self.engine.abort(rid)
        except refusal(self.engine) as e:
            aborts_judged_by(self.checkers)(rid, True)
            return f"{type(e).__name__}: {e}"
        aborts_judged_by(self.checkers)(rid, False)
        return None

    def ending(self, edge: Edge, a: Arrival, target: int | None) -> str | None:
        """Serve `a` and judge how it ended; `target` is the stop token it is meant to end on (None:
        any). Its request id."""
        if a.max_tokens < 1:
            edge.note = "not exercised: no request fits this config's max_model_len"
            return None
        rid, why = self.add(a)
        done = self.engine.finished.get(rid) if rid is not None else None
        if done is None:
            edge.did = {"refused": why} if rid is None else {"request_id": rid, "ended": False}
            edge.note = "not exercised: " + (why or f"it had not ended after {STEPS} steps (liveness judges it)")
            return rid
        tokens, reason = tuple(done.tokens), str(done.reason)
        edge.did = {"request_id": rid, "finish_reason": reason, "tokens": listed(tokens)}
        stops = set(a.stop_token_ids) | (set() if a.ignore_eos else {self.eos})
        breach = ending_breach(tokens, reason, stops, a.max_tokens)
        if breach is not None:
            edge.followed, edge.note = False, breach
        elif target is None or target in tokens:
            edge.followed = True
        else:
            edge.note = f"not exercised: it never generated {target} (output-equivalence judges its tokens)"
        return rid

    def stop_for(self, ignore_eos: bool) -> tuple[tuple[int, ...], int | None, str]:
        """(stop tokens, the one it should end on, in words): the reference's first greedy token after
        the first that has not come before (so the request decodes before it stops); without a
        reference, every token of the vocabulary, so it ends on its first."""
        toks = (
            self.engine.reference(list(self.prompt), self.max_tokens, (), ignore_eos).tokens if self.reference else ()
        )
        picks = [i for i, t in enumerate(toks) if t not in toks[:i] and t != self.eos]
        k = next((i for i in picks if i >= 1), picks[0] if picks else None)
        if k is None:
            return tuple(range(self.vocab)), None, "every token is a stop token: it ends on its first, reason stop"
        return (toks[k],), toks[k], f"the reference generates {toks[k]} as token {k}: it ends there, reason stop"

    def eos_prompt(self) -> tuple[int, ...] | str:
        """A one-token prompt whose greedy reference run ends in EOS within max_tokens, or why none."""
        if not self.reference:
            return "not exercised: the runtime offers no reference to find a prompt whose greedy output reaches EOS"
        tries = sorted({i * self.vocab // EOS_TRIES for i in range(EOS_TRIES)})
        for t in tries if self.max_tokens >= 1 else ():
            if self.engine.reference([t], self.max_tokens).reason == "stop":
                return (t,)
        return (
            f"not exercised: none of {len(tries)} one-token prompts makes the reference generate EOS "
            f"({self.eos}) within {self.max_tokens} tokens"
        )


def protocol_edges(engine: Any, checkers: Sequence[Checker], into: list[Edge] | None = None) -> EdgeRun:
    """On any runtime, one scenario a refusal and ending rule of CONTRACT "Requests": max_tokens 1;
    aborts of its ended id, of the id a refused add would have had and of an unknown id; a stop
    token without and with ignore_eos; EOS. Each is served alone, once the runtime has drained."""
    run = EdgeRun(engine, checkers, into)
    for scenario in (ended_and_refused, unknown_abort, stop_edges, eos_edge):
        if engine.has_work():  # a request that did not end: what follows would not run alone
            break
        scenario(run)
    return run


def abort_edge(run: EdgeRun, name: str, rid: str | None, sent: dict[str, Any], missing: str = "") -> None:
    """Abort `rid`, which is not live: the runtime must refuse it. `missing`: why there is no id."""
    with run.scenario(name, ABORT_RULE, {"abort": rid, **sent}, "silent-abort") as edge:
        if rid is None:
            edge.note = f"not exercised: {missing}"
            return
        why = run.abort(rid)
        edge.did, edge.followed = {"refused": why is not None, "refusal": why}, why is not None
        edge.note = "" if why else f"abort({rid!r}) returned instead of raising its refusal: a silent no-op"


def ended_and_refused(run: EdgeRun) -> None:
    """max_tokens 1, then an abort of that ended request, then the refused-id abort."""
    a = Arrival(0, run.prompt, 1, ignore_eos=True)
    rule = "max_tokens 1 ends the request after its first token, reason length"
    with run.scenario("max-tokens-1", rule, sent_of(a), "length-ignored") as edge:
        rid = run.ending(edge, a, None)
    ended = rid if rid is not None and rid in run.engine.finished else None
    abort_edge(run, "abort-ended", ended, {"after": "it ended"}, "the max-tokens-1 request did not end")
    refused_abort(run, rid)


def refused_abort(run: EdgeRun, last: str | None) -> None:
    """A refused add (a prompt longer than max_model_len) returns no id: abort the one it would have
    had, the id after the last one returned (`next_id`)."""
    L = run.engine.config.max_model_len
    taken, why = run.add(Arrival(0, tuple((5 * i + 1) % run.vocab for i in range(L + 1)), 1))
    sent = {"after": f"an add of {L + 1} prompt tokens (over max_model_len): {why or f'accepted as {taken}'}"}
    missing = "the long add was accepted" if taken is not None else "no id was returned before it to count on from"
    abort_edge(run, "abort-refused", next_id(last) if last is not None and taken is None else None, sent, missing)


def unknown_abort(run: EdgeRun) -> None:
    abort_edge(run, "abort-unknown", UNKNOWN_ID, {"after": "no request was ever given this id"})


def stop_edges(run: EdgeRun) -> None:
    """A stop token the request will meet, without and with ignore_eos: it ends there, reason stop."""
    for ignore in (False, True):
        stops, target, expect = run.stop_for(ignore)
        a = Arrival(0, run.prompt, run.max_tokens, stops, ignore)
        rule = "a stop token ends the request, reason stop" + (", ignore_eos or not" if ignore else "")
        with run.scenario(
            "stop-ignore-eos" if ignore else "stop", rule, {**sent_of(a), "expect": expect}, "stop-ignored"
        ) as edge:
            run.ending(edge, a, target)


def eos_edge(run: EdgeRun) -> None:
    """A prompt whose greedy output reaches EOS, without ignore_eos: it ends there, reason stop."""
    found = run.eos_prompt()
    a = Arrival(0, found if isinstance(found, tuple) else run.prompt, run.max_tokens)
    sent = {**sent_of(a), "expect": f"the reference ends on EOS ({run.eos})"} if isinstance(found, tuple) else {}
    with run.scenario("eos", "EOS ends a request without ignore_eos, reason stop", sent, "eos-ignored") as edge:
        if isinstance(found, str):
            edge.note = found
            return
        run.ending(edge, a, run.eos)
