"""The judge of "padding never changes a token": the same model, unpadded, unpaged and
eager, one sequence at a time, recomputing its whole prefix each step (DESIGN "Padding
never changes results"). It uses the model's layers, never paged attention or padding,
and ends a run where DESIGN's "Finish." ends a request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from runtime.model import TinyTransformer


@dataclass(frozen=True)
class ReferenceRun:
    tokens: tuple[int, ...]
    logits: tuple[torch.Tensor, ...]  # one [vocab] row per generated token
    reason: str = "length"  # or "stop": it ended on a stop token, the last of `tokens`


def forward(model: TinyTransformer, token_ids: list[int]) -> torch.Tensor:
    """Logits of the last position for a contiguous, causal, unpadded sequence."""
    dev = model.embedding.device
    n = len(token_ids)
    x = model.embed(torch.tensor(token_ids, device=dev), torch.arange(n, device=dev))
    causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
    for layer in range(len(model.layers)):
        q, k, v = model.qkv(layer, x)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)
        x = model.finish_layer(layer, x, attn)
    return model.logits(x[-1:])[0]


def generate(
    model: TinyTransformer,
    prompt: list[int],
    max_tokens: int,
    stop_token_ids: Iterable[int] = (),
    ignore_eos: bool = False,
) -> ReferenceRun:
    """Greedy tokens up to `max_tokens`, or up to and including the first stop token: one of
    `stop_token_ids`, or the model's EOS unless `ignore_eos` (DESIGN "Finish.")."""
    stops = set(stop_token_ids) | (set() if ignore_eos else {model.dims.eos_token_id})
    seq, out, logits = list(prompt), [], []
    with torch.no_grad():
        for _ in range(max_tokens):
            row = forward(model, seq)
            token = int(row.argmax())
            logits.append(row)
            out.append(token)
            seq.append(token)
            if token in stops:
                return ReferenceRun(tuple(out), tuple(logits), "stop")
    return ReferenceRun(tuple(out), tuple(logits))
