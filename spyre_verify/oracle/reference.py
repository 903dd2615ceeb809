"""The judge of "padding never changes a token": the same model, unpadded, unpaged and
eager, one sequence at a time (DESIGN "Padding never changes results"). It uses the
model's layers, never paged attention or padding, and ends a run where DESIGN's "Finish."
ends a request.

Each step attends over one contiguous tensor of the sequence's keys and values, grown by
a row a token. Recomputing the whole prefix every step cost O(n**3) a request: at
max_model_len 2048 the reference of one long request took minutes, longer than serving it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from runtime.model import TinyTransformer


@dataclass(frozen=True)
class ReferenceRun:
    tokens: tuple[int, ...]
    logits: tuple[torch.Tensor, ...]  # one [vocab] row per generated token
    reason: str = "length"  # or "stop": it ended on a stop token, the last of `tokens`


def forward(model: TinyTransformer, token_ids: list[int], start: int, cache: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Logits of the last of `token_ids`, which sit at positions start.. after the `start`
    tokens whose keys and values `cache` holds (one (k, v) per layer, extended in place)."""
    dev = model.embedding.device
    n = len(token_ids)
    x = model.embed(torch.tensor(token_ids, device=dev), torch.arange(start, start + n, device=dev))
    # Query i (position start + i) sees every cached position and the new ones up to itself.
    causal = torch.ones(n, start + n, dtype=torch.bool, device=dev).tril(diagonal=start)
    last = len(model.layers) - 1
    for layer in range(len(model.layers)):
        q, k, v = model.qkv(layer, x)
        if len(cache) > layer:
            k, v = torch.cat([cache[layer][0], k]), torch.cat([cache[layer][1], v])
            cache[layer] = (k, v)
        else:
            cache.append((k, v))
        if layer == last:  # only the last token's logits are asked for: its row alone, not n of them
            q, x, causal = q[-1:], x[-1:], causal[-1:]
        # Scaled and masked in place: at 8192 tokens the scores are a gigabyte, and each copy of
        # them cost as much as the product itself.
        scores = torch.einsum("qhd,khd->hqk", q.float() / math.sqrt(q.shape[-1]), k.float())
        probs = scores.masked_fill_(~causal, float("-inf")).softmax(dim=-1)
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
    out: list[int] = []
    logits: list[Tensor] = []
    cache: list[tuple[Tensor, Tensor]] = []
    feed, start = list(prompt), 0
    with torch.no_grad():
        for _ in range(max_tokens):
            row = forward(model, feed, start, cache)
            token = int(row.argmax())
            logits.append(row)
            out.append(token)
            feed, start = [token], start + len(feed)
            if token in stops:
                return ReferenceRun(tuple(out), tuple(logits), "stop")
    return ReferenceRun(tuple(out), tuple(logits))
