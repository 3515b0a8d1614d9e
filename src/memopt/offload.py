"""The `offload` knob: where the tensors saved for the backward pass live.

`activations`: every tensor autograd saves during the forward pass, except parameters (they stay
on the GPU anyway), is copied to pinned host memory when it is saved and copied back when the
backward pass needs it (torch.autograd.graph.saved_tensors_hooks, like
torch.autograd.graph.save_on_cpu, but asynchronous both ways). Both copies are queued on the
compute stream without blocking the host: the stream's order keeps them correct (a GPU buffer is
reused only after its copy out; a pinned buffer only after its copy in, which the caching host
allocator tracks), and the host keeps queuing the next kernels. The copies do not overlap the
compute kernels themselves; they cost PCIe/NVLink-C2C bandwidth, which the timing cells show.

With activation checkpointing only the checkpoints (each checkpointed block's input) are saved
outside the blocks, so only they go to the host; what a block saves during its recomputation in
the backward pass stays on the GPU for the short time it is needed. The copies are exact: the
gradients are identical to those without offloading.

Pinned host memory is finite, and exhausting it can stall the whole machine: what one forward
pass offloads may take at most HOST_FRACTION of the host's physical memory. Beyond that the pass
stops with torch.OutOfMemoryError naming host memory, so a batch-size search treats it as "does
not fit" (the technique's limit is then the host's, which the error says).
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch.autograd.graph import saved_tensors_hooks

HOST_FRACTION = 0.5


def host_budget_bytes() -> int:
    return int(HOST_FRACTION * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class OffloadedBytes:
    """What one forward pass sent to the host, and the most it may send."""

    def __init__(self, budget: int | None = None):
        self.tensors = 0
        self.bytes = 0
        self.budget = host_budget_bytes() if budget is None else budget


def _pack(stats: OffloadedBytes):
    def pack(t: torch.Tensor):
        if isinstance(t, torch.nn.Parameter) or t.numel() == 0:
            return t
        size = t.numel() * t.element_size()
        if stats.bytes + size > stats.budget:
            raise torch.OutOfMemoryError(
                f"offload: activations: host memory for offloaded activations is out of memory "
                f"(this forward pass would hold more than {stats.budget / 2**30:.1f} GiB, "
                f"{HOST_FRACTION:.0%} of the host's memory, in pinned buffers)"
            )
        # The same strides (a compiled backward pass checks them), unless some are 0 (an
        # expanded tensor, which copy_ cannot write): then a dense copy.
        stride = t.stride() if 0 not in t.stride() else None
        host = (
            torch.empty_strided(t.size(), stride, dtype=t.dtype, pin_memory=t.is_cuda)
            if stride is not None
            else torch.empty(t.size(), dtype=t.dtype, pin_memory=t.is_cuda)
        )
        host.copy_(t, non_blocking=t.is_cuda)
        stats.tensors += 1
        stats.bytes += size
        return t.device, host

    return pack


def _unpack(packed):
    if isinstance(packed, torch.Tensor):
        return packed
    device, host = packed
    return host.to(device, non_blocking=host.is_pinned())


def offload_context(mode: str, stats: OffloadedBytes | None = None):
    """The context the forward pass runs in: saved activations go to the host for `activations`;
    nothing changes for `none`."""
    if mode == "none":
        return contextlib.nullcontext()
    return saved_tensors_hooks(_pack(stats or OffloadedBytes()), _unpack)
