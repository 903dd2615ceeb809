"""The kill table: run the clean config, then every fault, each in a fresh compile state."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from runtime.config import RuntimeConfig
from runtime.errors import ConfigError
from spyre_verify import faults
from spyre_verify.errors import UsageError
from spyre_verify.oracle import derive
from spyre_verify.runtimes import BUNDLED_FACTORY, Probe
from spyre_verify.serving.workload import Item

if TYPE_CHECKING:  # a run loads torch; naming the catalog (the CLI's help) must not
    from spyre_verify.serving.session import Progress, RunResult


# Above this many candidate keys (a bound of the warm set: each a warmup compile of every fault run) the kill table
# runs its faults in parallel processes.
PARALLEL_ABOVE = 32
# A kill-table row runs the bundled runtime under eager: every fault and checker lives at Dynamo's
# level (guards, the recording backend's graphs, the stance), the same for every backend, and eager
# compiles a third faster than aot_eager. `check --fault` keeps the run's own backend.
CONTROL_BACKEND = "eager"


@dataclass(frozen=True)
class KillRow:
    fault: str
    expected: str
    caught: bool  # flagged by the expected checker
    caught_by: tuple[str, ...]  # every checker that flagged something
    first_violation: str
    seconds: float = 0.0  # wall time of the fault's run, warmup included
    config: dict[str, object] = field(default_factory=dict, hash=False)  # what it ran on (`run_config`)

    def to_dict(self) -> dict[str, object]:
        return {
            "fault": self.fault,
            "expected_checker": self.expected,
            "caught": self.caught,
            "caught_by": list(self.caught_by),
            "first_violation": self.first_violation,
            "seconds": round(self.seconds, 1),
            "config": dict(self.config),
        }


def run_config(config: RuntimeConfig, runtime: str = BUNDLED_FACTORY) -> dict[str, object]:
    """The config a fault row ran on, as the row names it: the sizes, the pool, the layout (and a
    ragged one's step token budget, its default resolved) and the backend the run used (the
    bundled runtime's fault runs use CONTROL_BACKEND whatever the config's)."""
    out: dict[str, object] = {
        "block_size": config.block_size,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "num_blocks": derive.pool_blocks(config),
        "layout": config.layout,
    }
    if config.ragged:
        out["max_num_batched_tokens"] = config.token_budget
    out["backend"] = CONTROL_BACKEND if runtime == BUNDLED_FACTORY else config.backend
    return out


# Above this max_model_len `check` runs its kill table on a sibling config with this one. Every
# fault run compiles, and warmup runs once, every bucket; padded, a prefill one a block up to max_model_len,
# at a cost that grows with its cube. At 8,192 tokens (128 prefill buckets) one fault's warmup cost
# 50 to 120 CPU seconds and 14 faults more than the rest of the check together; at 2,048 they
# cost 16 times fewer tokens squared and all 14 run in about two minutes.
CONTROLS_MAX_MODEL_LEN = 2048


def controls_config(config: RuntimeConfig) -> tuple[RuntimeConfig, str | None]:
    """The config `check`'s kill table runs on, and why it is not `config` (None when it is).

    Above CONTROLS_MAX_MODEL_LEN: the same config (layout, block size, batch, flags, pool and
    limits as given) at that max_model_len, whose derived sizes follow it. A config that names its
    own KV or query rungs keeps its size: the rungs are what it is about. So does one the sibling
    would make invalid (a block size of 2,048 or more)."""
    top = CONTROLS_MAX_MODEL_LEN
    if config.max_model_len <= top or config.kv_buckets is not None or config.query_buckets is not None:
        return config, None
    try:
        sibling = config.with_(max_model_len=top)
    except ConfigError:
        return config, None
    return sibling, (
        f"max_model_len {config.max_model_len} is above {top}: each fault's run would warm up every bucket "
        f"to {config.max_model_len} tokens, so the catalog runs on the same config at max_model_len {top}; "
        "`spyre-verify controls` with this run's flags runs it on the config itself"
    )


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
    stop_at: str | None = None,
) -> RunResult:
    """One run under fault `name`, in a fresh compile state. With `stop_at` (a checker's name) the
    run stops at that checker's first violation: the kill table needs only to know it was caught."""
    import torch

    from spyre_verify.serving.session import all_checkers, verify

    torch._dynamo.reset()
    checkers = all_checkers()
    for c in checkers:
        c.strict = c.name == stop_at
    if runtime != BUNDLED_FACTORY:  # another runtime seeds its own faults from Settings.fault
        return verify(config, workload=workload, checkers=checkers, fault=name, progress=progress, runtime=runtime)
    fault = faults.get(name)
    cfg, seams = fault.apply(config)
    if stop_at is not None:
        cfg = cfg.with_(backend=CONTROL_BACKEND)
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)  # the recompile-limit fault warns by design
    try:  # verify closes its engine, which puts back Dynamo's limits: a fault's low one does not outlive it
        with fault.active():  # a fault patched into the runtime's code holds for the whole run
            return verify(cfg, seams, workload, checkers, fault=name, progress=progress)
    finally:
        dynamo_log.setLevel(level)


