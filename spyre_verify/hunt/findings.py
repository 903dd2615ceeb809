"""A hunt finding: the shrunk config, the batch state, the bucket and the warm ladder it missed,
and a pytest test that re-runs its property on exactly this case (`Finding.test_body`).

(`spyre-verify replay`, in `cli/replay.py`, reads a finding back from its report entry.) Also
how the hunt tells the runtime's crashes (findings) from its own (internal errors).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import runtime
import spyre_verify
from runtime.bucketer import BATCHED, PREFILL, BatchedKey, Bucket
from runtime.config import RuntimeConfig
from spyre_verify.hunt.strategies import Op, StepPoint
from spyre_verify.oracle.derive import kv_dim
from spyre_verify.oracle.walk import Action
from spyre_verify.report import config_payload

if TYPE_CHECKING:
    from spyre_verify.hunt.world import World

# The check each property's pytest line calls.
PROTOCOL = "protocol"  # the property that hunts a --runtime through the protocol alone
CHECKS = {
    "dispatch": "check_trace",
    "padding": "check_trace",
    "warmup": "check_warmup",
    "ladders": "check_ladders",
    "config": "check_config",
}
RUNTIME_DIR = str(Path(runtime.__file__).parent)
HARNESS_DIR = str(Path(spyre_verify.__file__).parent)
RUNTIME_CONFIG = "from runtime.config import RuntimeConfig"
# The last line of every test body: fail naming each finding as the hunt names it.
ASSERT = "assert not found, '\\n'.join(f.headline for f in found)"


def _where(e: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of either the runtime or the harness, skipping the stdlib and torch."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith((RUNTIME_DIR, HARNESS_DIR))]
    return frames[-1] if frames else None


def from_runtime(e: BaseException) -> bool:
    """Whether the runtime under test raised `e` (a finding), not the harness (an internal error)."""
    frame = _where(e)
    return frame is not None and frame.filename.startswith(RUNTIME_DIR)


def crash(
    prop: str, config: RuntimeConfig | None, fault: str | None, e: BaseException, events: Sequence[Op] = ()
) -> Finding:
    """A `runtime-error` finding: the exception, the runtime line that raised it, and the
    notes on it (a strategy notes the config it was drawing; config None: it never got one)."""
    f = _where(e)
    at = f" at {Path(f.filename).relative_to(Path(RUNTIME_DIR).parent)}:{f.lineno} in {f.name}" if f else ""
    first = str(e).splitlines()[0] if str(e) else ""
    notes = "".join(f" ({n})" for n in getattr(e, "__notes__", ()))
    msg = f"the runtime raised {type(e).__name__}{at}: {first}{notes}"
    drawn = drawn_case(e) if config is None else None
    details = {"kwargs": drawn[0], "env": drawn[1]} if drawn else {}
    return Finding(prop, "runtime-error", msg, fault, config, events=tuple(events) if events else None, details=details)


# The note `strategies.draw_config` adds to a refusal of the config it was drawing.
_DRAWING = re.compile(r"drawing RuntimeConfig\.from_env\((\{.*?\}), \*\*(\{.*\})\)")


def drawn_case(e: BaseException) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(kwargs, env) of the `RuntimeConfig.from_env` call a strategy was drawing when the runtime
    raised: its note writes both with repr, so they read back; None without such a note."""
    for note in getattr(e, "__notes__", ()):
        if m := _DRAWING.fullmatch(note):
            try:
                env, kwargs = ast.literal_eval(m[1]), ast.literal_eval(m[2])
            except (ValueError, SyntaxError):
                return None
            return kwargs, env
    return None


def ops_for(actions: Sequence[Action]) -> tuple[Op, ...]:
    """A walk witness as hunt events: a join is an add and one step, a decode one step, and an
    abort (of the witness's index-th join, which is its index-th add) is an abort. A join sharing
    blocks with the index-th join's prompt shares them with the index-th add's."""
    out: list[Op] = []
    for a in actions:
        if a.kind == "abort":
            out.append(Op("abort", ref=a.index))
            continue
        if a.kind == "join":
            out.append(Op("add", a.prompt_len, a.max_tokens, ref=a.index if a.shared else 0, share=a.shared))
        if out and out[-1].kind == "step":
            out[-1] = Op("step", steps=out[-1].steps + 1)
        else:
            out.append(Op("step"))
    return tuple(out)


def warm_ladder(warm: Iterable[Bucket], kernel: str) -> dict[str, Any]:
    """The rungs warmup recorded for one kernel: its KV dimension, and num_seqs for batched."""
    mine = sorted(b for b in warm if b.kernel == kernel)
    out: dict[str, Any] = {
        "kernel": kernel,
        "dimension": "prefill_tokens" if kernel == PREFILL else "kv_blocks",
        "rungs": sorted({kv_dim(b) for b in mine}),
    }
    if kernel == BATCHED:
        out["num_seqs"] = sorted({b.key.num_seqs for b in mine if isinstance(b.key, BatchedKey)})
    out["buckets"] = [str(b) for b in mine]
    return out


