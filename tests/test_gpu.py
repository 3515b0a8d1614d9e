"""CUDA-only checks (run on a GPU machine: pytest -m gpu): every kernel equals the explicit
reference on random shapes, and techniques agree at the model level."""

import pytest
import torch

from memopt.runtime.attention import IMPLEMENTATIONS, flash_attn_impl, math_attention
from memopt.runtime.model import ModelConfig, build_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SHAPES = [(2, 4, 256, 64), (1, 12, 1024, 64), (3, 2, 200, 32)]  # 200: not a multiple of a tile


def rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [
        torch.randn(shape, generator=g, device="cuda").to(dtype).requires_grad_() for _ in range(3)
    ]


def fwd_bwd(fn, q, k, v, window):
    out = fn(q, k, v, window)
    return out, torch.autograd.grad(out.float().square().sum(), (q, k, v))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "kernel, window, dtype, tol",
    [
        ("flash", None, torch.bfloat16, 2e-2),
        ("efficient", None, torch.float32, 2e-4),
        ("cudnn", None, torch.bfloat16, 2e-2),
        ("flex", None, torch.bfloat16, 2e-2),
        ("flex", 128, torch.bfloat16, 2e-2),
        ("flex", 37, torch.float32, 2e-4),
        ("flash_attn", None, torch.bfloat16, 2e-2),
        ("flash_attn", 64, torch.bfloat16, 2e-2),
    ],
)
def test_kernel_equals_math(shape, kernel, window, dtype, tol):
    if kernel == "flash_attn" and flash_attn_impl() is None:
        pytest.skip("flash-attn is not installed here")
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v = rand(shape, dtype, seed=sum(shape))
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out_ref, g_ref = fwd_bwd(math_attention, *ref, window)
    out, g = fwd_bwd(IMPLEMENTATIONS[kernel], q, k, v, window)
    scale = out_ref.abs().max().item()
    torch.testing.assert_close(out.double(), out_ref, atol=tol * scale, rtol=tol)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a.double(), b, atol=tol * 4 * b.abs().max().item(), rtol=tol * 4)


TINY = dict(vocab_size=512, n_layers=2, d_model=128, n_heads=4, d_ff=256, seq_len=256, dropout=0.0)


@pytest.mark.parametrize(
    "attention, checkpointing",
    [
        ("flash", "none"),
        ("cudnn", "none"),
        ("flex", "none"),
        ("math", "full"),
        ("flash", "selective"),
    ],
)
def test_model_loss_matches_the_explicit_model(attention, checkpointing):
    idx = torch.randint(
        0, 512, (4, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(0)
    )
    losses = {}
    for name, kw in {
        "ref": dict(attention="math"),
        "tech": dict(attention=attention, checkpointing=checkpointing),
    }.items():
        model = build_model(ModelConfig(**TINY, **kw), 0, "cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            losses[name] = model(idx[:, :-1], idx[:, 1:]).item()
    assert losses["tech"] == pytest.approx(losses["ref"], abs=2e-2)
