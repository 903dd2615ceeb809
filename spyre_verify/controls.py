"""The kill table: run the clean config, then every fault, each in a fresh compile state."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.config import RuntimeConfig
from spyre_verify import faults
from spyre_verify.errors import UsageError
from spyre_verify.runtimes import BUNDLED_FACTORY, Probe
from spyre_verify.workload import Item

if TYPE_CHECKING:  # a run loads torch; naming the catalog (the CLI's help) must not
    from spyre_verify.session import Progress, RunResult


@dataclass(frozen=True)
class KillRow:
    fault: str
    expected: str
    caught: bool  # flagged by the expected checker
    caught_by: tuple[str, ...]  # every checker that flagged something
    first_violation: str

    def to_dict(self) -> dict[str, object]:
        return {
            "fault": self.fault,
            "expected_checker": self.expected,
            "caught": self.caught,
            "caught_by": list(self.caught_by),
            "first_violation": self.first_violation,
        }


def fault_catalog(rt: Probe) -> dict[str, str]:
    """Fault -> the checker that must catch it: the bundled catalog, or the runtime's own."""
    if rt.bundled:
        return faults.catalog_for(rt.config)
    if not rt.faults:
        raise UsageError(f"the {rt.name} runtime ({rt.target}) ships no faults(): there is nothing to prove caught")
    return dict(rt.faults)


def run_fault(
    config: RuntimeConfig,
    name: str,
    workload: Sequence[Item] | None = None,
    progress: Progress | None = None,
    runtime: str = BUNDLED_FACTORY,
) -> RunResult:
    import torch

    from spyre_verify.session import verify

    torch._dynamo.reset()
    if runtime != BUNDLED_FACTORY:  # another runtime seeds its own faults from Settings.fault
        return verify(config, workload=workload, fault=name, progress=progress, runtime=runtime)
    fault = faults.get(name)
    cfg, seams = fault.apply(config)
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)  # the recompile-limit fault warns by design
    try:  # verify closes its engine, which puts back Dynamo's limits: a fault's low one does not outlive it
        with fault.active():  # a fault patched into the runtime's code holds for the whole run
            return verify(cfg, seams, workload, fault=name, progress=progress)
    finally:
        dynamo_log.setLevel(level)


def kill_row(name: str, result: RunResult, expected: str | None = None) -> KillRow:
    expected = expected or faults.get(name).checker
    by = tuple(c.name for c in result.checkers if c.violations)
    first = next((str(v) for c in result.checkers if c.name == expected for v in c.violations), None)
    first = first or (str(result.violations[0]) if result.violations else result.error or "nothing flagged")
    return KillRow(name, expected, expected in by, by, first)


def kill_table(
    config: RuntimeConfig,
    workload: Sequence[Item] | None = None,
    names: list[str] | None = None,
    progress: Progress | None = None,
    rows: list[KillRow] | None = None,
    runtime: str = BUNDLED_FACTORY,
    catalog: dict[str, str] | None = None,
) -> list[KillRow]:
    """One row per fault, appended to `rows` as each finishes (a caller interrupted mid-table keeps them).
    `catalog` (fault -> checker) is another runtime's own; default: the bundled catalog."""
    rows = [] if rows is None else rows
    catalog = catalog if catalog is not None else faults.catalog_for(config)
    for name in names or list(catalog):
        if progress:
            progress(f"control: {name}")
        rows.append(kill_row(name, run_fault(config, name, workload, runtime=runtime), catalog[name]))
    return rows


def run_catalog(
    config: RuntimeConfig,
    workload: Sequence[Item] | None = None,
    names: list[str] | None = None,
    progress: Progress | None = None,
    runtime: str = BUNDLED_FACTORY,
    catalog: dict[str, str] | None = None,
) -> tuple[RunResult, list[KillRow]]:
    """The clean run (which must be quiet), then the kill table."""
    import torch

    from spyre_verify.session import verify

    torch._dynamo.reset()
    clean = verify(config, workload=workload, progress=progress, runtime=runtime)
    return clean, kill_table(config, workload, names, progress, runtime=runtime, catalog=catalog)
