"""Dynamo's compiles outside a tracer such as coverage's, for runs measured under one.

Coverage's tracer nearly doubles a warmup's CPU (8.3 s against 4.9 s for four small warmups),
all of it spent in torch's own Python: Dynamo's bytecode analysis and the backends. None of it
is the runtime's code: Dynamo reads a kernel's bytecode, it does not run it. So the tracer is
off inside Dynamo's compile and inside the stock backends, and back on for the one step between
them that runs a runtime's or the harness's code, the user compiler Dynamo calls (a runner's
recording backend, the counting wrapper). A line-coverage report is the same either way: a
runtime team measuring its runtime's coverage through the harness pays the tracer on its own
code only. Without a tracer every wrapper passes straight through."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

STOCK_BACKENDS = ("eager", "aot_eager", "inductor")
_suspended = threading.local()


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """The block outside the tracer: what it runs counts for no coverage."""
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        yield
    finally:
        sys.settrace(tracer)


def _untraced(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        # What _retraced puts back: this call's tracer, None included, never an earlier call's.
        outer, _suspended.tracer = getattr(_suspended, "tracer", None), sys.gettrace()
        try:
            with untraced():
                return fn(*args, **kwargs)
        finally:
            _suspended.tracer = outer

    run.untraced = True  # type: ignore[attr-defined]
    return run


def _retraced(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        tracer = getattr(_suspended, "tracer", None)
        if tracer is None or sys.gettrace() is not None:
            return fn(*args, **kwargs)
        sys.settrace(tracer)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.settrace(None)

    return run


def compile_untraced() -> None:
    """Once a process, told by the installed wrapper itself: a wrapper inside another would run
    the user compiler untraced (the inner one saves "no tracer"). Not a functools.cache, which a
    test that clears the harness's memos clears too. A torch without these names (they are
    private) is left alone."""
    from torch._dynamo import convert_frame, output_graph
    from torch._dynamo.backends import registry

    graph = output_graph.OutputGraph
    if not (hasattr(convert_frame, "_compile") and hasattr(graph, "_call_user_compiler")):
        return
    if getattr(convert_frame._compile, "untraced", False):
        return
    convert_frame._compile = _untraced(convert_frame._compile)
    graph._call_user_compiler = _retraced(graph._call_user_compiler)  # type: ignore[method-assign]
    for name in STOCK_BACKENDS:
        registry._COMPILER_FNS[name] = _untraced(registry.lookup_backend(name))
