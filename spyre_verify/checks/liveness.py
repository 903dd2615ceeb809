"""Liveness: every accepted request ends, a runtime with work makes progress, and nothing stays
reserved for a request that has ended.

On any runtime, from the protocol's events: a request event opens a request, its finish event
closes it. At the end of a run that did not stop inside a step (a crash, a serving guard), a
runtime that still has work is stepped once more; a step that runs nothing while work is left is
a `stall` (the runtime can never finish what it holds), and a request that never ended on a
runtime with no work left is `never-ended`. That is also judged every time the serve loop finds
the runtime without work (`on_idle`), not only at the end: a server steps a runtime only while it
says it has work, so an accepted request it has not ended by then waits until another request
happens to arrive, and later traffic must not hide that it was dropped.

A runtime that offers `reservations` (request id -> blocks its scheduler holds in reserve) has
them judged after every step: a reservation of a request that ended before the step is
`leaked-reservation`, named with the request, how it ended and the blocks still held. Admission
counts reservations against the free pool, so leaked ones shrink what every later request can
get, until a request that fits the empty pool waits forever (the stall).
"""

from __future__ import annotations

from typing import Any

from spyre_verify.checks.violations import Checker


class Liveness(Checker):
    name = "liveness"
    judged_by = ("requests_ended",)

    def attach(self, engine: Any) -> None:
        self.engine = engine
        self.reserves = "reservations" in getattr(engine, "capabilities", frozenset())
        self.live: dict[str, int] = {}  # request id -> step it was accepted before
        self.ended: dict[str, tuple[int, str]] = {}  # request id -> (step it ended at, reason)
        self.leaked: set[str] = set()
        self.requests_ended = 0
        self.reservation_checks = 0
        self.stall_probed = False
        self.idle_flagged: set[str] = set()  # requests named by an idle runtime: not named again at the end
        self.open_step: int | None = None  # a step that dispatched and has not finished (it raised)
        super().attach(engine)

    def on_dispatch(self, ev: Any) -> None:
        self.open_step = ev.step

    def on_request(self, ev: Any) -> None:
        self.live[ev.request_id] = self.engine.steps

    def on_finish(self, ev: Any) -> None:
        self.live.pop(ev.request_id, None)
        self.ended[ev.request_id] = (ev.step, ev.reason)
        self.requests_ended += 1

    def on_idle(self, steps: int) -> None:
        """The serve loop found the runtime without work after `steps` steps."""
        lost = sorted(set(self.live) - self.idle_flagged)
        if not lost or self.open_step is not None:
            return
        self.idle_flagged.update(lost)
        self.flag(
            "never-ended",
            f"after step {steps - 1}: the runtime reported no work (has_work() false) while {len(lost)} accepted "
            f"request(s) had not ended: {', '.join(lost[:5])}; a server steps a runtime only while it has work, "
            "so these end only if another request happens to arrive",
        )

    def on_step(self, ev: Any) -> None:
        self.open_step = None
        if self.reserves:
            self.judge_reservations(ev.step)

    def judge_reservations(self, step: int, at: str | None = None) -> None:
        """Reservations held after `step` by requests that ended before it (`at` says when, else
        after that step)."""
        self.reservation_checks += 1
        held = self.engine.reservations()
        for rid, blocks in sorted(held.items()):
            end = self.ended.get(rid)
            if blocks <= 0 or end is None or end[0] >= step or rid in self.leaked:
                continue
            self.leaked.add(rid)
            total = sum(n for n in held.values() if n > 0)
            self.flag(
                "leaked-reservation",
                f"{at or f'after step {step}'}: {rid} ended ({end[1]}) at step {end[0]}, but the scheduler still reserves "
                f"{blocks} block(s) for it ({total} reserved in all, for {len(held)} ids); admission counts them "
                "against the free pool, so each leak shrinks what a later request can get",
            )

    def finish(self, engine: Any) -> None:
        stalled_after = self._probe(engine)
        if self.reserves:
            # As after a step: an abort after the last step is given the probe's step to release in,
            # or none when nothing was stepped (a runtime that releases at its next schedule is fine).
            end = f"at the end of the run (after step {engine.steps - 1})"
            self.judge_reservations(engine.steps + (1 if self.stall_probed else 0), end)
        if self.open_step is not None:
            return  # the run stopped inside a step (a crash, a guard)
        if stalled_after is not None:
            self._flag_stall(engine, stalled_after)
        if self.stall_probed:
            return  # the run left work: what it still holds is the stall's to name, or mid-flight
        lost = sorted(set(self.live) - self.idle_flagged)
        if lost:
            self.flag(
                "never-ended",
                f"{len(lost)} accepted request(s) never ended although the runtime has no work left: "
                f"{', '.join(lost[:5])}",
            )

    def _probe(self, engine: Any) -> int | None:
        """Step a runtime that still has work once; the last step before it when it runs nothing, else None.
        Never after a run that stopped inside a step: stepping again would repeat it."""
        if self.open_step is not None or not engine.has_work():
            return None
        before = engine.steps
        self.stall_probed = True
        engine.step()
        return before - 1 if engine.steps == before and engine.has_work() else None

    def _flag_stall(self, engine: Any, last: int) -> None:
        held = engine.reservations() if self.reserves else {}
        stale = {r: n for r, n in held.items() if n > 0 and r in self.ended}
        why = (
            f"; {sum(stale.values())} block(s) are still reserved for {len(stale)} ended request(s) "
            f"({', '.join(sorted(stale)[:5])})"
            if stale
            else ""
        )
        waiting = sorted(self.live)
        self.flag(
            "stall",
            f"after step {last}: the runtime has work ({len(waiting)} unfinished: {', '.join(waiting[:5])}) "
            f"but a step runs nothing, so it never finishes them{why}",
        )

    def observed(self) -> dict[str, Any]:
        out = {"requests_ended": self.requests_ended, "still_live": len(self.live)}
        return {**out, "reservation_checks": self.reservation_checks} if self.reserves else out
