"""Ladder agreement: every ladder a component uses equals the bucketer's."""

from __future__ import annotations

from typing import Any

from spyre_verify.violations import Checker


class LadderAgreement(Checker):
    name = "ladder-agreement"

    def attach(self, engine: Any) -> None:
        super().attach(engine)
        self.compare(engine)

    def compare(self, engine: Any) -> None:
        truth = engine.bucketer.ladders()
        for component in ("builder", "recorder"):
            for name, ladder in getattr(engine, component).ladders().items():
                if tuple(ladder) != tuple(truth[name]):
                    only = sorted(set(ladder) - set(truth[name]))
                    lacks = sorted(set(truth[name]) - set(ladder))
                    self.flag(
                        "ladder-divergence",
                        f"the {component}'s {name} ladder {list(ladder)} differs from the bucketer's {list(truth[name])}: "
                        f"rungs only the {component} has {only}, rungs it lacks {lacks}",
                    )
