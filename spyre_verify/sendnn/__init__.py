"""The real vLLM Spyre plugin, `sendnn-inference`, judged on CPU through the runtime protocol.

`--runtime sendnn` names `make`. The adapter never edits the plugin: it drives vLLM's
`EngineCore` in-process, hooks a few of the plugin's methods from outside while a runtime
is warm, and puts every hook back on `close()`. What it reports is what the plugin did: the
attention metadata each forward ran with, the blocks vLLM's KV cache manager handed out,
the reservations the plugin's scheduler holds, the tokens vLLM returned.

Nothing here imports vLLM until a runtime is built, so the harness runs without the extra;
`pip install -e '.[sendnn]'` brings it (README, "Judge the real plugin").
"""

from __future__ import annotations

from typing import Any


def make(settings: Any) -> Any:
    """The factory `--runtime sendnn` names: a runtime over the installed plugin, not yet warm."""
    from spyre_verify.sendnn.runtime import SendnnRuntime

    return SendnnRuntime.build(settings)


# With no size flag, commands run the plugin at these sizes (it fixes blocks of 64; the harness's
# embedded default has blocks of 4): the config the known finding is recorded at.
make.default_sizes = {"block_size": 64, "max_model_len": 256, "max_num_seqs": 2}  # type: ignore[attr-defined]
# Each fault run imports vLLM and warms an engine (seconds): `check` runs them in a worker a core.
make.parallel_faults = True  # type: ignore[attr-defined]
