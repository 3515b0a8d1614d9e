"""The llama block on a CUDA GPU (pytest -m gpu): every attention kernel shares key/value heads
(grouped-query attention) and agrees with the explicit one; the GPU-only knobs (offloaded
activations, the fused losses, FP8 linear layers, compile, FlexAttention windows) train it as
they train the GPT-2 block."""

import importlib.util

import pytest
import torch

from memopt.config import full_spec
from memopt.runtime import attention
from memopt.runtime.step import technique_optimizer, train_step
from memopt.runtime.techniques import apply_technique

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
TRAIN = {"lr": 1e-3, "weight_decay": 0.1, "warmup_steps": 1, "grad_clip": 1.0}
LLAMA = dict(n_layers=2, d_model=256, n_heads=4, d_ff=512, seq_len=256, dropout=0.0,
             arch="llama", n_kv_heads=2, rope_theta=10000.0)  # fmt: skip


@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn", "flex"])
def test_every_kernel_shares_key_value_heads(kernel):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, 2, 256, 64, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))  # fmt: skip
    ref = attention.math_attention(q.float(), k.float(), v.float())
    out = attention.IMPLEMENTATIONS[kernel](q, k, v)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def losses(knobs: dict, steps: int = 4, batch: int = 4) -> list[float]:
    spec = full_spec(knobs)
    applied = apply_technique(spec, LLAMA, 4096, 0, "cuda")
    opt = technique_optimizer(applied, spec, TRAIN, "cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    out = []
    for step in range(steps):
        idx = torch.randint(0, 4096, (batch, 257), device="cuda", generator=g)
        out.append(train_step(applied, opt, idx[:, :-1], idx[:, 1:], step, TRAIN).item())
    return out


SAME_AS_BF16 = {
    "offload": {"offload": "activations"},
    "offload_ckpt": {"offload": "activations", "checkpointing": "full"},
    "compiled": {"compile": True},
    "chunked": {"loss": "chunked", "loss_chunk": 256},
    "flex": {"attention": "flex"},
}
FUSED = {
    "liger": ("liger_kernel", {"loss": "liger"}),
    "cce": ("cut_cross_entropy", {"loss": "cce"}),
}


@pytest.mark.parametrize("name", [*SAME_AS_BF16, *FUSED])
def test_gpu_knobs_train_the_llama_block_as_bf16_does(name):
    if name in FUSED and importlib.util.find_spec(FUSED[name][0]) is None:
        pytest.skip(f"{FUSED[name][0]} is not installed")
    knobs = SAME_AS_BF16.get(name) or FUSED[name][1]
    ref = losses({"precision": "bf16", "attention": "flash"})
    got = losses({"precision": "bf16", "attention": "flash", **knobs})
    assert max(abs(a - b) for a, b in zip(ref, got)) < 0.05, (ref, got)
    assert got[-1] < got[0]


def test_fp8_and_a_flex_window_train_the_llama_block():
    if torch.cuda.get_device_capability() < (8, 9) or importlib.util.find_spec("torchao") is None:
        pytest.skip("FP8 needs an FP8 GPU and torchao")
    bf16 = losses({"precision": "bf16", "attention": "flash"})
    for knobs in ({"precision": "fp8", "attention": "flash"},
                  {"precision": "bf16", "attention": "flex", "window": 64}):  # fmt: skip
        got = losses(knobs)  # other functions: near BF16's losses on random tokens, not equal
        assert max(abs(a - b) for a, b in zip(bf16, got)) < 0.1, (knobs, bf16, got)
