"""The oracles share no code with what they judge (DESIGN "Oracles: who may judge what").

No module of `spyre_verify` imports the runtime's ladder maths or its closed-form
reachability, and no module (every sub-package and the top level) asks a bucketer for an
answer, reads a config property the runtime derives (`usable_blocks`, `total_blocks`,
`batch_tkv_limit`, `max_blocks_per_seq`) or calls a runtime planning method (`warm_plan`,
`ladders`, `plan`, `candidates`, `pruned`): a bug in shared code would move the expected
and the actual answer together. Where such a use is the runtime's word on purpose (what it
planned, shown or exercised, never what it should have done), `ALLOWED` names it with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import spyre_verify

PACKAGE = Path(spyre_verify.__file__).parent
FORBIDDEN_MODULES = {"runtime.ladders", "runtime.reachability", "runtime.ragged_reachability", "runtime.ragged_buckets"}
# Modules whose answers are expected answers: the checkers and the oracle itself.
JUDGES = sorted([*PACKAGE.glob("checks/*.py"), *PACKAGE.glob("oracle/*.py")])
# The bucketer's answers, and the attributes that hold them.
BUCKETER_ANSWERS = {
    "decode_bucket",
    "prefill_bucket",
    "kv_rung",
    "seqs_rung",
    "prefill_rung",
    "uses_batched",
    "warm_set",
    "buckets",
    "pruned",
    "candidates",
    "kv_blocks",
    "num_seqs",
    "prefill_tokens",
    "limits",
    "attend_bucket",
    "chunked_bucket",
    "query_rung",
    "query_tokens",
    "kv_members",
}


# Config properties the runtime computes from the raw fields: the oracle derives each (`oracle.derive`).
DERIVED_CONFIG = {"usable_blocks", "total_blocks", "batch_tkv_limit", "max_blocks_per_seq"}
# The runtime's planning methods: what it means to compile or dispatch, never what it should.
PLANNING = {"warm_plan", "ladders", "plan", "candidates", "pruned", "warm_set", "enumerate_buckets"}
# Every use of the runtime's word outside the oracle, by `path: expression`, with why it is not an
# expected answer. A use not listed fails the scan; an entry no longer used fails too, so the list
# stays the exact set of exceptions.
ALLOWED: dict[str, str] = {
    # progress messages: how many graphs the runtime is about to compile, said to the user
    "session.py: engine.warm_plan()": "progress message: the count of graphs the runtime says it will compile",
    "soak.py: engine.warm_plan()": "progress message: the count of graphs the runtime says it will compile",
    "bench/engine.py: engine.warm_plan()": "progress message: the count of graphs the runtime says it will compile",
    "sendnn/runtime.py: self.warm_plan()": "the real plugin's adapter reports its own plan to warmup's progress: "
    "the runtime's side speaking for itself",
    "bench/layouts.py: SpyreAttnBucketer(c).warm_set": "figure 7c measures what the runtime's exact pruning "
    "saves: its warm set is the measured side, set beside a rule written from the real bucketer",
    "bench/layouts.py: SpyreAttnBucketer": "figure 7c builds the runtime's bucketer to measure its warm set",
    "bench/layouts.py: SpyreAttnBucketer(c).warm_set()": "figure 7c: the runtime's warm set is the measured side",
    "ragged_faults.py: self.bucketer.attend_bucket": "a seeded fault is the runtime's own code rewritten: the "
    "faulty builder still asks its bucketer, for the wrong query width",
    # the runtime's plan as the actual side, or exercised as it planned
    "checks/graph_reuse.py: self.engine.warm_plan()": "preflight calls each bucket the runtime planned, to "
    "prove it was compiled; what should be planned is judged by exactness against the walk",
    "hunt/world.py: warm_plan()": "the runtime's warm set is the actual side: a dispatch outside it is the stall "
    "the hunt looks for; the expected key comes from derive",
    "stateful.py: warm_plan()": "the runtime's warm set is the actual side: a dispatch outside it is the stall "
    "the state machine looks for; the expected key comes from derive",
    "cli/ladders.py: b.warm_set()": "ladders prints the runtime's warm set and judges it: it is the actual "
    "side, held to the harness's reachable set (oracle.walk.reachable)",
    "crowds.py: runtime.ladders()": "traffic, not an expected answer: the crowds also enter every rung the "
    "runtime announces, beside DESIGN's, so a runtime's own extra rung gets served too",
    "audit/run.py: engine.warm_plan()": "a runtime without design_contract has no walk: the audit judges its "
    "buckets against the plan it declares (README 'Verify your own runtime')",
    "audit/run.py: engine.ladders()": "the ladders report of a foreign runtime shows what it says beside what it does",
    "audit/run.py: engine.bucketer.pruned()": "the bundled bucketer's pruning reasons, shown in the audit report, "
    "never judged",
    "audit/run.py: engine.bucketer.pruned": "the same call, seen as a bucketer attribute",
    "hunt/protocol_trace.py: runtime.ladders()": "the protocol hunt of a foreign runtime, which has no oracle: its "
    "own ladders only pick lengths near its edges to send as traffic",
    # the runtime's protocol face: the bundled runtime answers for itself
    "bundled.py: self.recorder.plan()": "the runtime's own protocol answer (warm_plan), the actual side",
    "bundled.py: self.bucketer.ladders()": "the runtime's own protocol answer (ladders), the actual side",
    # shown beside the oracle, or what the runtime is told
    "report.py: c.total_blocks": "a report field: the pool the runtime says it runs with, shown as its config",
    "cli/ladders.py: c.total_blocks": "`spyre-verify ladders` prints what the runtime says it will do",
    "cli/ladders.py: c.usable_blocks": "`spyre-verify ladders` prints what the runtime says it will do",
    "cli/ladders.py: c.batch_tkv_limit": "`spyre-verify ladders` prints what the runtime says it will do",
    "cli/ladders.py: c.max_blocks_per_seq": "`spyre-verify ladders` prints what the runtime says it will do",
    "cli/ladders.py: b.pruned()": "`spyre-verify ladders` prints the bucketer's pruning with its reasons",
    "cli/ladders.py: b.ladders()": "`spyre-verify ladders` prints the bucketer's ladders",
    "cli/ladders.py: rt.warm_plan()": "`spyre-verify ladders` prints the runtime's warm plan",
    "ragged_faults.py: self.bucketer.num_seqs": "a seeded bug is runtime code: the patched builder asks its own "
    "bucketer whether a batched kernel exists, as the real builder does",
    "declared.py: self._runtime.warm_plan()": "the plain form, translated: the oracle's bucket for each the runtime "
    "planned, so that preflight calls get the runtime's own tuple back",
    "declared.py: self.warm_plan()": "as above: a preflight before any warm_plan() call fills the translation first",
    "cli/ladders.py: rt.ladders()": "`spyre-verify ladders` prints the runtime's ladders",
    "runtimes.py: c.total_blocks": "the pool handed to a foreign runtime as an option: input, not an answer",
    "bench/overhead.py: config.total_blocks": "a bench settings field: the pool the benchmarked engine runs with",
    "sim.py: config.total_blocks": "the sim is the runtime's own scheduler without tensors: its pool is the "
    "runtime's, as the engine builds it",
    "soak.py: self.usable_blocks": "soak's own result field, read from the pool it observed, not the config",
    "cli/soak.py: r.usable_blocks": "soak's own result field, shown in its report",
    "soak.py: result.usable_blocks": "soak's own result field, read from the pool it observed, not the config",
    # fault injection builds the broken runtime: it must read the runtime's values to break them
    "faults.py: b.bucketer.config.max_blocks_per_seq": "a seeded fault rebuilds the runtime's ladder wrongly",
    "fault_configs.py: c.max_blocks_per_seq": "a seeded fault sizes the runtime's ladder wrongly",
    "faults.py: config.max_blocks_per_seq": "a seeded fault sizes the recompile limit from the runtime's KV ladder",
    "fault_configs.py: SpyreAttnBucketer(c).pruned()": "a seeded fault warms the runtime's pruned buckets",
    "fault_configs.py: SpyreAttnBucketer(c).pruned": "the same call, seen as a bucketer attribute",
    "fault_configs.py: c.batch_tkv_limit": "a seeded fault picks a config whose limit binds",
    "faults.py: b.bucketer.config.total_blocks": "a seeded fault pads with the runtime's own out-of-pool id",
    "fault_configs.py: SpyreAttnBucketer": "seeded faults subclass or rebuild the runtime's bucketer",
    "hunt/world.py: SpyreAttnBucketer": "the runtime's own bucketer: the system under test the hunt drives",
    "sim.py: SpyreAttnBucketer": "the sim builds the runtime's own builder on its own bucketer",
    "hunt/replay.py: SpyreAttnBucketer": "replay builds the runtime's own builder, the system under test",
    "cli/ladders.py: SpyreAttnBucketer": "`spyre-verify ladders` prints the bucketer's answers",
}


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def bucketer_answers(path: Path) -> list[str]:
    """`<something bucketer>.<answer>` uses, e.g. `engine.bucketer.warm_set()`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in BUCKETER_ANSWERS:
            owner = ast.unparse(node.value)
            if "bucketer" in owner.lower():
                found.append(f"{path.name}:{node.lineno}: {owner}.{node.attr}")
        if isinstance(node, ast.Name) and node.id == "SpyreAttnBucketer":
            found.append(f"{path.name}:{node.lineno}: SpyreAttnBucketer")
    return found


