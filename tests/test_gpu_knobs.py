"""CUDA-only checks of the loss and optimizer knobs (pytest -m gpu): the chunked loss at the default
model's output layer, in-backward updates with the fused AdamW, torchao's low-bit AdamW."""

import importlib.util

import pytest
import torch

from memopt.losses import chunked_cross_entropy
from memopt.model import ModelConfig, build_model
from memopt.optimizers import make_optimizer, state_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
TRAIN = {"lr": 1e-3, "weight_decay": 0.1, "warmup_steps": 1, "grad_clip": 0.0}
SMALL = dict(vocab_size=4096, n_layers=2, d_model=256, n_heads=4, d_ff=1024, seq_len=256)


def loss_memory(fn, h, weight, y) -> tuple[torch.Tensor, list, float]:
    """The loss, its gradients and the peak memory (MiB) the loss adds on top of its inputs."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fn(h, weight, y)
    grads = torch.autograd.grad(loss, (h, weight))
    torch.cuda.synchronize()
    return loss.detach(), grads, (torch.cuda.max_memory_allocated() - base) / 2**20


def test_chunked_loss_at_the_default_output_layer():
    """8 sequences of 1,024 tokens, d 768, vocabulary 32,000, BF16 autocast: the same loss and
    gradients, and less than a quarter of the standard loss's extra memory."""
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(8 * 1024, 768, device="cuda", generator=g, requires_grad=True)
    weight = (0.02 * torch.randn(32_000, 768, device="cuda", generator=g)).requires_grad_()
    y = torch.randint(0, 32_000, (8 * 1024,), device="cuda", generator=g)
    ref, ref_grads, ref_mib = loss_memory(
        lambda h, w, y: torch.nn.functional.cross_entropy(h @ w.T, y), h, weight, y
    )
    loss, grads, mib = loss_memory(
        lambda h, w, y: chunked_cross_entropy(h, w, y, 1024), h, weight, y
    )
    torch.testing.assert_close(loss, ref, rtol=2e-3, atol=2e-3)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(
            a.float(), b.float(), rtol=5e-2, atol=5e-2 * b.abs().max().item()
        )
    assert mib < ref_mib / 4, (mib, ref_mib)


def train(optimizer="adamw", in_backward=False, steps=20):
    model = build_model(ModelConfig(**SMALL), 0, "cuda")
    opt = make_optimizer(model, TRAIN, "cuda", optimizer, in_backward)
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = torch.randint(0, SMALL["vocab_size"], (8, 257), device="cuda", generator=g)
    losses = []
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    state = state_bytes(opt)
    return model, losses, state


def test_in_backward_with_fused_adamw_is_the_ordinary_step():
    torch.backends.cuda.matmul.allow_tf32 = False
    ref, ref_losses, _ = train(steps=4)
    model, losses, _ = train(in_backward=True, steps=4)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, msg=name)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
@pytest.mark.parametrize("name, at_most", [("adamw8bit", 0.35), ("adamw4bit", 0.2)])
def test_low_bit_adamw_trains_with_a_fraction_of_the_state(name, at_most):
    _, _, adamw_state = train(steps=2)
    _, losses, state = train(name, steps=20)
    assert losses[-1] < losses[0] - 1.0, losses
    assert state < at_most * adamw_state, (state, adamw_state)
