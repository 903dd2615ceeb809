"""The event bus: an observer sees exactly the events emitted while it is subscribed, whenever it
joins or leaves (the bus caches each kind's handlers, so every change must reach the cache)."""

from __future__ import annotations

from runtime.events import EventBus


class Recorder:
    def __init__(self) -> None:
        self.seen: list[object] = []

    def on_step(self, event: object) -> None:
        self.seen.append(event)


def test_an_observer_that_joins_after_an_emit_sees_every_later_event() -> None:
    bus, early, late = EventBus(), Recorder(), Recorder()
    assert not bus.wants("step")
    bus.emit("step", "nobody listens")
    bus.subscribe(early)
    bus.emit("step", 1)
    bus.subscribe(late)
    assert bus.wants("step")
    bus.emit("step", 2)
    assert (early.seen, late.seen) == ([1, 2], [2])


def test_an_observer_that_leaves_sees_nothing_more() -> None:
    bus, stays, leaves = EventBus(), Recorder(), Recorder()
    bus.subscribe(stays)
    detach = bus.subscribe(leaves)
    bus.emit("step", 1)
    detach()
    bus.emit("step", 2)
    assert (stays.seen, leaves.seen) == ([1, 2], [1])
    assert bus and bus.wants("step") and not bus.wants("finish")


def test_a_bus_whose_last_observer_left_builds_nothing() -> None:
    bus, only = EventBus(), Recorder()
    detach = bus.subscribe(only)
    assert bus.wants("step")
    detach()
    assert not bus and not bus.wants("step")