def runtime_words(path: Path, root: Path = PACKAGE) -> list[str]:
    """Every use of the runtime's word in a module, as `path: expression`: a bucketer answer, a
    derived config property, a planning method called on anything, or a planning function
    imported from the runtime and called."""
    rel = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(), str(path))
    from_runtime = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "runtime"
        for a in node.names
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            if node.attr in DERIVED_CONFIG or (node.attr in BUCKETER_ANSWERS and "bucketer" in owner.lower()):
                found.append(f"{rel}: {owner}.{node.attr}")
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Attribute) and fn.attr in PLANNING:
                found.append(f"{rel}: {ast.unparse(fn.value)}.{fn.attr}()")
            elif isinstance(fn, ast.Name) and fn.id in PLANNING and fn.id in from_runtime:
                found.append(f"{rel}: {fn.id}()")
        elif isinstance(node, ast.Name) and node.id == "SpyreAttnBucketer":
            found.append(f"{rel}: SpyreAttnBucketer")
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_harness_module_imports_the_runtime_ladder_or_reachability_code(path: Path) -> None:
    assert not imported_modules(path) & FORBIDDEN_MODULES


@pytest.mark.parametrize("path", JUDGES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_checker_or_oracle_asks_the_bucketer(path: Path) -> None:
    assert bucketer_answers(path) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_takes_the_runtimes_word_for_an_expected_answer(path: Path) -> None:
    unlisted = [use for use in runtime_words(path) if use not in ALLOWED]
    assert unlisted == [], "derive it in spyre_verify/oracle, or add it to ALLOWED with why it is the runtime's word"


def test_every_allowed_use_is_still_there_and_says_why() -> None:
    used = {use for path in MODULES for use in runtime_words(path)}
    assert sorted(set(ALLOWED) - used) == [], "an exception no longer used: remove it"
    assert all(why.strip() for why in ALLOWED.values())
    # Every sub-package is scanned, not only the checkers and the oracle.
    scanned = {p.relative_to(PACKAGE).parts[0] if len(p.relative_to(PACKAGE).parts) > 1 else "." for p in MODULES}
    assert scanned >= {".", "audit", "bench", "checks", "cli", "hunt", "oracle"}, scanned
    # The oracle itself takes nothing on the runtime's word.
    assert not [use for use in ALLOWED if use.startswith("oracle/")]


def test_the_scan_sees_a_forbidden_import_and_a_bucketer_answer(tmp_path: Path) -> None:
    # The control: a module that does both is caught by both scans.
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from runtime.reachability import decode_reachable\n"
        "import runtime.ladders\n"
        "from runtime.ragged_reachability import chunk_reach\n"
        "from runtime import ragged_buckets\n"
        "def expected(engine):\n"
        "    return engine.bucketer.warm_set()\n"
    )
    assert imported_modules(bad) & FORBIDDEN_MODULES == FORBIDDEN_MODULES
    assert bucketer_answers(bad) == ["bad.py:6: engine.bucketer.warm_set"]
    assert JUDGES, "the judges' modules were not found"


