"""A tiny seeded transformer: no download, deterministic greedy decoding. The layer is split at
the attention call, so the engine runs attention through the paged, compiled kernels."""

from __future__ import annotations

import math

import torch

from runtime.config import RuntimeConfig


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * weight


class TinyTransformer:
    def __init__(self, config: RuntimeConfig) -> None:
        m = self.dims = config.model
        gen = torch.Generator().manual_seed(m.seed)

        def w(*shape: int) -> torch.Tensor:
            t = torch.randn(*shape, generator=gen) / math.sqrt(shape[0])
            return t.to(dtype=getattr(torch, config.dtype), device=config.device)

        h, dev = m.hidden_size, config.device
        self.embedding = w(m.vocab_size, h) * math.sqrt(m.vocab_size)
        self.positions = w(config.max_model_len, h) * math.sqrt(config.max_model_len) * 0.1
        self.layers = [
            {"wqkv": w(h, 3 * h), "wo": w(h, h), "w1": w(h, m.mlp_size), "w2": w(m.mlp_size, h)}
            for _ in range(m.num_layers)
        ]
        self.norm = torch.ones(h, dtype=self.embedding.dtype, device=dev)
        self.lm_head = w(h, m.vocab_size)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embedding[tokens] + self.positions[positions]

    def qkv(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [n,hidden] -> q, k, v, each [n,heads,head_dim]."""
        h = _rms_norm(x, self.norm) @ self.layers[layer]["wqkv"]
        q, k, v = h.reshape(x.shape[0], 3, self.dims.num_heads, self.dims.head_dim).unbind(dim=1)
        return q, k, v

    def finish_layer(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        p = self.layers[layer]
        x = x + attn.reshape(x.shape[0], -1) @ p["wo"]
        return x + torch.nn.functional.gelu(_rms_norm(x, self.norm) @ p["w1"]) @ p["w2"]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.norm) @ self.lm_head
