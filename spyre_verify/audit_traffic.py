"""Coverage traffic for the audit: for every bucket the bucketer enumerates, a concrete
request sequence that dispatches to it, checked on a tensor-free replica of the engine
before it runs on the real one.

The constructions are the witnesses behind `runtime/reachability.py`'s closed form,
so each one needs no more pool than the bucketer's pruning assumed:

* decode at tkv T >= bs with s rows: a one-token request alone decodes up to T,
  then s - 1 one-token requests join (no shift) and the batch decodes at T;
* decode at T < bs: a second request joins at T + bs - 1 with a whole block of left
  padding, the first one finishes, the strip brings tkv down to T, s - 1 one-token
  requests join, and the batch decodes at T;
* prefill at post-shift tkv Y: a Y-token prompt alone (Y a block multiple), a
  one-token request joining a batch at Y, or a prompt that shifts a batch at
  bs + Y % bs up to Y.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runtime.block_pool import BlockPool
from runtime.bucketer import KERNELS, PREFILL, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.engine import StepResult
from runtime.errors import RuntimeErrorBase
from runtime.metadata import MetadataBuilder
from runtime.reachability import decode_blocks, min_decode_pool
from runtime.scheduler import Scheduler
from spyre_verify.workload import Arrival

Raw = list[tuple[int, int, int]]  # (step, prompt length, max_tokens) of each arrival


@dataclass(frozen=True)
class Scenario:
    target: Bucket
    witness: str  # the batch state the plan drives the engine into
    arrivals: tuple[Arrival, ...]  # `step` counts from the scenario's first step


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[Scenario, ...]
    unplanned: tuple[tuple[Bucket, str], ...]  # reachable buckets without a checked plan, and why


class PlanError(Exception):
    """A scenario did not run as planned (idle with arrivals pending, or a rejection)."""


class Replica:
    """Engine.step without tensors: the real scheduler, pool and builder, dummy tokens."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.bucketer = SpyreAttnBucketer(config)
        self.scheduler = Scheduler(config, BlockPool(config.total_blocks))
        self.builder = MetadataBuilder(self.bucketer)
        self.steps = 0

    def add_request(self, prompt: list[int], max_tokens: int) -> str:
        return self.scheduler.add(prompt, max_tokens)

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> StepResult:
        sched = self.scheduler
        adm = sched.next_admission()
        self.steps += 1
        if adm is not None:
            req = sched.admit(adm)
            bucket = self.builder.build_prefill(req.seq_state(), sched.tkv).bucket
            sched.record_prefill(req, 0)
            return StepResult("prefill", bucket, ())
        if sched.running:
            sched.grow_for_decode()
            bucket = self.builder.build_decode(sched.seq_states(), sched.tkv).bucket
            sched.record_decode([0] * len(sched.running))
            return StepResult("decode", bucket, ())
        return StepResult("idle", None, ())


def drive(engine: Any, arrivals: tuple[Arrival, ...], max_steps: int) -> list[Bucket]:
    """Run one scenario from an idle engine to idle again; the buckets it dispatched, in order."""
    start, pending, dispatched = engine.steps, list(arrivals), []
    while pending or engine.has_work():
        while pending and pending[0].step <= engine.steps - start:
            a = pending.pop(0)
            engine.add_request(list(a.prompt), a.max_tokens)
        if not engine.has_work():
            raise PlanError(f"engine idle at step {engine.steps - start} with {len(pending)} arrivals pending")
        if engine.steps - start >= max_steps:
            raise PlanError(f"scenario still busy after {max_steps} steps")
        result = engine.step()
        if result.bucket is not None:
            dispatched.append(result.bucket)
    return dispatched


def _arrival(step: int, prompt_len: int, max_tokens: int, vocab: int) -> Arrival:
    return Arrival(step, tuple((7 * i + 3) % vocab for i in range(prompt_len)), max_tokens)


