"""The adapter as the harness opens it: it satisfies the protocol, offers what its checkers need,
and `close()` puts back every hook it set, warmed up or not."""

from __future__ import annotations

from typing import Any

import pytest

from spyre_verify.runtimes import open_runtime, resolve_name
from spyre_verify.runtimes.protocol import Settings, missing
from spyre_verify.sendnn import boot
from tests.sendnn.helpers import SENDNN, changed_hooks, serve

SETTINGS = Settings(64, 256, 2, "eager", "cpu")


def test_the_name_sendnn_resolves_to_the_adapter() -> None:
    assert resolve_name("sendnn", env={}) == SENDNN


def test_an_unwarmed_runtime_satisfies_the_protocol_and_closes_clean(originals: dict[str, Any]) -> None:
    rt = open_runtime(SENDNN, SETTINGS)
    try:
        assert missing(rt) == []
        assert {"padding_sink", "reservations", "paging", "reference", "control_calls"} <= rt.capabilities
        assert "design_contract" not in rt.capabilities  # the plugin follows neither of DESIGN's layouts
        assert rt.padding_sink == rt.null_block == 0
        assert issubclass(rt.refusal, ValueError)
        c = rt.config
        assert (c.block_size, c.max_model_len, c.max_num_seqs) == (64, 256, 2)
        assert (c.model.vocab_size, c.model.eos_token_id) == (boot.VOCAB, boot.EOS)
        assert rt.num_blocks == c.num_blocks > 256 // 64  # a pool of vLLM's, beyond one request's blocks
        assert rt.steps == 0 and rt.finished == {} and not rt.has_work()
        assert [str(b) for b in rt.warm_plan()] == ["prefill(symbolic)", "decode(symbolic)"]
        assert rt.ladders() == {}
        assert set(rt.faults()) == {
            "slot-off-by-one",
            "padding-into-real-block",
            "static-table-width",
            "swapped-table-rows",
            "eager-forward",
            "leaked-reservation",
        }
    finally:
        rt.close()
    assert changed_hooks(originals) == []


def test_a_warmed_runtime_hooks_the_plugin_and_close_puts_every_hook_back(originals: dict[str, Any]) -> None:
    rt = open_runtime(SENDNN, SETTINGS)
    try:
        rt.warmup()
        hooked = set(changed_hooks(originals))
        # While warm, the adapter's hooks are in place: the test below could fail.
        run = "sendnn_inference.v1.worker.spyre_model_runner.ChunkedPrefillModelRunner"
        assert {
            "sendnn_inference.model_executor.model_loader.spyre.SpyreCausalLM.forward",
            f"{run}.pre_warmup",
            f"{run}._prepare_chunked_prefill",
        } <= hooked
        model = rt.observer.model
        assert model._compiled_forward is rt.slot
        rt.add_request([5, 6, 7], 2, ignore_eos=True)
        serve(rt)
        assert rt.finished["req-0"].reason == "length"
        # The hooks are on the plugin's classes: a second runtime may not warm over them.
        other = open_runtime(SENDNN, SETTINGS)
        try:
            with pytest.raises(RuntimeError, match="another sendnn runtime is warm in this process"):
                other.warmup()
        finally:
            other.close()
        assert set(changed_hooks(originals)) == hooked  # the refused one took nothing of the warm one's
    finally:
        rt.close()
    assert changed_hooks(originals) == []
    assert model._compiled_forward is not rt.slot  # the model's own compiled slot, as the plugin left it
    assert rt.core is None and len(rt.hooks) == 0
    rt.close()  # a second close is harmless
    assert changed_hooks(originals) == []


def test_a_commands_stdout_stays_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    """The plugin prints a logo and notes, and vLLM logs, on stdout by default: the adapter sends
    them to stderr, so that `--json` output parses."""
    import json

    from spyre_verify.cli.main import main

    capsys.readouterr()
    code = main(["runtimes", "--runtime", "sendnn", "--json"])
    rows = {r["name"]: r["status"] for r in json.loads(capsys.readouterr().out)["runtimes"]}
    assert code == 0 and rows["sendnn"] == "ok"