def test_the_scan_sees_every_derived_property_and_planning_call(tmp_path: Path) -> None:
    # The control: each forbidden pattern, in a module of a sub-package, is found and not allowed.
    sub = tmp_path / "hunt"
    sub.mkdir()
    bad = sub / "bad.py"
    bad.write_text(
        "from runtime.warmup import warm_plan\n"
        "def expected(engine, config, b):\n"
        "    u = config.usable_blocks + config.total_blocks + config.batch_tkv_limit + config.max_blocks_per_seq\n"
        "    return u, engine.warm_plan(), engine.ladders(), engine.recorder.plan(), b.candidates(), b.pruned(),\\\n"
        "        warm_plan(b), engine.bucketer.kv_blocks\n"
        "def fine(ladders, plan):\n"
        "    return ladders(1), plan  # a local name, not the runtime's\n"
    )
    found = runtime_words(bad, tmp_path)
    assert sorted(found) == sorted(
        [
            "hunt/bad.py: config.usable_blocks",
            "hunt/bad.py: config.total_blocks",
            "hunt/bad.py: config.batch_tkv_limit",
            "hunt/bad.py: config.max_blocks_per_seq",
            "hunt/bad.py: engine.warm_plan()",
            "hunt/bad.py: engine.ladders()",
            "hunt/bad.py: engine.recorder.plan()",
            "hunt/bad.py: b.candidates()",
            "hunt/bad.py: b.pruned()",
            "hunt/bad.py: warm_plan()",
            "hunt/bad.py: engine.bucketer.kv_blocks",
        ]
    ), found
    assert not set(found) & set(ALLOWED)
