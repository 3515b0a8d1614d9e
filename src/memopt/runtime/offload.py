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
pass offloads may take at most search.host_pinned_gib where a study sets it (the same on every
host), else HOST_FRACTION of the host's physical memory, shared equally by the host's GPUs
(nvidia-smi's count: jobs on every GPU at once, one per GPU, stay within it; a 4-GPU host of
512 GiB gives each 64 GiB, as a 1-GPU host of 128 GiB does). Beyond that the pass
stops with torch.OutOfMemoryError naming host memory, so a batch-size search treats it as "does
not fit" (the technique's limit is then the host's, which the error says). The budget is per
process, and pinned buffers come in pieces of PIECE_BYTES (torch's pinned allocator rounds a
buffer up to a power of two); torch keeps freed pinned buffers cached, so jobs and search
trials give them back (empty_host_cache) when they end.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable

import torch
from torch.autograd.graph import saved_tensors_hooks

from memopt.errors import KernelUnavailable
from memopt.runtime import lease

HOST_FRACTION = 0.5
_configured: list[int] = []  # search.host_pinned_gib, in bytes, once a job has set it


def set_host_budget(gib: float | None) -> None:
    """A job's configured budget (search.host_pinned_gib; None: the host's share)."""
    _configured[:] = [] if gib is None else [int(gib * 2**30)]


def budget_source() -> str:
    """Where host_budget_bytes comes from, in words (the error a search records says it)."""
    if _configured:
        return "search.host_pinned_gib"
    return f"this process's share of {HOST_FRACTION:.0%} of the host's memory"


def host_budget_bytes() -> int:
    """This process's budget of pinned host memory: search.host_pinned_gib where the job set it,
    else HOST_FRACTION of the host's memory over its GPUs."""
    return _configured[0] if _configured else _host_share()


@functools.cache
def _host_share() -> int:
    """HOST_FRACTION of the host's memory over its GPUs. Once per process: every training step
    of an offloading technique reads it."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(HOST_FRACTION * physical) // max(1, len(lease.nvidia_smi("index")))


class OffloadedBytes:
    """What one forward pass sent to the host (pinned bytes as the caching host allocator
    rounds them, up to a power of two), and the most it may send."""

    def __init__(self, budget: int | None = None):
        self.tensors = 0
        self.bytes = 0
        self.sizes: dict[int, int] = {}  # bytes of an offloaded tensor -> how many
        self.budget = host_budget_bytes() if budget is None else budget


# Pinned buffers come in pieces of at most this many bytes: the caching host allocator rounds
# every buffer up to a power of two, so a 3 GiB checkpoint in one buffer would pin 4 GiB.
PIECE_BYTES = 1 << 28


def _pinned_bytes(nbytes: int) -> int:
    return 1 << max(0, nbytes - 1).bit_length()


def charged_bytes(nbytes: int) -> int:
    """What offloading one tensor of `nbytes` pins: pieces of PIECE_BYTES, the last one rounded
    up to a power of two (a search predicts the host's limit from it)."""
    full, tail = divmod(nbytes, PIECE_BYTES)
    return full * PIECE_BYTES + (_pinned_bytes(tail) if tail else 0)


def _flat(t: torch.Tensor):
    """t's elements as one 1-D tensor in memory order, and the strides that rebuild t from it
    (None when t has gaps between its elements, e.g. attention's q, k, v, views of one
    projection: those are copied densely and re-strided on the way back)."""
    if _dense(t):
        return t.as_strided((t.numel(),), (1,), t.storage_offset()), t.stride()
    return t.contiguous().view(-1), None


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill one block of memory without gaps or overlaps (in any order)."""
    expected = 1
    dims = [(stride, size) for size, stride in zip(t.size(), t.stride()) if size > 1]
    for stride, size in sorted(dims):
        if stride != expected:
            return False
        expected *= size
    return True


def _to_host(flat: torch.Tensor, stats: OffloadedBytes) -> list[torch.Tensor]:
    pinned = flat.is_cuda
    pieces = []
    for chunk in flat.split(max(1, PIECE_BYTES // flat.element_size())):
        nbytes = chunk.numel() * chunk.element_size()
        charged = _pinned_bytes(nbytes) if pinned else nbytes
        if stats.bytes + charged > stats.budget:
            raise torch.OutOfMemoryError(
                f"offload: activations: host memory for offloaded activations is out of memory "
                f"(this forward pass would hold more than {stats.budget / 2**30:.1f} GiB, "
                f"{budget_source()}, in pinned buffers)"
            )
        try:
            host = torch.empty(chunk.numel(), dtype=chunk.dtype, pin_memory=pinned)
        except RuntimeError as err:  # cudaHostAlloc failed: the host is out of pinned memory
            raise torch.OutOfMemoryError(
                f"offload: activations: the host could not pin {charged / 2**30:.2f} GiB more "
                f"with {stats.bytes / 2**30:.1f} GiB pinned, within the budget of "
                f"{stats.budget / 2**30:.1f} GiB ({err})"
            ) from err
        pieces.append(host.copy_(chunk, non_blocking=pinned))
        stats.bytes += charged
    stats.tensors += 1
    if pinned:
        size = flat.numel() * flat.element_size()
        stats.sizes[size] = stats.sizes.get(size, 0) + 1
    return pieces


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
        flat, layout = _flat(source)
        return t.device, _to_host(flat, stats), source.size(), layout, t.size(), t.stride()

    return pack


def _unpack(packed):
    if isinstance(packed, torch.Tensor):
        return packed
    device, pieces, source_size, layout, size, stride = packed
    flat = torch.empty(sum(p.numel() for p in pieces), dtype=pieces[0].dtype, device=device)
    for piece, part in zip(pieces, flat.split(pieces[0].numel())):
        part.copy_(piece, non_blocking=piece.is_pinned())
    if layout is not None:  # the exact layout it had (a compiled backward checks strides)
        return flat.as_strided(source_size, layout).expand(size)
    out = flat.view(source_size).expand(size)
    return torch.empty_strided(size, stride, dtype=out.dtype, device=device).copy_(out)


def check_offload(mode: str, device: str) -> None:
    """Raise KernelUnavailable unless `mode` means something on `device`."""
    if mode != "none" and device != "cuda":
        raise KernelUnavailable(
            f"offload {mode!r} moves saved activations from GPU to host memory; "
            f"on device {device!r} they are in host memory already; allowed here: none"
        )


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
