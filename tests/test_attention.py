"""Every attention kernel computes the explicit reference, forward and gradients."""

import math

import pytest
import torch

from memopt.attention import IMPLEMENTATIONS, band_mask, math_attention, resolve_kernel
from memopt.errors import KernelUnavailable


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


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize(
    "kernel, window, dtype, tol",
    [
        ("flash", None, torch.bfloat16, 2e-2),
        ("efficient", None, torch.float32, 2e-4),
        ("flex", None, torch.bfloat16, 2e-2),
        ("flex", 128, torch.bfloat16, 2e-2),
        ("flex", 37, torch.float32, 2e-4),
    ],
)
def test_gpu_kernels_equal_math(kernel, window, dtype, tol):
    q, k, v = qkv((2, 4, 256, 64), dtype=dtype, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    ref_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out_ref, g_ref = grads(math_attention, *ref_inputs, window)
    out, g = grads(IMPLEMENTATIONS[kernel], q, k, v, window)
    torch.testing.assert_close(out.double(), out_ref, atol=tol, rtol=tol)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a.double(), b, atol=tol * 4, rtol=tol * 4)
