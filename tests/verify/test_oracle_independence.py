"""The oracles share no code with what they judge (DESIGN "Oracles: who may judge what").

No module of `spyre_verify` imports the runtime's ladder maths or its closed-form
reachability, and no checker or oracle module asks a bucketer for an answer: a bug in
shared code would move the expected and the actual answer together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import spyre_verify

PACKAGE = Path(spyre_verify.__file__).parent
FORBIDDEN_MODULES = {"runtime.ladders", "runtime.reachability"}
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


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_harness_module_imports_the_runtime_ladder_or_reachability_code(path: Path) -> None:
    assert not imported_modules(path) & FORBIDDEN_MODULES


@pytest.mark.parametrize("path", JUDGES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_checker_or_oracle_asks_the_bucketer(path: Path) -> None:
    assert bucketer_answers(path) == []


def test_the_scan_sees_a_forbidden_import_and_a_bucketer_answer(tmp_path: Path) -> None:
    # The control: a module that does both is caught by both scans.
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from runtime.reachability import decode_reachable\n"
        "import runtime.ladders\n"
        "def expected(engine):\n"
        "    return engine.bucketer.warm_set()\n"
    )
    assert imported_modules(bad) & FORBIDDEN_MODULES == FORBIDDEN_MODULES
    assert bucketer_answers(bad) == ["bad.py:4: engine.bucketer.warm_set"]
    assert JUDGES, "the judges' modules were not found"
