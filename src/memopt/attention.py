"""Causal self-attention kernels, side by side. Each takes q, k, v of shape (B, H, T, D) and an
optional window W and returns (B, H, T, D).

Window convention: a query at position i sees exactly the W keys j with i - W < j <= i (itself
included). (flash-attn's `window_size=(W, 0)` would cover W + 1 keys.)

No kernel drops attention probabilities (no attention dropout): FlexAttention has none, so every
kernel computes the same function and techniques stay comparable; dropout acts on the residual paths.
A kernel that cannot run raises KernelUnavailable; nothing is replaced silently.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from memopt.errors import KernelUnavailable

KERNELS = ("math", "flash", "efficient", "flex")


@functools.lru_cache(maxsize=16)
def band_mask(seq_len: int, window: int | None, device: str) -> torch.Tensor:
    """(T, T) bool, True where query i may attend key j: causal, and within the window if any."""
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    keep = j <= i
    if window is not None:
        keep &= i - j < window
    return keep


def math_attention(q, k, v, window=None):
    """The explicit reference: the N x N score matrix is materialized."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    keep = band_mask(q.size(-2), window, str(q.device))
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _sdpa(backend: SDPBackend, name: str):
    def attend(q, k, v, window=None):
        if window is not None:
            raise KernelUnavailable(
                f"attention kernel {name!r} (PyTorch SDPA) has no sliding window"
            )
        try:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        except RuntimeError as err:
            raise KernelUnavailable(
                f"attention kernel {name!r} cannot run for q {tuple(q.shape)} {q.dtype} on "
                f"{q.device.type}: {err}".strip()
            ) from None

    return attend


flash_attention = _sdpa(SDPBackend.FLASH_ATTENTION, "flash")
efficient_attention = _sdpa(SDPBackend.EFFICIENT_ATTENTION, "efficient")


@functools.lru_cache(maxsize=16)
def _flex_block_mask(seq_len: int, window: int | None, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        keep = kv_idx <= q_idx
        return keep if window is None else keep & (q_idx - kv_idx < window)

    # Built once per (length, window): the block mask lets the kernel skip empty tiles entirely.
    return create_block_mask(mask_mod, None, None, seq_len, seq_len, device=device)


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # Uncompiled flex_attention is a slow, memory-hungry reference path; compile it always.
    return torch.compile(flex_attention)


def flex_attention(q, k, v, window=None):
    if q.device.type != "cuda":
        raise KernelUnavailable(
            "attention kernel 'flex' (FlexAttention) needs a CUDA GPU here; "
            "use 'math' or 'auto' on a CPU"
        )
    block_mask = _flex_block_mask(q.size(-2), window, str(q.device))
    return _compiled_flex()(q, k, v, block_mask=block_mask)


IMPLEMENTATIONS = {
    "math": math_attention,
    "flash": flash_attention,
    "efficient": efficient_attention,
    "flex": flex_attention,
}


def resolve_kernel(requested: str, window: int | None, device: str, precision: str) -> str:
    """Turn a requested kernel (possibly `auto`) into the one that will run, and check it can."""
    if requested == "auto":
        if window is not None:
            return "flex" if device == "cuda" else "math"
        if device == "cuda":
            # The flash backend takes only 16-bit inputs; fp32/tf32 runs get the exact fused kernel.
            return "flash" if precision == "bf16" else "efficient"
        return "flash"  # PyTorch's CPU flash kernel takes fp32 and bf16
    if requested not in IMPLEMENTATIONS:
        raise KernelUnavailable(
            f"unknown attention kernel {requested!r}; allowed: " + ", ".join(("auto",) + KERNELS)
        )
    if requested == "flex" and device != "cuda":
        raise KernelUnavailable("attention 'flex' needs a CUDA GPU; use 'math' or 'auto' on a CPU")
    if requested in ("flash", "efficient") and window is not None:
        raise KernelUnavailable(f"attention {requested!r} has no sliding window; use flex or math")
    return requested
