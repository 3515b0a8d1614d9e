"""The `loss` knob: how the output layer and the cross-entropy are computed.

On the default model the logits are the largest memory term at large batch: B x T x 32,000 values,
kept for the backward pass, plus their gradient. `standard` computes them whole. `chunked` (plain
PyTorch) computes the loss `loss_chunk` rows at a time under non-reentrant activation
checkpointing: a chunk's logits are freed as soon as its loss is summed and recomputed in the
backward pass, so at most one chunk's logits (and their gradient) exist at a time. It is exact: the
same loss and gradients as `standard` up to the order of a floating-point sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, weight), targets, reduction="sum").float()


def chunked_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Mean cross-entropy of `h @ weight.T` (rows x vocab logits) against `targets`, `chunk` rows
    at a time; each chunk's logits are recomputed in the backward pass."""
    h, targets = h.reshape(-1, h.size(-1)), targets.reshape(-1)
    total = h.new_zeros((), dtype=torch.float32)
    for h_chunk, y_chunk in zip(h.split(chunk), targets.split(chunk)):
        total = total + checkpoint(_chunk_loss, h_chunk, weight, y_chunk, use_reentrant=False)
    return total / targets.numel()


def kept_logits_elements(loss: str, tokens: int, vocab_size: int) -> int:
    """Logit values kept for the backward pass: all of them, or none when they are recomputed."""
    return 0 if loss == "chunked" else tokens * vocab_size
