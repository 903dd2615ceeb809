"""One laid-out step through the model: its layers around paged attention (nano-vllm's
ModelRunner, minus the CUDA graphs: the kernels are compiled per bucket instead)."""

from __future__ import annotations

import torch

from .attention import PagedAttention
from .buckets import PREFILL
from .layout import StepLayout
from .model import TinyModel


@torch.no_grad()
def run_step(model: TinyModel, attention: PagedAttention, lay: StepLayout, device: str) -> torch.Tensor:
    """Logits [real rows, vocab] of the step's next tokens. Only real tokens' K and V reach the
    cache, and before the kernel runs: a decode row attends its own new token too."""
    x = model.embed(torch.tensor(lay.tokens, device=device), torch.tensor(lay.positions, device=device))
    slots = torch.tensor([s for row in lay.slots for s in row], device=device)
    for layer in range(len(model.layers)):
        q, k, v = model.qkv(layer, x)
        attention.write_kv(layer, slots, k, v)
        prefill = lay.kind == PREFILL
        attn = attention.prefill(lay.bucket, q, k, v) if prefill else attention.decode(layer, lay.bucket, q)
        x = model.finish(layer, x, attn)
    # A prefill yields one token, from its last prompt position.
    return model.logits(x[-1:] if lay.kind == PREFILL else x)
