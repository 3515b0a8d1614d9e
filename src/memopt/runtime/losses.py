"""The `loss` knob: how the output layer and the cross-entropy are computed.

On the default model the logits are the largest memory term at large batch: B x T x 32,000 values,
kept for the backward pass, plus their gradient. `standard` computes them whole. `chunked` (plain
PyTorch) computes the loss `loss_chunk` rows at a time under non-reentrant activation
checkpointing: a chunk's logits are freed as soon as its loss is summed and recomputed in the
backward pass, so at most one chunk's logits (and their gradient) exist at a time. It is exact: the
same loss and gradients as `standard` up to the order of a floating-point sum.

`liger` (liger-kernel's fused linear cross-entropy, extra `[liger]`) and `cce` (Apple's cut
cross-entropy, extra `[cce]`) are Triton kernels (CUDA only) that never materialize the whole
logits either: liger computes the loss and the gradients chunk by chunk in the forward pass; cce
computes the log-sum-exp blockwise in on-chip memory and, by its default, skips the gradient's
entries below its dtype's epsilon / 32 (close to exact; the exactness check measures how close).
Under 16-bit autocast both get the hidden states and the weight in the autocast dtype.

Under torch.compile the chunked loss is traced into the graph (its loop unrolled, one checkpointed
region per chunk), where the cross-entropy fuses: on the H100 at batch 48 the same loss left out
of the graph cost a quarter of the step (286 against 356 model TFLOP/s for the standard loss
compiled). liger and cce run outside the graph (a graph break after the final LayerNorm): their
Triton kernels are not traced.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from memopt.errors import KernelUnavailable

# loss -> (module to import, the extra that installs it)
PACKAGES = {"liger": ("liger_kernel", "liger"), "cce": ("cut_cross_entropy", "cce")}


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


def check_loss(loss: str, device: str) -> None:
    """Raise KernelUnavailable unless `loss` can run here (its package, a GPU for Triton)."""
    if loss not in PACKAGES:
        return
    module, extra = PACKAGES[loss]
    try:
        __import__(module)
    except ImportError as err:
        raise KernelUnavailable(
            f"loss {loss!r} needs the {module} package, which is not installed "
            f"(pip install -e '.[{extra}]'); allowed without it: standard, chunked"
        ) from err
    if device != "cuda":
        raise KernelUnavailable(f"loss {loss!r} runs Triton kernels and needs a CUDA GPU")


def _16bit(h: torch.Tensor, weight: torch.Tensor):
    if torch.is_autocast_enabled(h.device.type):
        dtype = torch.get_autocast_dtype(h.device.type)
        return h.to(dtype), weight.to(dtype)
    return h, weight


def output_loss(
    loss: str, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    """The mean cross-entropy of `h @ weight.T` against `targets` by a non-standard `loss`."""
    if loss == "chunked":
        return chunked_cross_entropy(h, weight, targets, chunk)
    return _fused_loss(loss, h.reshape(-1, h.size(-1)), weight, targets.reshape(-1))


@torch.compiler.disable
def _fused_loss(loss: str, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
    h, weight = _16bit(h, weight)
    if loss == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        # FP32 accumulation of the weight's gradient across liger's chunks.
        fused = LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)
        return fused(weight, h, targets).float()
    if loss == "cce":
        from cut_cross_entropy import linear_cross_entropy

        return linear_cross_entropy(h, weight, targets).float()
    raise ValueError(f"unknown loss {loss!r}")
