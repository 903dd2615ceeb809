"""Crowd traffic: for a runtime without `design_contract`, whose reachable set the harness
cannot walk, traffic that forms every batch width at every length rung, so that what warmup
compiled is served (and a bucket it skipped is reached cold).

Each wave starts from an idle runtime and is served until it drains:

- a **crowd**: `w` requests (1 to `max_num_seqs`) arriving together, prompts at a KV rung's
  lower edge (and one token), each decoding a few steps past it: `w + 2` tokens, so that
  in a layout that admits one request a step the first is still decoding when the last
  joins. One crowd per width and rung: a few steps per rung, never the whole length.
- a **crowd behind a leader**: one request decodes once, then `w - 1` one-token requests
  join it. Left padding puts whole null blocks in the joiners' rows, so a small pool holds
  a wide batch; a decode of all of them follows.
- a **handoff**: a leader ends while a second request it was padding runs on, then `w - 1`
  join the survivor. A layout that strips the dead padding decodes a wide batch at the
  lowest KV rung, which no crowd reaches.
- a **late joiner** at every length rung: a one-token request decodes, then a prompt of
  that length joins it (a batch raised to the top prefill rung), and the same prompt alone.

The lengths are the runtime's own (`runtime.ladders()`, read as `hunt.protocol_trace` reads
them) and DESIGN's for the config the harness built it from (`oracle.derive.ladders`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spyre_verify.checks.dispatch import DispatchCoverage
from spyre_verify.hunt.bounded import EXAMPLES, SEED, bounded_hunt
from spyre_verify.hunt.protocol_trace import Refusals, ladder_unit
from spyre_verify.messages import Progress
from spyre_verify.oracle.derive import ladders as design_ladders
from spyre_verify.runtimes.protocol import layout_of
from spyre_verify.serving.serve_loop import DRAINED, judging, serve
from spyre_verify.serving.traffic import prompt
from spyre_verify.serving.workload import Abort, Arrival, Item


@dataclass(frozen=True)
class Sizes:
    block_size: int
    max_model_len: int
    max_num_seqs: int
    vocab_size: int
    ragged: bool

    def room(self, p: int) -> int:
        """Tokens a prompt of `p` may ask for: padded, the prompt is padded to a block first."""
        used = p if self.ragged else math.ceil(p / self.block_size) * self.block_size
        return self.max_model_len - used


@dataclass(frozen=True)
class Wave:
    name: str
    items: tuple[Item, ...]

    @property
    def tokens(self) -> int:
        return sum(len(a.prompt) + a.max_tokens for a in self.items if isinstance(a, Arrival))


def token_rungs(runtime: Any, config: Any) -> tuple[int, ...]:
    """Every rung of the runtime's own ladders and of DESIGN's for `config`, in tokens (a ladder
    counted in blocks is scaled by the block size; batch ladders are left out: widths cover them)."""
    c = runtime.config
    out: set[int] = set()
    for name, rungs in runtime.ladders().items():
        unit = ladder_unit(name, rungs, c)
        if unit != "batch":
            out.update(r * c.block_size if unit == "blocks" else r for r in rungs)
    if config is not None:
        lad = design_ladders(config)
        out.update(r * lad.block_size for r in lad.kv_blocks)
        out.update(lad.prefill_tokens + lad.query_tokens)
    return tuple(sorted(out))


def _arrivals(sizes: Sizes, spec: Iterable[tuple[int, int, int]], salt: int) -> tuple[Item, ...]:
    """(step, prompt length, max_tokens) as arrivals that run to their length."""
    return tuple(
        Arrival(step, prompt(p, sizes.vocab_size, salt + i), mt, ignore_eos=True)
        for i, (step, p, mt) in enumerate(spec)
    )


def waves(sizes: Sizes, rungs: Iterable[int]) -> list[Wave]:
    """The whole plan: crowds per width and KV edge, then leaders, handoffs and late joiners."""
    bs, L, S = sizes.block_size, sizes.max_model_len, sizes.max_num_seqs
    rungs = sorted({r for r in rungs if 1 <= r <= L})
    edges = sorted({1} | {r for r in rungs if r % bs == 0 and r < L - 1})  # where a KV rung is entered
    out: list[Wave] = []
    for w in range(1, S + 1):
        for p in edges:
            out += _at_edge(sizes, w, p)
        out += _handoffs(sizes, w)
    for t in sorted({2, L - 1, *rungs, *(e + 1 for e in edges)}):
        out += _late(sizes, min(t, L - 1))
    return out


def _at_edge(sizes: Sizes, w: int, p: int) -> list[Wave]:
    """`w` rows decoding at the KV rung entered at `p` tokens: all of that length; one of that
    length leading one-token joiners; one-token rows and then the long one, all at once (it
    raises the batch, so the short rows' rows start with null blocks and fit a small pool)."""
    out = []
    mt = min(w + 2, sizes.room(p))
    if mt >= 1:
        out.append(Wave(f"a crowd of {w} x add(prompt {p}, max_tokens {mt})", _arrivals(sizes, [(0, p, mt)] * w, w)))
    if w < 2 or sizes.room(p) < 3 or sizes.room(1) < 2:
        return out
    lead = min(w + 3, sizes.room(p))
    join = max(2, min(w, sizes.room(1)))  # each joiner outlives the later ones' prefills
    spec = [(0, p, lead)] + [(2, 1, join)] * (w - 1)
    out.append(
        Wave(
            f"{w - 1} x add(prompt 1, max_tokens {join}) behind add(prompt {p}, max_tokens {lead})",
            _arrivals(sizes, spec, w),
        )
    )
    short = min(w + 1, sizes.room(1))
    spec = [(0, 1, short)] * (w - 1) + [(0, p, 2)]
    out.append(
        Wave(
            f"{w - 1} x add(prompt 1, max_tokens {short}), then add(prompt {p}, max_tokens 2)",
            _arrivals(sizes, spec, w),
        )
    )
    return out


def _late(sizes: Sizes, p: int) -> list[Wave]:
    """A prompt of `p` alone; joining one request that has decoded once (a batch it raises to
    the top prefill rung); and joining up to three decoding rows (a step's token budget, less
    one per decoding row, splits a prompt near the length into a long chunk and a short one)."""
    if sizes.room(p) < 1:
        return []
    out = [Wave(f"add(prompt {p}, max_tokens 1)", _arrivals(sizes, [(0, p, 1)], 0))]
    if sizes.room(1) >= 3:
        spec = [(0, 1, 3), (2, p, 1)]
        out.append(Wave(f"add(prompt {p}, max_tokens 1) joining a decode", _arrivals(sizes, spec, 1)))
    k = min(sizes.max_num_seqs - 1, 3)
    if k >= 2 and sizes.room(1) >= 4:
        spec = [(0, 1, 4)] * k + [(k, p, 1)]
        out.append(Wave(f"add(prompt {p}, max_tokens 1) joining {k} decoding rows", _arrivals(sizes, spec, 2)))
    return out


def _handoffs(sizes: Sizes, w: int) -> list[Wave]:
    """`w` rows decoding after the request that padded them left: it ends (or is aborted right
    after their prefills), and a layout that strips dead padding decodes them at the lowest rungs."""
    if sizes.room(1) < 4:
        return []
    S = sizes.max_num_seqs
    spec = [(0, 1, 3), (2, 1, 3 + w)] + [(4, 1, 2)] * (w - 1)
    out = [Wave(f"{w - 1} x add(prompt 1, max_tokens 2) after a handoff", _arrivals(sizes, spec, w))]
    k = min(w, S - 1)
    if k >= 1:
        items = [*_arrivals(sizes, [(0, 1, 4)] + [(2, 1, 3)] * k + [(2 + k, 1, 2)] * (w - k), w)]
        items.insert(1 + k, Abort(2 + k, 0))  # after the joiners' prefills, before the late ones join
        out.append(Wave(f"{k} x add(prompt 1, max_tokens 3) left alone by an abort, {w - k} more", tuple(items)))
    return out


def sizes_of(runtime: Any) -> Sizes:
    c = runtime.config
    return Sizes(c.block_size, c.max_model_len, c.max_num_seqs, c.model.vocab_size, layout_of(runtime) == "ragged")


@dataclass
class CrowdRun:
    planned: int = 0  # waves
    waves: int = 0  # waves served until the runtime drained
    steps: int = 0
    refused: int = 0
    hunt_examples: int = 0
    hunt_steps: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, message); the traffic stopped at the first

    def summary(self) -> dict[str, Any]:
        return {
            "waves_planned": self.planned,
            "waves": self.waves,
            "steps": self.steps,
            "refused": self.refused,
            "hunt_examples": self.hunt_examples,
            "hunt_steps": self.hunt_steps,
            "problems": [f"{kind}: {message}" for kind, message in self.problems],
        }