def config_code(c: RuntimeConfig) -> str:
    """`RuntimeConfig(...)` with every field that differs from the default (the model excepted)."""
    args = [
        f"{f.name}={getattr(c, f.name)!r}"
        for f in dataclasses.fields(c)
        if f.name != "model" and getattr(c, f.name) != f.default
    ]
    return f"RuntimeConfig({', '.join(args)})"


def op_code(op: Op) -> str:
    """`Op(...)` as Python, with only the fields its kind uses."""
    if op.kind == "abort":
        return f"Op('abort', ref={op.ref})"
    if op.kind == "step":
        return f"Op('step', steps={op.steps})"
    early = f", stop={op.stop}, via={op.via!r}" if op.stop else ""
    hit = f", ref={op.ref}, share={op.share}" if op.share else ""
    return f"Op('add', {op.prompt_len}, {op.max_tokens}{early}{hit})"


@dataclass(frozen=True)
class Finding:
    prop: str  # "dispatch", "padding", "warmup" or "ladders"
    kind: str  # e.g. "cold-dispatch", "missing-bucket", "ladder-divergence", "live-padding"
    message: str
    fault: str | None
    config: RuntimeConfig | None  # as the runtime ran it (after the fault's configure step); None: rejected
    bucket: Bucket | None = None
    batch_state: dict[str, Any] | None = None
    events: tuple[Op, ...] | None = None
    warm_ladder: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        w: World,
        prop: str,
        kind: str,
        message: str,
        bucket: Bucket | None = None,
        point: StepPoint | None = None,
        events: Sequence[Op] | None = None,
        **details: Any,
    ) -> Finding:
        ladder = warm_ladder(w.warm, bucket.kernel) if bucket is not None else None
        state = point.describe() if point is not None else None
        evs = tuple(events) if events is not None else None
        return cls(prop, kind, message, w.fault, w.config, bucket, state, evs, ladder, details)

    @property
    def headline(self) -> str:
        """`[property/kind] message`: how the hunt, replay and the test body all name a finding."""
        return f"[{self.prop}/{self.kind}] {self.message}"

    def test_body(self) -> str | None:
        """A pytest test (imports inside, so it pastes into any test file) that re-runs this
        property on exactly this case, under the same fault, through the public API; it fails,
        naming the finding, while the finding holds. None: the hunt has no case to re-run."""
        lines = self._test_lines()
        if lines is None:
            return None
        name = f"test_hunt_{self.prop}_{self.kind}".replace("-", "_")
        return "\n".join([f"def {name}():", *(f"    {line}" for line in lines)])

    def _test_lines(self) -> list[str] | None:
        if self.prop not in CHECKS:  # the protocol property's runtime is built per hunt: its reproducer is the hunt
            return None
        check, d = CHECKS[self.prop], self.details
        importing = f"from spyre_verify.hunt.properties import {check}"
        if self.prop == "config":
            call = f"{check}({d['kwargs']!r}, {d['env']!r})"
            return [importing, f"found = {call}", ASSERT]
        if self.config is None:
            if "kwargs" not in d:
                return None
            # The runtime raised while the hunt drew this config: the draw is the test.
            return [RUNTIME_CONFIG, f"RuntimeConfig.from_env({d['env']!r}, **{d['kwargs']!r})"]
        lines, args = [RUNTIME_CONFIG, importing], ["config"]
        if check == "check_trace":
            lines.append("from spyre_verify.hunt.strategies import Op")
        lines.append(f"config = {config_code(self.config)}")
        if check == "check_trace":
            lines.append(f"events = [{', '.join(op_code(o) for o in self.events or ())}]")
            args.append("events")
        if self.fault is not None:
            args.append(f"fault={self.fault!r}")
        return [*lines, f"found = {check}({', '.join(args)})", ASSERT]

    def to_dict(self) -> dict[str, Any]:
        return {
            "property": self.prop,
            "kind": self.kind,
            "message": self.message,
            "fault": self.fault,
            "config": config_payload(self.config) if self.config is not None else None,
            "bucket": str(self.bucket) if self.bucket is not None else None,
            "batch_state": self.batch_state,
            "events": [str(o) for o in self.events] if self.events is not None else None,
            "warm_ladder": self.warm_ladder,
            **{k: ([str(x) for x in v] if k == "cold_buckets" else v) for k, v in self.details.items()},
            "pytest": self.test_body(),
        }
