"""What each hunt property draws, read from one byte string a case (`hunt.tape`).

Hypothesis draws and shrinks each case as one `bytes` choice: one choice however long the
trace, where drawing a dispatch case choice by choice cost more than checking it. The
readers are the public strategies' own `draw_*` functions (`hunt.strategies`), so a case
means the same whichever way it was drawn. A dispatch case reads its config from the
first CONFIG_TAPE bytes and its trace from the rest, so shrinking the config never shifts
how the trace reads. The sizes hold all but the longest cases (of 30,000 random tapes, a
config read 9.6 bytes on average and 21 at the 99.9th percentile, a trace 42 and 114);
bytes past the end read as zeros: the simplest value of a config field, the end of a trace.
The hunt's cases draw the layouts its plan names (`strategies.LAYOUTS`, both, by default; these
functions' own default is the padded layout alone, as they drew before); a ragged config reads a
few more bytes for its own fields, after every padded one, and past the end they read as defaults.
"""

from __future__ import annotations

from hypothesis import strategies as st

from runtime.config import RuntimeConfig
from spyre_verify.hunt.replay import Op
from spyre_verify.hunt.strategies import PADDED, draw_config, draw_ops
from spyre_verify.hunt.tape import TRACE_PLAIN, Tape, tape_cases
from spyre_verify.hunt.world import world

CONFIG_TAPE = 24
TRACE_TAPE = 120
DISPATCH_TAPE = CONFIG_TAPE + TRACE_TAPE
# The longest max_model_len the warmup property draws for each max_num_seqs: the walk's
# state space grows roughly like L ** (2 * S), so wide batches get short sequences.
WALK_LEN = {1: 32, 2: 16, 3: 10, 4: 8, 5: 6, 6: 6, 7: 5, 8: 5}


def dispatch_case(
    data: bytes, fault: str | None = None, layouts: tuple[str, ...] = PADDED
) -> tuple[RuntimeConfig, list[Op]]:
    """A config (of one of `layouts`) and an event trace valid for it as the fault configures it, read from `data`."""
    config = draw_config(Tape(data[:CONFIG_TAPE]), layouts=layouts)
    return config, draw_ops(Tape(data[CONFIG_TAPE:], TRACE_PLAIN), world(config, fault).config)


def dispatch_cases(
    fault: str | None = None, layouts: tuple[str, ...] = PADDED
) -> st.SearchStrategy[tuple[RuntimeConfig, list[Op]]]:
    """Configs and event traces valid for them as the fault configures them (`dispatch_case`)."""
    return tape_cases(lambda data: dispatch_case(data, fault, layouts), DISPATCH_TAPE)


def walk_config(data: bytes, layouts: tuple[str, ...] = PADDED) -> RuntimeConfig:
    """A config whose walk mostly finishes: up to 8 sequences, shorter as batches widen."""
    tape = Tape(data)
    S = tape.between(1, 8)
    return draw_config(tape, max_model_len=(1, WALK_LEN[S]), max_num_seqs=(S, S), layouts=layouts)


def walk_configs(layouts: tuple[str, ...] = PADDED) -> st.SearchStrategy[RuntimeConfig]:
    """Configs whose walk mostly finishes (`walk_config`)."""
    return tape_cases(lambda data: walk_config(data, layouts), CONFIG_TAPE)


def ladder_config(data: bytes, layouts: tuple[str, ...] = PADDED) -> RuntimeConfig:
    """A config short enough to probe whole: the probe builds max_model_len * max_num_seqs
    decode batches; the dispatch property covers longer sequences on the traces it replays."""
    return draw_config(Tape(data), max_model_len=(1, 24), max_num_seqs=(1, 8), layouts=layouts)


def ladder_configs(layouts: tuple[str, ...] = PADDED) -> st.SearchStrategy[RuntimeConfig]:
    """Configs for the ladders property (`ladder_config`)."""
    return tape_cases(lambda data: ladder_config(data, layouts), CONFIG_TAPE)