def crowd_traffic(
    runtime: Any,
    config: Any,
    observers: Sequence[Any] = (),
    progress: Progress | None = None,
    run: CrowdRun | None = None,
) -> CrowdRun:
    """Every wave of the plan from an idle runtime until it drains, then a bounded protocol hunt
    (`hunt.bounded`, seeded); each refusal must leave the pool as it was. The runtime's own
    exceptions propagate (its state is no longer trusted): pass `run` to keep the counts so far."""
    plan = waves(sizes_of(runtime), token_rungs(runtime, config))
    run = run if run is not None else CrowdRun()
    run.planned = len(plan)
    if progress:
        progress(f"crowd traffic: {len(plan)} waves (every width at every length rung), then {EXAMPLES} hunt traces")
    start, guard = runtime.steps, Refusals(runtime)
    for wave in plan:
        stats = serve(
            guard,
            wave.items,
            **judging(observers),
            max_steps=wave.tokens + 8,
        )
        run.refused += stats.rejected
        run.steps = runtime.steps - start
        run.problems += [(kind, f"{wave.name}: {message}") for kind, message in guard.problems]
        if stats.stopped != DRAINED:
            run.problems.append(("left-busy", f"{wave.name}: the runtime still had work after {stats.steps} steps"))
        if run.problems:
            return run
        run.waves += 1
    hunt = bounded_hunt(runtime, observers, EXAMPLES, SEED)
    run.hunt_examples, run.hunt_steps = hunt.examples, hunt.steps
    trace = "; ".join(hunt.trace)
    run.problems += [(kind, f"protocol hunt, trace [{trace}]: {message}") for kind, message in hunt.problems]
    return run


def crowd_traffic_for_check(
    runtime: Any, config: Any, checkers: Sequence[Any], progress: Progress | None = None
) -> dict[str, Any]:
    """`crowd_traffic` under `check`'s checkers: its problems are dispatch-coverage's violations,
    and once it has run to its end every warm bucket it left unserved is one too."""
    run = crowd_traffic(runtime, config, checkers, progress)
    dispatch = next((c for c in checkers if isinstance(c, DispatchCoverage) and c.not_run is None), None)
    if dispatch is not None:
        for kind, message in run.problems:
            dispatch.traffic_problem(kind, message)
        dispatch.require_served = not run.problems
    return run.summary()
