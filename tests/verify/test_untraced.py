"""spyre_verify.testing.untraced (installed by tests/conftest.py): Dynamo's compile runs outside a tracer,
the user compiler Dynamo calls inside it; a test marked `untraced` runs outside it."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from spyre_verify.testing.untraced import untraced


def test_the_tracer_is_off_inside_dynamo_and_on_in_the_user_compiler() -> None:
    called: list[str] = []
    seen_by_backend: list[object] = []

    def tracer(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            called.append(frame.f_code.co_filename)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        seen_by_backend.append(sys.gettrace())
        return gm.forward

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    compiled = torch.compile(double, backend=backend, dynamic=False, fullgraph=True)
    before = sys.gettrace()  # coverage's, under tox
    sys.settrace(tracer)
    try:
        out = compiled(torch.ones(3))
        after = sys.gettrace()
    finally:
        sys.settrace(before)
    assert torch.equal(out, torch.full((3,), 2.0))
    assert seen_by_backend == [tracer]  # the user compiler runs traced
    assert after is tracer  # and the tracer is back once the compile returns
    dynamo = [f for f in called if "torch/_dynamo/symbolic_convert" in f.replace("\\", "/")]
    assert not dynamo, f"{len(dynamo)} calls of Dynamo's bytecode analysis were traced"
    assert any(f == __file__ for f in called)  # the backend's own call was seen


@pytest.fixture
def a_tracer() -> Iterator[Callable[..., None]]:
    def tracer(frame: types.FrameType, event: str, arg: Any) -> None:
        return None

    before = sys.gettrace()
    sys.settrace(tracer)  # in setup: still there when the test body runs, unless the hook lifts it
    yield tracer
    sys.settrace(before)


@pytest.mark.untraced
def test_a_test_marked_untraced_runs_outside_the_tracer(a_tracer: Callable[..., None]) -> None:
    assert sys.gettrace() is None


def test_an_unmarked_test_runs_under_it(a_tracer: Callable[..., None]) -> None:
    assert sys.gettrace() is a_tracer


def test_untraced_suspends_a_tracer_and_puts_it_back() -> None:
    def tracer(frame: types.FrameType, event: str, arg: Any) -> None:
        return None

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        with untraced():
            inside = sys.gettrace()
        after = sys.gettrace()
    finally:
        sys.settrace(before)
    assert (inside, after) == (None, tracer)


def test_a_compile_after_a_traced_one_gets_no_stale_tracer_back() -> None:
    seen: list[object] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        seen.append(sys.gettrace())
        return gm.forward

    def tracer(frame: types.FrameType, event: str, arg: Any) -> None:
        return None

    def first(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def second(x: torch.Tensor) -> torch.Tensor:
        return x - 1

    before = sys.gettrace()
    try:
        sys.settrace(tracer)
        torch.compile(first, backend=backend, dynamic=False)(torch.ones(2))
        sys.settrace(None)
        torch.compile(second, backend=backend, dynamic=False)(torch.ones(2))
    finally:
        sys.settrace(before)
    assert seen == [tracer, None]


def test_installing_again_after_the_memos_are_cleared_wraps_once() -> None:
    """The bounded hunt's test clears every memo of the harness; a second install after it must
    not wrap Dynamo's compile inside itself, which ran every later user compiler untraced."""
    from torch._dynamo import convert_frame

    from spyre_verify.testing.untraced import compile_untraced
    from tests.runtime.test_bounded_hunt import forget_memoised_answers

    installed = convert_frame._compile
    forget_memoised_answers()
    compile_untraced()
    assert convert_frame._compile is installed
    assert not getattr(convert_frame._compile.__wrapped__, "untraced", False)
    test_the_tracer_is_off_inside_dynamo_and_on_in_the_user_compiler()