def fault_row(
    config: RuntimeConfig, name: str, workload: Sequence[Item] | None, runtime: str, expected: str
) -> KillRow:
    """One row of the kill table: the fault's run, stopped at its expected checker's first violation.
    A plain function of picklable arguments, so a worker process can run it."""
    t0 = time.perf_counter()
    result = run_fault(config, name, workload, runtime=runtime, stop_at=expected)
    # The config judged: a declared contract's, completed by its declaration (`verify`'s result).
    judged = result.config if isinstance(result.config, RuntimeConfig) else config
    return replace(
        kill_row(name, result, expected), seconds=time.perf_counter() - t0, config=run_config(judged, runtime)
    )


def catalog_workers(config: RuntimeConfig, faults_to_run: int) -> int:
    """Worker processes for the kill table: one, unless there are several faults and a warmup of
    more than PARALLEL_ABOVE graphs each, where every core takes one (a spawned worker costs a
    torch import, seconds, which a large config's minute-long fault runs repay)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if faults_to_run < 2 or cores < 2 or candidate_graphs(config) <= PARALLEL_ABOVE:
        return 1
    return min(cores, faults_to_run)


def candidate_graphs(config: RuntimeConfig) -> int:
    """The keys the ladders allow, an upper bound of warmup's graphs, off the ladders alone: sizing
    a process pool is no reason to walk the reachable set (seconds at production sizes)."""
    lad = derive.ladders(config)
    kv, seqs = len(lad.kv_blocks), len(lad.num_seqs)
    if lad.ragged:
        return kv * len(lad.query_tokens) + seqs * kv
    return kv + 4 * seqs * kv + len(lad.prefill_tokens)


def foreign_workers(target: str, faults_to_run: int) -> int:
    """Worker processes for another runtime's kill table: one a core when its factory says that a
    run costs seconds (`parallel_faults`, the real plugin's: each fault run imports vLLM and warms an
    engine), else one (a spawned worker's torch import would cost more than the runs it shares)."""
    from spyre_verify.runtimes import load_factory

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if faults_to_run < 2 or cores < 2 or not getattr(load_factory(target), "parallel_faults", False):
        return 1
    return min(cores, faults_to_run)


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
    workers: int | None = None,
) -> list[KillRow]:
    """One row per fault, appended to `rows` as each finishes (a caller interrupted mid-table keeps
    them), in catalog order at the end. `catalog` (fault -> checker) is another runtime's own;
    default: the bundled catalog. `workers`: processes to run faults in (default `catalog_workers`)."""
    rows = [] if rows is None else rows
    catalog = catalog if catalog is not None else faults.catalog_for(config)
    names = names or list(catalog)
    workers = workers if workers is not None else catalog_workers(config, len(names))
    work = tuple(workload) if workload is not None else None
    if workers <= 1:
        for name in names:
            if progress:
                progress(f"control: {name}")
            rows.append(fault_row(config, name, work, runtime, catalog[name]))
        return rows
    if progress:
        progress(f"controls: {len(names)} faults in {workers} worker processes")
    with worker_pool(workers) as pool:
        return collect_rows(pool, submit_faults(pool, config, work, names, runtime, catalog), names, rows, progress)


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """Spawned processes, each on one thread as the process that spawns them: they share the cores."""
    from spyre_verify.defaults import tune_process

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=tune_process)


def submit_faults(
    pool: ProcessPoolExecutor,
    config: RuntimeConfig,
    work: tuple[Item, ...] | None,
    names: list[str],
    runtime: str,
    catalog: dict[str, str],
) -> dict[Future[KillRow], str]:
    return {pool.submit(fault_row, config, n, work, runtime, catalog[n]): n for n in names}


def collect_rows(
    pool: ProcessPoolExecutor,
    pending: dict[Future[KillRow], str],
    names: list[str],
    rows: list[KillRow],
    progress: Progress | None,
) -> list[KillRow]:
    """Each row appended to `rows` as its fault finishes, in catalog order at the end."""
    try:
        for done in as_completed(pending):
            rows.append(done.result())
            if progress:
                progress(f"control: {pending[done]} {'caught' if rows[-1].caught else 'NOT caught'}")
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    rows.sort(key=lambda r: names.index(r.fault))
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

    from spyre_verify.serving.session import verify

    torch._dynamo.reset()
    clean = verify(config, workload=workload, progress=progress, runtime=runtime)
    n = len(names or catalog or ())
    workers = None if runtime == BUNDLED_FACTORY else foreign_workers(runtime, n)
    return clean, kill_table(config, workload, names, progress, runtime=runtime, catalog=catalog, workers=workers)
