"""A hunt finding: the shrunk config, the batch state, the bucket, the warm ladder it missed,
and two one-line reproducers (a shell line with the env overrides, and a pytest line).

Also how the hunt tells the runtime's crashes (findings) from its own (internal errors).
"""

from __future__ import annotations

import dataclasses
import shlex
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import runtime
import spyre_verify
from runtime.bucketer import BATCHED, PREFILL, BatchedKey, Bucket, DecodeKey
from runtime.config import RuntimeConfig
from spyre_verify.hunt.strategies import Op, StepPoint
from spyre_verify.oracle.walk import Action
from spyre_verify.report import config_payload

if TYPE_CHECKING:
    from spyre_verify.hunt.world import World

# The check each property's pytest line calls.
CHECKS = {
    "dispatch": "check_trace",
    "padding": "check_trace",
    "warmup": "check_warmup",
    "ladders": "check_ladders",
    "config": "check_config",
}
RUNTIME_DIR = str(Path(runtime.__file__).parent)
HARNESS_DIR = str(Path(spyre_verify.__file__).parent)


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
    return Finding(prop, "runtime-error", msg, fault, config, events=tuple(events) if events else None)


def ops_for(actions: Sequence[Action]) -> tuple[Op, ...]:
    """A walk witness as hunt events: a join is an add and one step, a decode one step."""
    out: list[Op] = []
    for a in actions:
        if a.kind == "join":
            out.append(Op("add", a.prompt_len, a.max_tokens))
        if out and out[-1].kind == "step":
            out[-1] = Op("step", steps=out[-1].steps + 1)
        else:
            out.append(Op("step"))
    return tuple(out)


def kv_of(bucket: Bucket) -> int:
    """The KV dimension of a key: blocks for decode and batched, tokens for prefill."""
    return bucket.key.kv_blocks if isinstance(bucket.key, (DecodeKey, BatchedKey)) else bucket.key.tokens


def warm_ladder(warm: Iterable[Bucket], kernel: str) -> dict[str, Any]:
    """The rungs warmup recorded for one kernel: its KV dimension, and num_seqs for batched."""
    mine = sorted(b for b in warm if b.kernel == kernel)
    out: dict[str, Any] = {
        "kernel": kernel,
        "dimension": "prefill_tokens" if kernel == PREFILL else "kv_blocks",
        "rungs": sorted({kv_of(b) for b in mine}),
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
    return f"Op('add', {op.prompt_len}, {op.max_tokens})" if op.kind == "add" else f"Op('step', steps={op.steps})"


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

    def reproducer(self) -> str | None:
        """Shell: the env overrides plus a `spyre-verify ladders` call that prints the warm set;
        None when the runtime failed before a case had a config (the message names the call)."""
        c = self.config
        if self.prop == "config":
            kwargs, env = self.details["kwargs"], self.details["env"]
            code = f"from runtime.config import RuntimeConfig; print(RuntimeConfig.from_env({env!r}, **{kwargs!r}))"
            return f"python -c {shlex.quote(code)}"
        if c is None:
            return None
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in c.env_overrides().items())
        flags = f"--block-size {c.block_size} --max-model-len {c.max_model_len} --max-num-seqs {c.max_num_seqs}"
        if c.num_blocks is not None:
            flags += f" --num-blocks {c.num_blocks}"
        return f"{env + ' ' if env else ''}spyre-verify ladders {flags}"

    def pytest_line(self) -> str | None:
        """Python: re-run this property on exactly this case; the assert fails while the finding holds."""
        check = CHECKS[self.prop]
        if self.prop == "config":
            d = self.details
            return (
                f"from spyre_verify.hunt.properties import {check}; assert {check}({d['kwargs']!r}, {d['env']!r}) == []"
            )
        if self.config is None:
            return None
        args = [config_code(self.config)]
        imports = f"from runtime.config import RuntimeConfig; from spyre_verify.hunt.properties import {check}"
        if check == "check_trace":
            args.append("[" + ", ".join(op_code(o) for o in self.events or ()) + "]")
            imports += "; from spyre_verify.hunt.strategies import Op"
        args.append(f"fault={self.fault!r}")
        return f"{imports}; assert {check}({', '.join(args)}) == []"

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
            "reproducer": self.reproducer(),
            "pytest": self.pytest_line(),
        }
