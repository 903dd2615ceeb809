"""The oracles share no code with what they judge (DESIGN "Oracles: who may judge what").

No module of `spyre_verify` reaches the runtime's ladder maths or its closed-form reachability,
however it is imported (directly, or through a module that re-exports it, as `runtime.bucketer`
does). No module (every sub-package and the top level) asks the runtime's bucketer or builders for
an answer, reads a config property the runtime derives, or calls a runtime planning method: a bug
in shared code would move the expected and the actual answer together. Where such a use is the
runtime's word on purpose (what it planned, shown or exercised, never what it should have done),
`ALLOWED` names it, with the function it is in and why.

What counts as the runtime's word is read off the runtime's own classes (their methods, their
properties), so a method or derived property added there is covered without editing this file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

import pytest

import runtime
import spyre_verify
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder
from runtime.ragged_metadata import RaggedBuilder

PACKAGE = Path(spyre_verify.__file__).parent
RUNTIME_DIR = Path(runtime.__file__).parent
# runtime.blocks: the runtime's ceiling, slot and padded-row arithmetic; the oracle keeps its own.
FORBIDDEN_MODULES = {
    "runtime.ladders",
    "runtime.reachability",
    "runtime.ragged_reachability",
    "runtime.ragged_buckets",
    "runtime.blocks",
}
# Modules whose answers are expected answers: the checkers and the oracle itself.
JUDGING_PACKAGES = ("checks", "oracle")
JUDGES = sorted(p for package in JUDGING_PACKAGES for p in PACKAGE.glob(f"{package}/*.py"))


# ---- What counts as the runtime's word, introspected so that a new method or property is covered ----


def public_methods(*classes: type) -> frozenset[str]:
    """The methods each class defines or inherits (from the runtime: `object`'s aside), private ones
    (`_x`) aside. Properties are not methods; class and static methods are."""
    return frozenset(
        name
        for cls in classes
        for klass in cls.__mro__
        if klass is not object
        for name, value in vars(klass).items()
        if not name.startswith("_") and is_method(value)
    )


def is_method(value: object) -> bool:
    return isinstance(value, staticmethod | classmethod) or (callable(value) and not isinstance(value, type))


def properties(cls: type) -> frozenset[str]:
    """Every property of a class and of its bases: a value computed by the class's code, not stored."""
    return frozenset(
        name
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if isinstance(value, property | cached_property)
    )


def instance_attributes(obj: object) -> frozenset[str]:
    return frozenset(name for name in vars(obj) if not name.startswith("_"))


# Every bucketer method answers a rung, a bucket, a ladder or a warm set; the builders' methods
# answer a step's calls and their keys, table rows and slots. Each is the expected answer of some
# check, so it is flagged on whatever it is called: `engine.builder.attend_bucket(...)` too.
BUCKETER_METHODS = public_methods(SpyreAttnBucketer)
BUILDER_METHODS = public_methods(MetadataBuilder, RaggedBuilder) - BUCKETER_METHODS
# The ladders and limits a bucketer holds as attributes. Their names are common words (`num_seqs` is
# also a metadata property), so they count only on an owner named for a bucketer. `config` is what
# the bucketer was built from, not an answer.
BUCKETER_ATTRIBUTES = instance_attributes(SpyreAttnBucketer(RuntimeConfig())) - {"config"}
# RuntimeConfig properties that are not derived values: each with why reading it is reading a raw field.
NOT_DERIVED = {"ragged": "`layout == 'ragged'`: the raw layout field, named; it derives no number"}
# Config properties the runtime computes from the raw fields: the oracle derives each (`oracle.derive`).
DERIVED_CONFIG = properties(RuntimeConfig) - set(NOT_DERIVED)
# The protocol's planning calls (`warm_plan()`, `ladders()`) and the warm-up recorder's `plan()`:
# what the runtime means to compile or dispatch, never what it should.
PLANNING = frozenset({"warm_plan", "ladders", "plan"})
# The runtime's classes whose very use (building one) is flagged.
ANSWERING_CLASSES = {f"{SpyreAttnBucketer.__module__}.{SpyreAttnBucketer.__name__}"}


# ---- Where a name is defined: follow imports and re-exports into the runtime's source ----


def source_of(module: str) -> Path | None:
    """The file of a runtime module; None for anything else (the harness, the standard library)."""
    parts = module.split(".")
    if parts[0] != RUNTIME_DIR.name:
        return None
    base = RUNTIME_DIR.parent.joinpath(*parts)
    return next((f for f in (base / "__init__.py", base.with_suffix(".py")) if f.is_file()), None)


@cache  # each module is read by three scans and each test; no file changes during a run
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def import_bindings(tree: ast.Module, package: str) -> dict[str, tuple[str, str | None]]:
    """What each import in a module binds: local name -> (module, name read from it), the name None
    where the import binds the module itself. Imports anywhere count, a function's included."""
    out: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                # `import runtime.ladders` binds `runtime`; `import runtime.ladders as l` binds the module.
                bound = a.asname or a.name.split(".")[0]
                out[bound] = (a.name if a.asname else bound, None)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, package)
            for a in node.names:
                if a.name == "*":
                    out |= {n: (base, n) for n in star_names(base)}
                else:
                    out[a.asname or a.name] = (base, a.name)
    return out


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a `from` import reads, a relative one (`from . import x`) made absolute."""
    if not node.level:
        return node.module or ""
    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{parent}.{node.module}" if node.module else parent


@cache
def runtime_imports(module: str) -> dict[str, tuple[str, str | None]]:
    path = source_of(module)
    assert path is not None, module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return import_bindings(parse(path), package)


def star_names(module: str) -> list[str]:
    """What `from module import *` binds: its `__all__`, else every public name it binds. Outside
    the runtime nothing is known, and nothing is needed: only the runtime's names are followed."""
    path = source_of(module)
    if path is None:
        return []
    tree = parse(path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    bound = {t.id for n in tree.body for t in assigned(n) if isinstance(t, ast.Name)}
    bound |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    return sorted(n for n in bound | set(runtime_imports(module)) if not n.startswith("_"))


@cache
def definition(module: str, name: str) -> str:
    """Where `name`, read from `module`, is defined, as a dotted path. A submodule is itself; a name
    the module imported is followed to where that import found it (a re-export is no disguise);
    anything else is the module's own."""
    if source_of(f"{module}.{name}"):
        return f"{module}.{name}"
    bound = runtime_imports(module).get(name) if source_of(module) else None
    if bound is None:
        return f"{module}.{name}"
    target, target_name = bound
    return target if target_name is None else definition(target, target_name)


def resolve(node: ast.AST, bindings: dict[str, tuple[str, str | None]]) -> str | None:
    """The definition a dotted name reaches through imports (`ladders.round_up`,
    `runtime.bucketer.ladders`), or None for a name no import binds."""
    if isinstance(node, ast.Name) and node.id in bindings:
        module, name = bindings[node.id]
        return module if name is None else definition(module, name)
    if isinstance(node, ast.Attribute):
        owner = resolve(node.value, bindings)
        # Only a module's attributes are followed: a class's or an object's are not definitions.
        if owner is not None and source_of(owner):
            return definition(owner, node.attr)
    return None


def in_runtime(defined: str | None) -> bool:
    return defined is not None and defined.split(".")[0] == RUNTIME_DIR.name


def forbidden(defined: str) -> bool:
    return any(defined == m or defined.startswith(f"{m}.") for m in FORBIDDEN_MODULES)


def module_bindings(path: Path) -> dict[str, tuple[str, str | None]]:
    # A harness module's own relative imports never reach the runtime, so its package name is not needed.
    return import_bindings(parse(path), package="")


@cache  # three tests a module ask, and no file changes during a run
def reached_modules(path: Path) -> frozenset[str]:
    """Every runtime definition a module reaches: what it imports, each followed through re-exports,
    and each dotted name it reads through an imported module."""
    tree, bindings = parse(path), module_bindings(path)
    reached = {module if name is None else definition(module, name) for module, name in bindings.values()}
    # The modules an import names, as the old guard saw them: `import runtime.ladders` binds only `runtime`.
    reached |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    reached |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    reached |= {resolve(n, bindings) for n in ast.walk(tree) if isinstance(n, ast.Name | ast.Attribute)} - {None}
    return frozenset(d for d in reached if in_runtime(d))


def forbidden_reached(path: Path) -> set[str]:
    return {d for d in reached_modules(path) if forbidden(d)}


# ---- Where each use is: the function it is in, and what its class calls its own ----


@dataclass(frozen=True)
class Where:
    function: str  # `Class.method`, `outer.inner`; `<module>` for top-level code
    own: frozenset[str]  # what the innermost class defines: its `self.x` is its own, not the runtime's


def class_members(cls: ast.ClassDef) -> frozenset[str]:
    """Names a class defines: in its body (fields, methods) or as `self.x = ...` in its methods."""
    body = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    body |= {t.id for n in cls.body for t in assigned(n) if isinstance(t, ast.Name)}
    selfs = {
        n.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and is_self(n.value)
    }
    return frozenset(body | selfs)


def assigned(node: ast.stmt) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def located(tree: ast.AST, where: Where = Where("<module>", frozenset())) -> Iterator[tuple[ast.AST, Where]]:
    """Every node with where it is, so an allowed use is allowed in its function only."""
    for child in ast.iter_child_nodes(tree):
        inner = where
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            name = child.name if where.function == "<module>" else f"{where.function}.{child.name}"
            inner = Where(name, class_members(child) if isinstance(child, ast.ClassDef) else where.own)
        yield child, inner
        yield from located(child, inner)


# ---- The scan ----


@dataclass(frozen=True)
class Use:
    path: str  # relative to the package scanned
    line: int
    function: str
    expr: str
    kind: str  # bucketer, builder, config, planning

    @property
    def key(self) -> str:
        return f"{self.path}: {self.function}: {self.expr}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.function}: {self.expr} ({self.kind})"


def not_the_runtimes(owner: ast.expr, attr: str, where: Where, bindings: dict[str, tuple[str, str | None]]) -> bool:
    """An attribute whose owner is plainly the harness's: `self.x` where the class defines `x`, or a
    harness module (`ragged_walk.buckets`, `derive.token_budget`)."""
    if is_self(owner) and attr in where.own:
        return True
    defined = resolve(owner, bindings) if isinstance(owner, ast.Name) else None
    return defined is not None and not in_runtime(defined)


def kind_of_call(fn: ast.expr, where: Where, bindings: dict[str, tuple[str, str | None]]) -> str | None:
    """A call of a bucketer or builder method or a planning method on anything but the harness's own,
    or a bare call of a runtime function by one of those names (however it was imported or renamed)."""
    if isinstance(fn, ast.Attribute):
        name = fn.attr
        if not_the_runtimes(fn.value, name, where, bindings):
            return None
    else:
        defined = resolve(fn, bindings)
        if not in_runtime(defined):
            return None
        name = defined.rpartition(".")[2]
    if name in BUCKETER_METHODS:
        return "bucketer"
    if name in BUILDER_METHODS:
        return "builder"
    return "planning" if name in PLANNING else None


def kind_of_attribute(node: ast.Attribute, where: Where, bindings: dict[str, tuple[str, str | None]]) -> str | None:
    """A derived config property read off anything but the harness's own, or a bucketer's ladder read
    off something named for a bucketer."""
    if not_the_runtimes(node.value, node.attr, where, bindings):
        return None
    if node.attr in DERIVED_CONFIG:
        return "config"
    if node.attr in BUCKETER_ATTRIBUTES and "bucketer" in ast.unparse(node.value).lower():
        return "bucketer"
    return None


@cache
def runtime_words(path: Path, root: Path = PACKAGE) -> tuple[Use, ...]:
    """Every use of the runtime's word in a module: a bucketer or builder answer, a derived config
    property, a planning call, or the runtime's bucketer built (however imported)."""
    rel, bindings = path.relative_to(root).as_posix(), module_bindings(path)
    found = []
    for node, where in located(parse(path)):
        kind = None
        if isinstance(node, ast.Call):
            kind = kind_of_call(node.func, where, bindings)
        elif isinstance(node, ast.Attribute):
            kind = kind_of_attribute(node, where, bindings)
        if isinstance(node, ast.Name | ast.Attribute) and resolve(node, bindings) in ANSWERING_CLASSES:
            kind = "bucketer"
        if kind:
            expr = f"{ast.unparse(node.func)}()" if isinstance(node, ast.Call) else ast.unparse(node)
            found.append(Use(rel, node.lineno, where.function, expr, kind))
    return tuple(found)


def bucketer_answers(path: Path, root: Path = PACKAGE) -> list[Use]:
    return [use for use in runtime_words(path, root) if use.kind == "bucketer"]


def unlisted(uses: Iterable[Use], allowed: dict[str, str]) -> list[str]:
    return [str(use) for use in uses if use.key not in allowed]


# Every use of the runtime's word outside the oracle, by `path: function: expression`, with why it is
# not an expected answer. A use not listed fails the scan; an entry no longer used fails too, so the
# list stays the exact set of exceptions. An entry allows its use in that function only.
PRINTS = "`spyre-verify ladders` prints what the runtime says it will do"
SEEDED = "a seeded fault is the runtime's own code rewritten: the faulty builder asks its own bucketer and config"
PROBE = "the builder probe: the bucket the runtime's builder picks is the actual side, held to the oracle's key"
ALLOWED: dict[str, str] = {
    # progress messages: how many graphs the runtime is about to compile, said to the user
    "serving/session.py: warm: engine.warm_plan()": "progress message: the count of graphs the runtime says it will compile",
    "soak/run.py: soak: engine.warm_plan()": "progress message: the count of graphs the runtime says it will compile",
    "bench/engine.py: build_rigs: engine.warm_plan()": "progress message: the count of graphs the runtime says it "
    "will compile",
    # the runtime's plan or builder as the actual side, or exercised as it planned
    "checks/graph_reuse.py: GraphReuse.preflight: self.engine.warm_plan()": "preflight calls each bucket the runtime "
    "planned, to prove it was compiled; what should be planned is judged by exactness against the walk",
    "checks/ladders.py: build: builder.build_prefill()": PROBE,
    "checks/ladders.py: build: builder.build_decode()": PROBE,
    "checks/ragged_probe.py: _attend: builder.build_attend()": PROBE,
    "checks/ragged_probe.py: _chunked: builder.build_chunked()": PROBE,
    "checks/ragged_probe.py: probe_ragged: builder.build_step()": "the builder probe: the runtime's calls for a step "
    "are the actual side, each held to the oracle's key and the step to the batched rule",
    "hunt/properties.py: _build: builder.build_prefill()": "the hunt replays a trace through the runtime's own "
    "builder: its bucket and table are the actual side, judged against derive",
    "hunt/properties.py: _build: builder.build_decode()": "as above: the runtime's builder is the actual side",
    "hunt/config.py: check_config: c.prefix_caching": "the runtime's reading of an accepted config is the actual "
    "side, held to the oracle's (`accept.reading`)",
    "hunt/world.py: world: SpyreAttnBucketer": "the runtime's own bucketer: the system under test the hunt drives",
    "hunt/world.py: world: warm_plan()": "the runtime's warm set is the actual side: a dispatch outside it is the "
    "stall the hunt looks for; the expected key comes from derive",
    "hunt/replay.py: _builder: SpyreAttnBucketer": "replay builds the runtime's own builder, the system under test",
    "testing/stateful.py: SchedulerMachine.setup: warm_plan()": "the runtime's warm set is the actual side: a dispatch "
    "outside it is the stall the state machine looks for; the expected key comes from derive",
    "hunt/startup.py: engine_limits: SpyreAttnBucketer": "the limits the engine sets, computed as `Engine.__init__` "
    "does: the actual side, held to the oracle's graph bounds and graph reuse's rule",
    "hunt/startup.py: engine_limits: SpyreAttnBucketer(c).candidates()": "as above: the bucketer's candidate count is "
    "what the engine sizes its limits from",
    "serving/sim.py: Sim.__init__: SpyreAttnBucketer": "the sim builds the runtime's own builder on its own bucketer",
    "serving/sim.py: Sim.__init__: config.total_blocks": "the sim is the runtime's own scheduler without tensors: its pool is "
    "the runtime's, as the engine builds it",
    "cli/ladders.py: exactness: SpyreAttnBucketer": "ladders builds the runtime's bucketer to judge its warm set",
    "cli/ladders.py: exactness: b.warm_set()": "ladders judges the runtime's warm set: it is the actual side, held to "
    "the harness's reachable set (oracle.walk.reachable)",
    "bench/layouts.py: pruning_figure: SpyreAttnBucketer": "figure 7c builds the runtime's bucketer to measure its "
    "warm set",
    "bench/layouts.py: pruning_figure: SpyreAttnBucketer(c).warm_set()": "figure 7c measures what the runtime's exact "
    "pruning saves: its warm set is the measured side, set beside a rule written from the real bucketer",
    # a runtime with no oracle: its own word is all there is, and it is shown or used as traffic
    "audit/run.py: _run: engine.warm_plan()": "a runtime without design_contract has no walk: the audit judges its "
    "buckets against the plan it declares (README 'Verify your own runtime')",
    "audit/run.py: _run: engine.ladders()": "the ladders report of a foreign runtime shows what it says beside what "
    "it does",
    "audit/run.py: _pruned: engine.bucketer.pruned()": "the bundled bucketer's pruning reasons, shown in the audit "
    "report, never judged",
    "serving/crowds.py: token_rungs: runtime.ladders()": "traffic, not an expected answer: the crowds also enter every rung "
    "the runtime announces, beside DESIGN's, so a runtime's own extra rung gets served too",
    "hunt/protocol_trace.py: shape_of: runtime.ladders()": "the protocol hunt of a foreign runtime, which has no "
    "oracle: its own ladders only pick lengths near its edges to send as traffic",
    # the runtime's protocol face: the bundled runtime answers for itself
    "runtimes/bundled.py: BundledRuntime.warm_plan: self.recorder.plan()": "the runtime's own protocol answer (warm_plan), "
    "the actual side",
    "runtimes/bundled.py: BundledRuntime.ladders: self.bucketer.ladders()": "the runtime's own protocol answer (ladders), "
    "the actual side",
    "runtimes/declared.py: Declared.warm_plan: self._runtime.warm_plan()": "the plain form, translated: the oracle's bucket "
    "for each the runtime planned, so that preflight calls get the runtime's own tuple back",
    # shown beside the oracle, never judged
    "report.py: config_payload: c.total_blocks": "a report field: the pool the runtime says it runs with, shown as "
    "its config",
    "report.py: config_payload: c.token_budget": "a report field: the ragged defaults as the runtime resolves them, "
    "shown as its config",
    "report.py: config_payload: c.decode_entries": "a report field, as above",
    "report.py: config_payload: c.batched_from": "a report field, as above",
    "faults/kill_table.py: run_config: config.token_budget": "a fault row's config as the row names it: shown, never judged",
    "bench/overhead.py: overhead_figures: config.total_blocks": "a bench settings field: the pool the benchmarked "
    "engine runs with",
    "cli/soak.py: payload: r.usable_blocks": "soak's own result field, shown in its report",
    "soak/run.py: audit_blocks: result.usable_blocks": "soak's own result field, read from the pool it observed, not the "
    "config",
    "cli/ladders.py: ladders_payload: SpyreAttnBucketer": PRINTS,
    "cli/ladders.py: ladders_payload: b.ladders()": PRINTS,
    "cli/ladders.py: ladders_payload: b.buckets()": PRINTS,
    "cli/ladders.py: ladders_payload: b.pruned()": PRINTS,
    "cli/ladders.py: ladders_payload: c.total_blocks": PRINTS,
    "cli/ladders.py: ladders_payload: c.usable_blocks": PRINTS,
    "cli/ladders.py: ladders_payload: c.token_budget": PRINTS,
    "cli/ladders.py: ladders_payload: c.decode_entries": PRINTS,
    "cli/ladders.py: ladders_payload: c.batch_tkv_limit": PRINTS,
    "cli/ladders.py: foreign: rt.warm_plan()": PRINTS,
    "cli/ladders.py: foreign: rt.ladders()": PRINTS,
    "cli/ladders.py: run: SpyreAttnBucketer": PRINTS,
    "cli/ladders.py: run: b.ladders()": PRINTS,
    "cli/ladders.py: run: b.buckets()": PRINTS,
    "cli/ladders.py: run: b.pruned()": PRINTS,
    "cli/ladders.py: run: c.token_budget": PRINTS,
    "cli/ladders.py: run: c.decode_entries": PRINTS,
    "cli/ladders.py: ladders_payload: c.prefix_caching": PRINTS,
    "cli/ladders.py: exactness: b.config.prefix_caching": "which oracle sets to list: the keys only a hit reaches "
    "are the oracle's, with caching on against off",
    "bench/layouts.py: pruning_figure: SpyreAttnBucketer(c.with_(enable_prefix_caching=False)).warm_set()": "figure "
    "7c also measures the runtime's exact warm set with caching off, shown in its details",
    "cli/ladders.py: run: c.batch_tkv_limit": PRINTS,
    "cli/ladders.py: run: c.total_blocks": PRINTS,
    "cli/ladders.py: run: c.usable_blocks": PRINTS,
    "cli/ladders.py: run: c.max_blocks_per_seq": PRINTS,
    # fault injection builds the broken runtime: it must read the runtime's values to break them
    "faults/padded.py: own_ladder_rung: b.bucketer.config.max_blocks_per_seq": "a seeded fault rebuilds the runtime's "
    "ladder wrongly",
    "faults/padded.py: inline_rung: b.bucketer.config.max_blocks_per_seq": "a seeded fault rebuilds the runtime's ladder "
    "wrongly",
    "faults/padded.py: limit_from_kv_ladder.compile_limits: config.max_blocks_per_seq": "a seeded fault sizes the recompile "
    "limit from the runtime's KV ladder",
    "faults/__init__.py: <module>: b.bucketer.config.total_blocks": "a seeded fault pads with the runtime's own out-of-pool id",
    "faults/padded.py: builder_rounding.patch.build_decode: self.row()": SEEDED,
    "faults/ragged.py: wide_step_queries.build_step: self.bucketer.attend_bucket()": "a seeded fault is the "
    "runtime's own code rewritten: the faulty builder still asks its bucketer, for the wrong query width",
    "faults/ragged.py: wide_step_queries.build_step: self.blocks_for()": SEEDED,
    "faults/ragged.py: own_query_ladder.attend_bucket: self.bucketer.config.token_budget": SEEDED,
    "faults/ragged.py: batches_from_two.build_step: self.bucketer.config.batched_from": SEEDED,
    "faults/ragged.py: batches_from_two.build_step: self.bucketer.num_seqs": "a seeded bug is runtime code: the "
    "patched builder asks its own bucketer whether a batched kernel exists, as the real builder does",
    "faults/ragged.py: batches_from_two.build_step: self.build_chunked()": SEEDED,
    "faults/ragged.py: batches_from_two.build_step: self.build_attend()": SEEDED,
    "faults/ragged.py: query_override: c.token_budget": "a seeded fault picks a config whose query ladder shows it",
    "faults/ragged_kv.py: chunk_offset_ignored.build_step: self.slots()": SEEDED,
    "faults/configs.py: sparse_override: c.max_blocks_per_seq": "a seeded fault sizes the runtime's ladder wrongly",
    "faults/configs.py: split_prompts: c.token_budget": "a seeded fault picks a config whose prompts are chunked",
    "faults/configs.py: with_pruning: c.token_budget": "a seeded fault picks a config whose bucketer prunes",
    "faults/configs.py: with_pruning: SpyreAttnBucketer": "a seeded fault picks a config whose bucketer prunes",
    "faults/configs.py: with_pruning: SpyreAttnBucketer(c).pruned()": "a seeded fault picks a config whose bucketer "
    "prunes",
    "faults/configs.py: unpruned: SpyreAttnBucketer": "a seeded fault warms the runtime's pruned buckets",
    "faults/configs.py: unpruned: SpyreAttnBucketer(c).pruned()": "a seeded fault warms the runtime's pruned buckets",
    "faults/configs.py: binding_limit: c.batch_tkv_limit": "a seeded fault picks a config whose limit binds",
    "sendnn/boot.py: vllm_config: sizes.prefix_caching": "the adapter's own choice of vLLM setting, passed to the "
    "engine it boots: an input it sets, not an answer it reads",
    "sendnn/runtime.py: SendnnRuntime.__init__: sizes.prefix_caching": "as above: the declared config carries the "
    "adapter's own setting",
}


MODULES = sorted(PACKAGE.rglob("*.py"))


def complaints(path: Path, root: Path = PACKAGE, allowed: dict[str, str] = ALLOWED) -> list[str]:
    """Everything the guard holds against one module; each module test below asserts its part is empty."""
    rel = path.relative_to(root).as_posix()
    out = [f"{rel}: reaches {d}" for d in sorted(forbidden_reached(path))]
    if path.relative_to(root).parts[0] in JUDGING_PACKAGES:
        out += [f"a judge asks the bucketer: {use}" for use in bucketer_answers(path, root)]
    return out + [f"unlisted: {use}" for use in unlisted(runtime_words(path, root), allowed)]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_harness_module_imports_the_runtime_ladder_or_reachability_code(path: Path) -> None:
    assert [c for c in complaints(path) if " reaches " in c] == []


@pytest.mark.parametrize("path", JUDGES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_checker_or_oracle_asks_the_bucketer(path: Path) -> None:
    assert [c for c in complaints(path) if c.startswith("a judge asks")] == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_takes_the_runtimes_word_for_an_expected_answer(path: Path) -> None:
    assert [c for c in complaints(path) if c.startswith("unlisted")] == [], (
        "derive it in spyre_verify/oracle, or add it to ALLOWED with why it is the runtime's word"
    )


def test_every_allowed_use_is_still_there_and_says_why() -> None:
    used = {use.key for path in MODULES for use in runtime_words(path)}
    assert sorted(set(ALLOWED) - used) == [], "an exception no longer used: remove it"
    assert all(why.strip() for why in [*ALLOWED.values(), *NOT_DERIVED.values()])
    # Every sub-package is scanned, not only the checkers and the oracle.
    scanned = {p.relative_to(PACKAGE).parts[0] if len(p.relative_to(PACKAGE).parts) > 1 else "." for p in MODULES}
    assert scanned >= {".", "audit", "bench", "checks", "cli", "hunt", "oracle"}, scanned
    # The oracle itself takes nothing on the runtime's word.
    assert not [use for use in ALLOWED if use.startswith("oracle/")]
    assert JUDGES, "the judges' modules were not found"


def test_what_counts_is_read_off_the_runtimes_classes() -> None:
    assert {"usable_blocks", "total_blocks", "batch_tkv_limit", "max_blocks_per_seq"} <= DERIVED_CONFIG
    assert {"token_budget", "decode_entries", "batched_from"} <= DERIVED_CONFIG
    assert set(NOT_DERIVED) <= properties(RuntimeConfig), "an exemption for a property that is gone"
    assert {"attend_bucket", "chunked_bucket", "decode_bucket", "warm_set", "pruned", "ladders"} <= BUCKETER_METHODS
    assert {"build_step", "build_attend", "build_chunked", "build_decode", "build_prefill"} <= BUILDER_METHODS
    assert {"kv_blocks", "num_seqs", "query_tokens", "limits"} <= BUCKETER_ATTRIBUTES

    # A property or method the runtime grows is covered with no edit here.
    class Grown(RuntimeConfig):
        @property
        def new_limit(self) -> int:
            return 1

    class GrownBuilder(RaggedBuilder):
        def new_key(self) -> None: ...

    assert "new_limit" in properties(Grown)
    assert "new_key" in public_methods(GrownBuilder)


# One synthetic module for each hole the guard had (issue 39), at the path it is scanned as, with the
# allow-list it is scanned against, and exactly what the guard must say. The old guard passed each.
AUDIT_ALLOWS = {"audit/run.py: judge_unserved: engine.warm_plan()": "a foreign runtime's declared plan"}
HOLES = {
    # 1. Forbidden code reached through `runtime.bucketer`'s re-exports, renamed, or by attribute.
    "re-export": (
        "checks/hole.py",
        "from runtime.bucketer import ladders\n"
        "from runtime.bucketer import decode_costs as costs\n"
        "import runtime.bucketer\n"
        "def expected(n):\n"
        "    return ladders.round_up((1, 2), n, 'x'), costs, runtime.bucketer.ragged_verdicts\n",
        {},
        [
            "checks/hole.py: reaches runtime.ladders",
            "checks/hole.py: reaches runtime.ladders.round_up",
            "checks/hole.py: reaches runtime.ragged_buckets.ragged_verdicts",
            "checks/hole.py: reaches runtime.reachability.decode_costs",
        ],
    ),
    # 2. A bucketer or builder answer asked of an owner not named for a bucketer.
    "owner": (
        "checks/hole.py",
        "def expected(engine, seq):\n    return engine.builder.attend_bucket(seq), engine.builder.build_step([seq], None)\n",
        {},
        [
            "a judge asks the bucketer: checks/hole.py:2: expected: engine.builder.attend_bucket() (bucketer)",
            "unlisted: checks/hole.py:2: expected: engine.builder.attend_bucket() (bucketer)",
            "unlisted: checks/hole.py:2: expected: engine.builder.build_step() (builder)",
        ],
    ),
    # 3. The ragged derived config properties.
    "ragged config": (
        "checks/hole.py",
        "def expected(config):\n    return config.token_budget, config.decode_entries, config.batched_from\n",
        {},
        [
            "unlisted: checks/hole.py:2: expected: config.token_budget (config)",
            "unlisted: checks/hole.py:2: expected: config.decode_entries (config)",
            "unlisted: checks/hole.py:2: expected: config.batched_from (config)",
        ],
    ),
    # 4. A use allowed in one function, written again in another of the same module.
    "function": (
        "audit/run.py",
        "def judge_unserved(engine):\n"
        "    return engine.warm_plan()\n"
        "def expected_buckets(engine):\n"
        "    return engine.warm_plan()\n",
        AUDIT_ALLOWS,
        ["unlisted: audit/run.py:4: expected_buckets: engine.warm_plan() (planning)"],
    ),
}


@pytest.mark.parametrize("hole", HOLES)
def test_the_guard_fails_a_module_that_uses_one_of_its_old_holes(tmp_path: Path, hole: str) -> None:
    rel, source, allowed, expected = HOLES[hole]
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    path.write_text(source)
    assert complaints(path, tmp_path, allowed) == expected


def test_the_scan_sees_every_derived_property_and_planning_call(tmp_path: Path) -> None:
    # The control: each forbidden pattern, in a module of a sub-package, is found and not allowed;
    # the harness's own names that share a word with the runtime's are not.
    sub = tmp_path / "hunt"
    sub.mkdir()
    bad = sub / "bad.py"
    bad.write_text(
        "from runtime.reachability import decode_reachable\n"
        "import runtime.ladders\n"
        "from runtime.ragged_reachability import chunk_reach\n"
        "from runtime import ragged_buckets\n"
        "from runtime.warmup import warm_plan\n"
        "from runtime.bucketer import SpyreAttnBucketer as Bucketer\n"
        "from spyre_verify.oracle import derive, ragged_walk\n"
        "def expected(engine, config, b):\n"
        "    u = config.usable_blocks + config.total_blocks + config.batch_tkv_limit + config.max_blocks_per_seq\n"
        "    return u, engine.warm_plan(), engine.ladders(), engine.recorder.plan(), b.candidates(), b.pruned(),\\\n"
        "        warm_plan(b), engine.bucketer.kv_blocks, Bucketer(config)\n"
        "def fine(ladders, plan, config):\n"
        "    return ladders(1), plan, derive.token_budget(config), ragged_walk.buckets(config, 1)\n"
        "class Own:\n"
        "    batched_from: int\n"
        "    def rows(self):\n"
        "        return self.batched_from  # the class's own field, not the config's\n"
    )
    assert {c.split(" reaches ")[1] for c in complaints(bad, tmp_path) if " reaches " in c} == {
        "runtime.reachability",
        "runtime.reachability.decode_reachable",
        "runtime.ladders",
        "runtime.ragged_reachability",
        "runtime.ragged_reachability.chunk_reach",
        "runtime.ragged_buckets",
    }
    found = [use.key for use in runtime_words(bad, tmp_path)]
    assert sorted(found) == sorted(
        f"hunt/bad.py: expected: {expr}"
        for expr in [
            "config.usable_blocks",
            "config.total_blocks",
            "config.batch_tkv_limit",
            "config.max_blocks_per_seq",
            "engine.warm_plan()",
            "engine.ladders()",
            "engine.recorder.plan()",
            "b.candidates()",
            "b.pruned()",
            "warm_plan()",
            "engine.bucketer.kv_blocks",
            "Bucketer",
        ]
    ), found
    assert not set(found) & set(ALLOWED)
