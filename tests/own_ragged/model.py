"""A tiny seeded transformer (float32, deterministic, greedy) and the reference run that judges it.

The layer is split at the attention call, so the engine runs attention through its paged,
compiled kernels. The reference builds its own model from the same seed and runs each request
alone, unpadded and unpaged, recomputing the whole sequence every token."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .config import ModelDims


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


class TinyModel:
    def __init__(self, dims: ModelDims, max_model_len: int, device: str = "cpu") -> None:
        self.dims = dims
        gen = torch.Generator().manual_seed(dims.seed)

        def w(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale / math.sqrt(shape[0])).to(device)

        h = dims.hidden_size
        self.embedding = w(dims.vocab_size, h, scale=math.sqrt(dims.vocab_size))
        self.positions = w(max_model_len, h, scale=0.3 * math.sqrt(max_model_len))
        self.layers = [
            {"wqkv": w(h, 3 * h), "wo": w(h, h), "w1": w(h, dims.mlp_size), "w2": w(dims.mlp_size, h)}
            for _ in range(dims.num_layers)
        ]
        self.lm_head = w(h, dims.vocab_size)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embedding[tokens] + self.positions[positions]

    def qkv(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [n, hidden] -> q, k, v, each [n, heads, head_dim]."""
        d = self.dims
        q, k, v = (rms_norm(x) @ self.layers[layer]["wqkv"]).reshape(x.shape[0], 3, d.num_heads, d.head_dim).unbind(1)
        return q, k, v

    def finish_layer(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        p = self.layers[layer]
        x = x + attn.reshape(x.shape[0], -1) @ p["wo"]
        return x + torch.nn.functional.gelu(rms_norm(x) @ p["w1"]) @ p["w2"]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x) @ self.lm_head


@dataclass(frozen=True)
class ReferenceRun:
    tokens: tuple[int, ...]
    logits: tuple[torch.Tensor, ...]
    reason: str  # "length" or "stop"


@torch.no_grad()
def generate(
    model: TinyModel,
    prompt: Sequence[int],
    max_tokens: int,
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
) -> ReferenceRun:
    """Greedy decoding of one request, the whole sequence recomputed with plain causal attention."""
    stops = set(stop_token_ids) | (set() if ignore_eos else {model.dims.eos_token_id})
    seq, tokens, logits = list(prompt), list[int](), list[torch.Tensor]()
    for _ in range(max_tokens):
        n = len(seq)
        x = model.embed(torch.tensor(seq), torch.arange(n))
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        for layer in range(len(model.layers)):
            q, k, v = model.qkv(layer, x)
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
            attn = torch.einsum("hqk,khd->qhd", scores.masked_fill(~causal, float("-inf")).softmax(-1), v)
            x = model.finish_layer(layer, x, attn)
        row = model.logits(x[-1])
        token = int(row.argmax())
        tokens.append(token)
        logits.append(row)
        seq.append(token)
        if token in stops:
            return ReferenceRun(tuple(tokens), tuple(logits), "stop")
    return ReferenceRun(tuple(tokens), tuple(logits), "length")
