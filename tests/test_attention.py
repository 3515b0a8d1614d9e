"""Every attention kernel computes the explicit reference, forward and gradients."""

import math

import pytest
import torch

from memopt.errors import KernelUnavailable
from memopt.runtime.attention import IMPLEMENTATIONS, band_mask, math_attention, resolve_kernel


def loop_reference(q, k, v, window):
    """Attention one query at a time over exactly the allowed keys (no masking tricks)."""
    B, H, T, D = q.shape
    out = torch.empty_like(q)
    for i in range(T):
        lo = 0 if window is None else max(0, i - window + 1)
        s = q[:, :, i : i + 1] @ k[:, :, lo : i + 1].transpose(-2, -1) / math.sqrt(D)
        out[:, :, i : i + 1] = torch.softmax(s, -1) @ v[:, :, lo : i + 1]
    return out


def qkv(shape, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(device, dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("window", [None, 1, 3, 7, 64])
def test_math_matches_loop_reference(window):
    q, k, v = qkv((2, 3, 13, 8))
    torch.testing.assert_close(math_attention(q, k, v, window), loop_reference(q, k, v, window))


def test_window_covers_exactly_w_keys_including_itself():
    mask = band_mask(10, 4, "cpu")
    assert mask.sum(1).tolist() == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]
    assert mask[9, 9] and mask[9, 6] and not mask[9, 5] and not mask[5, 6]


@pytest.mark.parametrize("window", [None, 1, 3, 200])
def test_flex_block_mask_is_the_band(window):
    """flex's mask (the window a captured tensor, so one compiled graph serves every window)
    keeps exactly the keys of band_mask, and the block mask skips no tile it needs."""
    from memopt.runtime.attention import _flex_block_mask

    _flex_block_mask.cache_clear()
    block_mask = _flex_block_mask(256, window, "cpu")
    dense = block_mask.to_dense()[0, 0].bool()  # (query blocks, key blocks) kept
    idx = torch.arange(256)
    kept = block_mask.mask_mod(0, 0, idx[:, None], idx[None, :])
    expected = band_mask(256, window, "cpu")
    assert torch.equal(kept, expected)
    n = block_mask.BLOCK_SIZE[0]
    needed = expected.reshape(256 // n, n, 256 // n, n).any(3).any(1)
    assert torch.equal(dense & needed, needed)


def grads(fn, q, k, v, window=None):
    out = fn(q, k, v, window)
    g = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    return out, g


@pytest.mark.parametrize("shape", [(1, 1, 8, 16), (2, 4, 33, 16), (3, 2, 64, 32)])
def test_cpu_flash_equals_math_forward_and_grads(shape):
    q, k, v = qkv(shape, seed=shape[2])
    out_ref, g_ref = grads(math_attention, q, k, v)
    out, g = grads(IMPLEMENTATIONS["flash"], q, k, v)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-4)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_unavailable_kernels_fail_instead_of_substituting():
    q, k, v = qkv((1, 2, 16, 8))
    with pytest.raises(KernelUnavailable, match="flex"):
        IMPLEMENTATIONS["flex"](q, k, v, 4)
    with pytest.raises(KernelUnavailable, match="sliding window"):
        IMPLEMENTATIONS["flash"](q, k, v, 4)
    with pytest.raises(KernelUnavailable, match="flex"):
        resolve_kernel("flex", 8, "cpu", "bf16")


@pytest.mark.parametrize(
    "requested, window, device, precision, expected",
    [
        ("auto", None, "cuda", "bf16", "flash"),
        ("auto", None, "cuda", "fp32", "efficient"),
        ("auto", 128, "cuda", "bf16", "flex"),
        ("auto", 16, "cpu", "bf16", "math"),
        ("auto", None, "cpu", "fp32", "flash"),
        ("math", 16, "cpu", "fp32", "math"),
    ],
)
def test_auto_resolves_explicitly(requested, window, device, precision, expected):
    assert resolve_kernel(requested, window, device, precision) == expected


@pytest.fixture
def stand_in_flash_attn(monkeypatch):
    """A stand-in `flash_attn` module with flash-attn's interface and window convention, computing
    the reference: (B, T, H, D) inputs; window_size=(left, right) lets query i see keys
    i - left .. i + right (so left + 1 keys with right = 0 under the causal mask)."""
    import importlib.machinery
    import sys
    import types

    from memopt.runtime import attention

    calls = []

    def flash_attn_func(q, k, v, dropout_p=0.0, causal=False, window_size=(-1, -1)):
        calls.append({"shape": tuple(q.shape), "causal": causal, "window_size": window_size})
        assert dropout_p == 0.0 and causal
        T = q.size(1)
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        keep = j <= i
        if window_size[0] >= 0:
            keep &= j >= i - window_size[0]
        s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1) / math.sqrt(q.size(-1))
        p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
        return (p @ v.transpose(1, 2)).transpose(1, 2)

    fake = types.ModuleType("flash_attn")
    fake.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    fake.__version__ = "2.99-stand-in"
    fake.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    attention.flash_attn_impl.cache_clear()
    yield calls
    attention.flash_attn_impl.cache_clear()


@pytest.mark.parametrize("window", [None, 1, 4, 9])
def test_flash_attn_adapter_maps_layout_and_window(stand_in_flash_attn, window):
    from memopt.runtime.attention import flash_attn_attention, flash_attn_impl, kernel_detail

    assert flash_attn_impl() == "FA2"
    assert kernel_detail("flash_attn") == "flash_attn (FA2 2.99-stand-in)"
    q, k, v = qkv((2, 3, 12, 8))
    out_ref, g_ref = grads(math_attention, q, k, v, window)
    out, g = grads(flash_attn_attention, q, k, v, window)
    torch.testing.assert_close(out, out_ref)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)
    call = stand_in_flash_attn[0]
    assert call["shape"] == (2, 12, 3, 8)  # (B, T, H, D), as flash-attn wants
    assert call["window_size"] == ((-1, -1) if window is None else (window - 1, 0))


def test_auto_prefers_flash_attn_when_installed(stand_in_flash_attn):
    assert resolve_kernel("auto", None, "cuda", "bf16") == "flash_attn"
    assert resolve_kernel("auto", 128, "cuda", "bf16") == "flash_attn"
    assert resolve_kernel("auto", None, "cuda", "fp32") == "efficient"


def test_flash_attn_missing_is_an_error(monkeypatch):
    import sys

    from memopt.runtime import attention

    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import fails as if not installed
    attention.flash_attn_impl.cache_clear()
    try:
        q, k, v = qkv((1, 2, 8, 8))
        with pytest.raises(KernelUnavailable, match="flash-attn package"):
            attention.flash_attn_attention(q, k, v)
    finally:
        attention.flash_attn_impl.cache_clear()
