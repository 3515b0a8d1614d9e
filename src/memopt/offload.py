"""The `offload` knob: where the tensors saved for the backward pass live.

`activations`: every tensor autograd saves during the forward pass, except parameters and views
of them (they stay on the GPU anyway), is copied to pinned host memory when it is saved and copied back when the
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
not fit" (the technique's limit is then the host's, which the error says). The budget is per
process; torch keeps freed pinned buffers cached, so jobs and search trials give them back
(empty_host_cache) when they end.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import torch
from torch.autograd.graph import saved_tensors_hooks

HOST_FRACTION = 0.5


def host_budget_bytes() -> int:
    return int(HOST_FRACTION * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class OffloadedBytes:
    """What one forward pass sent to the host (pinned bytes as the caching host allocator
    rounds them: up to the next power of two), and the most it may send."""

    def __init__(self, budget: int | None = None):
        self.tensors = 0
        self.bytes = 0
        self.budget = host_budget_bytes() if budget is None else budget


def _pinned_bytes(nbytes: int) -> int:
    return 1 << max(0, nbytes - 1).bit_length()


def _host_copy(t: torch.Tensor, stats: OffloadedBytes) -> torch.Tensor:
    nbytes = t.numel() * t.element_size()
    charged = _pinned_bytes(nbytes) if t.is_cuda else nbytes
    if stats.bytes + charged > stats.budget:
        raise torch.OutOfMemoryError(
            f"offload: activations: host memory for offloaded activations is out of memory "
            f"(this forward pass would hold more than {stats.budget / 2**30:.1f} GiB, "
            f"{HOST_FRACTION:.0%} of the host's memory, in pinned buffers)"
        )
    try:
        # A dense tensor keeps its strides (empty_like preserves them); one with gaps between
        # its elements (e.g. attention's q, k, v: views of one projection) is copied densely.
        host = torch.empty_like(t, device="cpu", pin_memory=t.is_cuda)
    except RuntimeError as err:  # cudaHostAlloc failed: the host is out of pinned memory
        raise torch.OutOfMemoryError(f"offload: activations: {err}") from err
    host.copy_(t, non_blocking=t.is_cuda)
    stats.tensors += 1
    stats.bytes += charged
    return host


def _pack(stats: OffloadedBytes, kept: set[int]):
    def pack(t: torch.Tensor):
        # Parameters (and views of them, as nn.Linear saves weight.t()) stay: they live anyway.
        if t.numel() == 0 or t.untyped_storage().data_ptr() in kept:
            return t
        # An expanded tensor goes as its one stored copy and is expanded again on the way back.
        source = t
        for dim in range(t.dim()):
            if t.stride(dim) == 0 and t.size(dim) > 1:
                source = source.narrow(dim, 0, 1)
        return t.device, _host_copy(source, stats), t.size(), t.stride()

    return pack


def _unpack(packed):
    if isinstance(packed, torch.Tensor):
        return packed
    device, host, size, stride = packed
    out = host.to(device, non_blocking=host.is_pinned())
    if out.size() != size:
        return out.expand(size)
    if out.stride() != stride:  # copied densely: restore the layout a compiled backward checks
        return torch.empty_strided(size, stride, dtype=out.dtype, device=device).copy_(out)
    return out


def offload_context(
    mode: str, stats: OffloadedBytes | None = None, params: Iterable[torch.Tensor] = ()
):
    """The context the forward pass runs in: saved activations go to the host for `activations`
    (not `params`, nor views of them); nothing changes for `none`."""
    if mode == "none":
        return contextlib.nullcontext()
    kept = {p.untyped_storage().data_ptr() for p in params}
    return saved_tensors_hooks(_pack(stats or OffloadedBytes(), kept), _unpack)


def empty_host_cache() -> None:
    """Give cached pinned buffers back to the OS (torch keeps them for reuse otherwise)."""
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
    empty = empty or getattr(torch._C, "_host_emptyCache", None)
    if empty is not None and torch.cuda.is_available():
        empty()
