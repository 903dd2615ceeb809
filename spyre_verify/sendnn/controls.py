"""Control calls: calls of the plugin's compiled slot that no warm graph may serve, made the way
its forward calls the slot, with every write sent to block 0. Each must compile:

- `inference-mode`: warmup's decode call under `torch.inference_mode()`. The plugin's
  runner calls the model under `torch.no_grad()` (its platform's `inference_mode()`); a
  runner that switched would change a guard of every graph and recompile all of them.
- `int32-block-table`: warmup's decode call with its block table as int32, as a metadata
  builder that builds its tables in another dtype would send it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import spyre_verify.sendnn.events as ev
from spyre_verify.sendnn.slot import Slot


@dataclass(frozen=True)
class Control:
    name: str
    bucket: ev.Graph
    run: Callable[[], Any]

    def call(self) -> Any:
        return self.run()


def control_calls(slot: Slot, kv: Callable[[], Any]) -> list[Control]:
    def inference_mode() -> Any:
        with torch.inference_mode():
            return slot.replay(ev.DECODE, kv())

    def int32_table() -> Any:
        def edit(kw: dict[str, Any]) -> None:
            kw["block_table"] = kw["block_table"].to(torch.int32)

        with torch.no_grad():
            return slot.replay(ev.DECODE, kv(), edit)

    return [Control("inference-mode", ev.DECODE, inference_mode), Control("int32-block-table", ev.DECODE, int32_table)]
