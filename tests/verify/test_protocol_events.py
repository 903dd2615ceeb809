"""Every kind of event a runtime of this repository sends is in `protocol.EVENTS`, so a user
reading the protocol sees all of them: the bundled runtime's, the real plugin's adapter's and
the foreign test runtime's, read off their `emit("kind", ...)` calls."""

from __future__ import annotations

import re
from pathlib import Path

from spyre_verify.runtimes.protocol import EVENTS

ROOT = Path(__file__).resolve().parents[2]
EMIT = re.compile(r"""\bemit\(\s*["']([a-z_]+)["']""")
SENDERS = ("runtime", "spyre_verify/sendnn", "tests/foreign")


def sent_kinds() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for where in SENDERS:
        for path in sorted((ROOT / where).rglob("*.py")):
            for kind in EMIT.findall(path.read_text()):
                out.setdefault(kind, set()).add(str(path.relative_to(ROOT)))
    return out


def test_every_event_a_runtime_sends_is_in_the_protocol() -> None:
    sent = sent_kinds()
    assert {"dispatch", "compile", "state", "kv_write"} <= sent.keys()  # the scan reads the senders
    assert {kind: sorted(where) for kind, where in sent.items() if kind not in EVENTS} == {}


def test_the_protocol_names_no_event_nobody_sends() -> None:
    assert sorted(set(EVENTS) - sent_kinds().keys()) == []


def test_the_real_plugins_adapter_sends_exactly_the_protocols_fields() -> None:
    """Its event types are plain dataclasses (importable without vLLM): each carries the fields
    protocol.EVENTS names for its kind, no more, no fewer."""
    import dataclasses

    import spyre_verify.sendnn.events as ev

    kinds = {
        "dispatch": ev.Dispatch,
        "compile": ev.Compile,
        "token": ev.Token,
        "request": ev.Request,
        "finish": ev.Finish,
        "step": ev.Step,
        "block_table": ev.BlockTable,
        "kv_write": ev.KVWrite,
    }
    for kind, cls in kinds.items():
        named = re.sub(r"\([^()]*\)", "", re.sub(r"\([^()]*\)", "", EVENTS[kind])).split(":", 1)[1]
        assert sorted(f.name for f in dataclasses.fields(cls)) == sorted(x.strip() for x in named.split(",")), kind
