"""A declared contract: validated with the harness's own config rules, buckets in plain form made
the oracle's, the config judged built from what the harness asked and what the runtime declared."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.config import RuntimeConfig
from runtime.keys import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey
from spyre_verify.checks.counting import Short
from spyre_verify.runtimes.declared import (
    DeclarationError,
    Declared,
    as_bucket,
    declare,
    declared_config,
    expected_config,
)

RAGGED = {"layout": "ragged", "block_size": 4, "max_model_len": 32, "max_num_seqs": 4}
MODEL = (64, 1, 2)  # vocab, EOS, layers


@pytest.mark.parametrize(
    ("declaration", "match"),
    [
        ([("layout", "ragged")], "contract must be a mapping of config values, got list"),
        ({**RAGGED, "page_size": 4}, "unknown key 'page_size'; a contract declares layout, block_size"),
        ({"layout": "ragged", "block_size": 4, "max_model_len": 32}, "'max_num_seqs' is missing"),
        ({**RAGGED, "layout": "paged"}, "layout='paged' is not a layout the harness models"),
        ({**RAGGED, "block_size": 3}, "contract: block_size=3: must be a power of two"),
        ({**RAGGED, "query_buckets": [8, 4]}, "contract: query_buckets='8,4': must be increasing: write '4,8'"),
        ({**RAGGED, "layout": "padded", "max_num_batched_tokens": 8}, "the step token budget is a ragged-layout"),
    ],
)
def test_a_declaration_is_held_to_the_harness_config_rules(declaration: object, match: str) -> None:
    with pytest.raises(DeclarationError, match=match):
        declared_config(declaration, MODEL)


def test_a_valid_declaration_is_the_harness_own_config_with_the_runtime_model() -> None:
    c = declared_config({**RAGGED, "query_buckets": [8, 32]}, MODEL)
    assert isinstance(c, RuntimeConfig) and c.ragged and c.query_buckets == (8, 32) and c.token_budget == 32
    assert (c.model.vocab_size, c.model.eos_token_id, c.model.num_layers) == MODEL


def test_plain_buckets_are_the_oracle_buckets() -> None:
    assert as_bucket(("attend", 1, 1)) == Bucket(ATTEND, AttendKey(1, 1))
    assert as_bucket(("chunked", 2, 4, 1)) == Bucket(CHUNKED, ChunkedKey(2, 4, 1))
    mine = Bucket(ATTEND, AttendKey(2, 8))
    assert as_bucket(mine) is mine
    with pytest.raises(DeclarationError, match="unknown kernel 'paged'"):
        as_bucket(("paged", 1))
    with pytest.raises(DeclarationError, match="not in the plain form"):
        as_bucket("attend(1, 1)")
    with pytest.raises(DeclarationError, match="attend takes AttendKey's fields"):
        as_bucket(("attend", 1))


def runtime(**attrs: object) -> SimpleNamespace:
    model = SimpleNamespace(vocab_size=64, eos_token_id=1)
    base = {"capabilities": frozenset({"paging"}), "config": SimpleNamespace(model=model), "close": lambda: None}
    return SimpleNamespace(**{**base, **attrs})


def test_declare_grants_the_contract_and_refuses_what_it_cannot_honour() -> None:
    d = declare(runtime(contract=RAGGED, layers=2), "--runtime='m:f'")
    assert isinstance(d, Declared) and "design_contract" in d.capabilities and d.config.model.num_layers == 2
    assert d.declared_fields == tuple(RAGGED)
    none = runtime(contract={"layout": "none"})
    assert declare(none, "x") is none  # the layout-free rules only
    with pytest.raises(DeclarationError, match=r"--runtime='m:f': contract: block_size=3"):
        declare(runtime(contract={**RAGGED, "block_size": 3}), "--runtime='m:f'")
    with pytest.raises(DeclarationError, match="layers=0: declare the compiled calls one dispatch makes"):
        declare(runtime(contract=RAGGED, layers=0), "x")
    with pytest.raises(DeclarationError, match="the harness grants it, drop it"):
        declare(runtime(contract=RAGGED, capabilities=frozenset({"design_contract"})), "x")
    with pytest.raises(DeclarationError, match="claims design_contract, but its config is a SimpleNamespace"):
        declare(runtime(capabilities=frozenset({"design_contract"})), "x")


def test_the_config_judged_is_what_the_harness_asked_and_the_declaration_for_the_rest() -> None:
    d = declare(runtime(contract={**RAGGED, "max_model_len": 16, "max_num_batched_tokens": 8}, layers=2), "x")
    padded = RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=4, backend="eager")
    c = expected_config(padded, d)
    # Sizes the harness asked for stand (a differing declaration is config-mismatch); the layout
    # and its values come from the declaration.
    assert (c.layout, c.max_model_len, c.token_budget, c.backend, c.model.num_layers) == ("ragged", 32, 8, "eager", 2)
    ragged = padded.with_(layout="ragged", max_num_batched_tokens=16)
    assert expected_config(ragged, d).token_budget == 16  # asked of the factory: the harness's stands
    assert expected_config(padded, "not declared") is padded


def test_a_short_names_the_layers_no_graph_served() -> None:
    assert Short(3, "attend(1, 1)", 2, 1, layers=2).layer().startswith("; layer 2 of 2 ran without a compiled graph")
    assert "layers 2 to 3 of 3" in Short(3, "attend(1, 1)", 6, 2, layers=3).layer()
    assert Short(3, "attend(1, 1)", 2, 1).layer() == ""  # one layer: nothing to name
