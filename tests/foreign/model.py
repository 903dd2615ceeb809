"""A tiny seeded transformer with greedy decoding: no download, the same weights on every run.

Pre-norm blocks with learned positions. The layer is split at attention (`qkv`, then
`finish`), so the engine can run attention through the paged, compiled kernels while the
reference runs the very same weights with plain causal attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import ModelDims


class TinyModel:
    def __init__(self, dims: ModelDims, max_model_len: int, device: str) -> None:
        self.dims = dims
        gen = torch.Generator().manual_seed(dims.seed)
        h, v = dims.hidden, dims.vocab_size

        def weight(rows: int, cols: int, scale: float = 1.0) -> torch.Tensor:
            # Drawn on the CPU generator, then moved: the same weights on every device.
            return (torch.randn(rows, cols, generator=gen) * scale / rows**0.5).to(device)

        # Embeddings large enough that the prompt, not the positions, decides the tokens.
        self.tok_emb = weight(v, h, scale=v**0.5)
        self.pos_emb = weight(max_model_len, h, scale=0.3 * max_model_len**0.5)
        self.layers = [
            {name: weight(h, h) for name in ("wq", "wk", "wv", "wo")}
            | {"up": weight(h, 2 * h), "down": weight(2 * h, h)}
            for _ in range(dims.layers)
        ]
        self.head = weight(h, v)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.tok_emb[tokens] + self.pos_emb[positions]

    def qkv(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [n, hidden] -> q, k, v, each [n, heads, head_dim]."""
        w = self.layers[layer]
        y = F.layer_norm(x, x.shape[-1:])
        shape = (x.shape[0], self.dims.heads, self.dims.head_dim)
        return (y @ w["wq"]).view(shape), (y @ w["wk"]).view(shape), (y @ w["wv"]).view(shape)

    def finish(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after attention [n, heads, head_dim]: projection, residual, MLP."""
        w = self.layers[layer]
        x = x + attn.reshape(x.shape[0], -1) @ w["wo"]
        return x + F.silu(F.layer_norm(x, x.shape[-1:]) @ w["up"]) @ w["down"]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:]) @ self.head
