"""The judge of "padding never changes a token": the same model, one sequence, unpadded,
unpaged and eager, recomputing its whole prefix every step with plain causal attention
(torch's own scaled_dot_product_attention, not this runtime's kernels)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .model import TinyModel


@dataclass(frozen=True)
class ReferenceRun:
    tokens: tuple[int, ...]
    logits: tuple[torch.Tensor, ...]  # one [vocab] row per token
    reason: str  # "length", or "stop" when the last token is a stop token


def last_logits(model: TinyModel, token_ids: list[int]) -> torch.Tensor:
    n = len(token_ids)
    device = model.tok_emb.device
    x = model.embed(torch.tensor(token_ids, device=device), torch.arange(n, device=device))
    for layer in range(len(model.layers)):
        q, k, v = (t.transpose(0, 1) for t in model.qkv(layer, x))  # [heads, n, head_dim]
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = model.finish(layer, x, attn.transpose(0, 1))
    return model.logits(x[-1:])[0]


@torch.no_grad()
def generate(
    model: TinyModel,
    prompt: Sequence[int],
    max_tokens: int,
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
) -> ReferenceRun:
    """Greedy tokens until max_tokens, or through the first stop token (EOS unless ignore_eos)."""
    stops = set(stop_token_ids) | (set() if ignore_eos else {model.dims.eos_token_id})
    seq, tokens, rows = list(prompt), [], []
    for _ in range(max_tokens):
        row = last_logits(model, seq)
        token = int(row.argmax())
        seq.append(token)
        tokens.append(token)
        rows.append(row)
        if token in stops:
            return ReferenceRun(tuple(tokens), tuple(rows), "stop")
    return ReferenceRun(tuple(tokens), tuple(rows), "length")
