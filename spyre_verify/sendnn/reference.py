"""The judge of output equivalence: the plugin's own FMS model, decoded step by step with FMS's
unpaged cache, eager, one request alone: no padding, no blocks, no chunks, no batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ReferenceRun:
    tokens: tuple[int, ...]
    logits: tuple[Any, ...]
    reason: str  # "length" or "stop"


def generate(
    fms_model: Any,
    prompt: Sequence[int],
    max_tokens: int,
    stop_token_ids: Sequence[int],
    ignore_eos: bool,
    eos: int,
) -> ReferenceRun:
    """Greedy tokens as vLLM ends a request: at `max_tokens`, or at a stop token (EOS unless
    `ignore_eos`), which is kept as the last token."""
    stops = set(stop_token_ids) | (set() if ignore_eos else {eos})
    tokens: list[int] = []
    with torch.no_grad():
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        positions = torch.arange(len(prompt)).unsqueeze(0)
        cache = None
        while len(tokens) < max_tokens:
            logits, cache = fms_model(ids, position_ids=positions, past_key_value_states=cache, use_cache=True)
            token = int(logits[0, -1].float().argmax())
            tokens.append(token)
            if token in stops:
                return ReferenceRun(tuple(tokens), (), "stop")
            n = positions[0, -1] + 1
            ids, positions = torch.tensor([[token]]), n.reshape(1, 1)
    return ReferenceRun(tuple(tokens), (), "length")
