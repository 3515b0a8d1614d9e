"""Causal self-attention kernels, side by side. Each takes q of shape (B, H, T, D), k and v of
shape (B, H_kv, T, D) and an optional window W and returns (B, H, T, D). With H_kv < H (grouped-
query attention, the llama block's `n_kv_heads`) each key/value head serves H / H_kv consecutive
query heads; every kernel does that natively except the explicit one and PyTorch's memory-
efficient kernel (no grouped-query path in PyTorch 2.11), which get them repeated: copies, as
many as the query heads, which their memory shows.

Window convention: a query at position i sees exactly the W keys j with i - W < j <= i (itself
included). flash-attn's `window_size=(left, 0)` covers left + 1 keys, so W maps to (W - 1, 0).

No kernel drops attention probabilities (no attention dropout): FlexAttention has none, so every
kernel computes the same function and techniques stay comparable; dropout acts on the residual paths.
A kernel that cannot run raises KernelUnavailable; nothing is replaced silently.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from memopt.errors import KernelUnavailable
from memopt.runtime.precision import is_16bit

KERNELS = ("math", "flash", "efficient", "cudnn", "flex", "flash_attn")


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
    k, v = _repeat_kv(q, k, v)  # grouped-query: each key/value head for its group of queries
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    keep = band_mask(q.size(-2), window, str(q.device))
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _repeat_kv(q, k, v):
    """k and v with each key/value head repeated for its group of query heads."""
    if k.size(1) == q.size(1):
        return k, v
    return (t.repeat_interleave(q.size(1) // k.size(1), dim=1) for t in (k, v))


def _sdpa(backend: SDPBackend, name: str):
    def attend(q, k, v, window=None):
        if window is not None:
            raise KernelUnavailable(
                f"attention kernel {name!r} (PyTorch SDPA) has no sliding window"
            )
        try:
            if backend == SDPBackend.EFFICIENT_ATTENTION:
                k, v = _repeat_kv(q, k, v)
            with sdpa_kernel([backend]):
                gqa = k.size(1) != q.size(1)
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        except RuntimeError as err:
            raise KernelUnavailable(
                f"attention kernel {name!r} cannot run for q {tuple(q.shape)}, k "
                f"{tuple(k.shape)} {q.dtype} on "
                f"{q.device.type}: {err}".strip()
            ) from None

    return attend


flash_attention = _sdpa(SDPBackend.FLASH_ATTENTION, "flash")
efficient_attention = _sdpa(SDPBackend.EFFICIENT_ATTENTION, "efficient")
cudnn_attention = _sdpa(SDPBackend.CUDNN_ATTENTION, "cudnn")


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is not a package, or a stand-in module
        return False


@functools.lru_cache(maxsize=1)
def flash_attn_impl() -> str | None:
    """Which flash-attn implementation the `flash_attn` kernel uses here, or None.

    FA4 (flash_attn.cute) and FA3 (flash_attn_interface) plug into PyTorch's SDPA flash backend
    through its registry; FA2 is the flash-attn package's own `flash_attn_func`.
    """
    registry = getattr(torch.nn.attention, "list_flash_attention_impls", lambda: [])()
    for impl, module in (("FA4", "flash_attn.cute"), ("FA3", "flash_attn_interface")):
        if impl in registry and _module_present(module):
            return impl
    return "FA2" if _module_present("flash_attn") else None


@functools.lru_cache(maxsize=1)
def _activate(impl: str) -> None:
    torch.nn.attention.activate_flash_attention_impl(impl)


def restore_flash_impl() -> None:
    """SDPA's own flash kernel again, as a new process has it (the `attention` knob's undo)."""
    _activate.cache_clear()
    restore = getattr(torch.nn.attention, "restore_flash_attention_impl", None)
    if restore is not None:
        restore()


def flash_attn_attention(q, k, v, window=None):
    impl = flash_attn_impl()
    if impl is None:
        raise KernelUnavailable(
            "attention kernel 'flash_attn' needs the flash-attn package, which is not installed "
            "(pip install -e '.[flash]'); use 'flash' for PyTorch's own flash kernel"
        )
    if impl != "FA2" and window is None:
        _activate(impl)
        return flash_attention(q, k, v)
    if not _module_present("flash_attn"):
        raise KernelUnavailable(
            f"a sliding window needs flash-attn's FA2 flash_attn_func ({impl} is "
            "reached through SDPA, which has no window)"
        )
    from flash_attn import flash_attn_func

    # flash-attn takes (B, T, H, D), fewer key/value heads natively; window_size=(left, 0)
    # covers left + 1 keys.
    out = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        dropout_p=0.0,
        causal=True,
        window_size=(-1, -1) if window is None else (window - 1, 0),
    )
    return out.transpose(1, 2)


@functools.lru_cache(maxsize=16)
def _flex_block_mask(seq_len: int, window: int | None, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    # The window is a captured tensor, not a constant: the compiled graph (and so inductor's
    # on-disk cache entry) is then the same for every window, and a job compiling flex for one
    # window finds the kernels another window's job compiled (local128 after local256).
    span = torch.tensor(seq_len if window is None else window, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < span)

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
    return _compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=k.size(1) != q.size(1))


IMPLEMENTATIONS = {
    "math": math_attention,
    "flash": flash_attention,
    "efficient": efficient_attention,
    "cudnn": cudnn_attention,
    "flex": flex_attention,
    "flash_attn": flash_attn_attention,
}


def resolve_kernel(requested: str, window: int | None, device: str, precision: str) -> str:
    """Turn a requested kernel (possibly `auto`) into the one that will run, and check it can.

    `auto` on CUDA: flash-attn when installed; else, for 16-bit runs, PyTorch's cuDNN kernel on
    Hopper with cuDNN >= 9 (the fastest exact kernel in tools/bench_techniques.py on the H100:
    44.6 ms against 46.2 ms for flash per step of the default model at batch 16) and its flash
    kernel elsewhere; for FP32, its memory-efficient kernel; with a window, flash-attn or
    FlexAttention. On a CPU: PyTorch's flash kernel, or the explicit masked path with a window.
    """
    if requested == "auto":
        if device != "cuda":
            return "math" if window is not None else "flash"
        if flash_attn_impl() is not None and is_16bit(precision):
            return "flash_attn"
        if window is not None:
            return "flex"
        if not is_16bit(precision):
            return "efficient"
        return "cudnn" if _cudnn_attention_preferred() else "flash"
    if requested not in IMPLEMENTATIONS:
        raise KernelUnavailable(
            f"unknown attention kernel {requested!r}; allowed: " + ", ".join(("auto",) + KERNELS)
        )
    if requested in ("flex", "cudnn", "flash_attn") and device != "cuda":
        raise KernelUnavailable(
            f"attention {requested!r} needs a CUDA GPU; use 'math' or 'auto' on a CPU"
        )
    if requested in ("flash", "efficient", "cudnn") and window is not None:
        raise KernelUnavailable(
            f"attention {requested!r} has no sliding window; use flex, flash_attn or math"
        )
    return requested


def second_kernel(kernel: str, window: int | None, device: str) -> str | None:
    """Another exact kernel of the same attention (for exactness.floor): the explicit path, or
    where that is the kernel, FlexAttention (window) or the memory-efficient SDPA kernel on CUDA,
    PyTorch's flash kernel on a CPU; None where there is none (a window on a CPU)."""
    if kernel != "math":
        return "math"
    if device == "cuda":
        return "flex" if window is not None else "efficient"
    return None if window is not None else "flash"


def _cudnn_attention_preferred() -> bool:
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability()[0] == 9 and torch.backends.cudnn.version() >= 90000


def kernel_detail(kernel: str) -> str:
    """The kernel with the implementation behind it, for provenance."""
    if kernel == "flash_attn":
        impl = flash_attn_impl()
        version = importlib.import_module("flash_attn").__version__ if impl == "FA2" else ""
        return f"flash_attn ({impl} {version})".replace(" )", ")")
    return kernel
