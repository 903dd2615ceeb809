"""The serving stance and the control calls that prove it bites.

Serving runs under Dynamo's `fail_on_recompile` stance: a call no warm graph serves is refused
instead of compiled. A control call is made twice, once under the guard, which must refuse it,
and once outside, where the harness's counting backend must see it compile; a control either
side misses means the checker judging graph reuse cannot be trusted (`GraphReuse.run_controls`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from spyre_verify.checks.control_calls import Control

STANCE_MARK = "fail_on_recompile"


def is_stance_error(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and STANCE_MARK in str(e)


def serving_stance() -> AbstractContextManager[None]:
    """The stance every serving path runs under: `guard()`, preflight and the plugin's `graph_audit`."""
    return torch.compiler.set_stance(STANCE_MARK)


@dataclass(frozen=True)
class ControlResult:
    name: str
    bucket: str
    seen_by_backend: bool  # the harness's counting backend saw the repeated call compile
    seen_by_stance: bool  # the serving guard refused the first call

    @property
    def detected(self) -> bool:
        return self.seen_by_backend and self.seen_by_stance


def run_control(
    control: Control, guard: Callable[[], AbstractContextManager[None]], compiles: Callable[[str], int]
) -> ControlResult:
    """The control under `guard` (refused, or the stance does not bite), then outside it, where the
    counting backend's `compiles` of its kernel must go up."""
    by_stance = False
    try:
        with guard():
            control.call()
    except RuntimeError as e:
        if not is_stance_error(e):
            raise
        by_stance = True
    kernel = control.bucket.kernel
    before = compiles(kernel)
    control.call()
    return ControlResult(control.name, str(control.bucket), compiles(kernel) > before, by_stance)