def _decode_arrivals(bs: int, seqs: int, tkv: int) -> Raw:
    """(step, prompt length, max_tokens) that leave `seqs` rows decoding at `tkv`."""
    if tkv >= bs:
        # Alone from tkv bs up to tkv; its last token is the decode at tkv.
        return [(0, 1, tkv - bs + 2)] + [(tkv - bs + 1, 1, 2)] * (seqs - 1)
    # The second request joins at tkv + bs - 1 with one whole padding block; the first
    # finishes at that tkv's decode and the strip lowers tkv by a block, to `tkv`.
    return [(0, 1, tkv + 1), (tkv, tkv - 1, 3)] + [(tkv + 2, 1, 2)] * (seqs - 1)


def _prefill_arrivals(bs: int, tkv: int, how: str) -> Raw:
    if how == "alone":
        return [(0, tkv, 1)]
    if how == "join":
        return [(0, 1, tkv - bs + 2), (tkv - bs + 1, 1, 1)]
    low = bs + tkv % bs  # a batch there, shifted up by whole blocks to tkv
    return [(0, 1, low - bs + 2), (low - bs + 1, tkv - bs + 1, 1)]


def _prefill_options(config: RuntimeConfig, tkv: int) -> Iterator[tuple[int, str]]:
    """(pool needed, construction) for a prefill at post-shift `tkv`: reachability's options."""
    bs, L, two_slots = config.block_size, config.max_model_len, config.max_num_seqs >= 2
    if tkv % bs == 0 and tkv <= L - 1:
        yield tkv // bs, "alone"
    if two_slots and bs <= tkv <= L - 2:
        yield tkv // bs + 2, "join"
    if two_slots and 2 * bs <= tkv <= L - 1:
        yield math.ceil(tkv / bs) + 2, "shift"


def _candidates(b: SpyreAttnBucketer) -> dict[Bucket, list[tuple[str, Raw]]]:
    """Every witness the closed form allows, grouped by the bucket the bucketer maps it to."""
    c, lim = b.config, b.limits
    out: dict[Bucket, list[tuple[str, Raw]]] = {}
    for s in range(1, c.max_num_seqs + 1):
        for t in range(c.max_model_len - 1):
            need = min_decode_pool(lim, s, t)
            if need is not None and need <= lim.usable_blocks:
                bucket = b.decode_bucket(s, decode_blocks(lim, t))
                out.setdefault(bucket, []).append(
                    (f"{s} seqs decoding at tkv {t}", _decode_arrivals(c.block_size, s, t))
                )
    for y in range(1, c.max_model_len):
        for need, how in _prefill_options(c, y):
            if need <= lim.usable_blocks:
                bucket = b.prefill_bucket(math.ceil(y / c.block_size) * c.block_size)
                out.setdefault(bucket, []).append(
                    (f"prefill {how} at tkv {y}", _prefill_arrivals(c.block_size, y, how))
                )
    for options in out.values():
        # The shortest scenario first: every step generates at least one token.
        options.sort(key=lambda o: (sum(a[2] for a in o[1]), len(o[1])))
    return out


def check_scenario(config: RuntimeConfig, scenario: Scenario) -> str | None:
    """Run a scenario on a fresh replica; None when it dispatches its target, else why not."""
    try:
        seen = drive(Replica(config), scenario.arrivals, 4 * config.max_model_len + 8)
    except (PlanError, RuntimeErrorBase, AssertionError) as e:
        return f"{type(e).__name__}: {e}"
    return None if scenario.target in seen else f"dispatched {sorted(set(map(str, seen)))} but not {scenario.target}"


def coverage_plan(config: RuntimeConfig) -> Plan:
    """One checked scenario per reachable bucket, in the bucketer's enumeration order."""
    b = SpyreAttnBucketer(config)
    vocab = config.model.vocab_size
    witnesses = _candidates(b)
    scenarios, unplanned = [], []
    for kernel in KERNELS:
        for bucket in b.buckets(kernel):
            why = "no batch state in the closed form maps to it" if kernel != PREFILL else "no prefill tkv maps to it"
            for witness, raw in witnesses.get(bucket, []):
                scenario = Scenario(bucket, witness, tuple(_arrival(*a, vocab) for a in raw))
                failure = check_scenario(config, scenario)
                if failure is None:
                    scenarios.append(scenario)
                    break
                why = f"{witness}: {failure}"
            else:
                unplanned.append((bucket, why))
    return Plan(tuple(scenarios), tuple(unplanned))
