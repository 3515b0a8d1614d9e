"""CUDA-only checks of the round-2 knobs (pytest -m gpu): the chunked loss at the default model's
output layer, liger's and cce's fused losses (when installed), in-backward updates with the fused
AdamW, torchao's low-bit AdamW, FP16 with loss scaling, FP8 linear layers (on FP8 GPUs),
activation offloading, compile's memory budget and its mode."""

import importlib.util

import pytest
import torch

from memopt.config import full_spec
from memopt.runtime.losses import chunked_cross_entropy, output_loss
from memopt.runtime.model import ModelConfig, build_model
from memopt.runtime.offload import offload_context
from memopt.runtime.optimizers import make_optimizer, state_bytes
from memopt.runtime.step import technique_optimizer, train_step
from memopt.runtime.techniques import apply_technique

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
TRAIN = {"lr": 1e-3, "weight_decay": 0.1, "warmup_steps": 1, "grad_clip": 0.0}
SMALL = dict(vocab_size=4096, n_layers=2, d_model=256, n_heads=4, d_ff=1024, seq_len=256)
SMALL_MODEL = {k: v for k, v in SMALL.items() if k != "vocab_size"}


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


@pytest.mark.parametrize("name, at_most", [("adamw8bit", 0.35), ("adamw4bit", 0.2)])
def test_low_bit_adamw_trains_with_a_fraction_of_the_state(name, at_most):
    _, _, adamw_state = train(steps=2)
    _, losses, state = train(name, steps=20)
    assert losses[-1] < losses[0] - 1.0, losses
    assert state < at_most * adamw_state, (state, adamw_state)


def default_output_layer():
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(8 * 1024, 768, device="cuda", generator=g, requires_grad=True)
    weight = (0.02 * torch.randn(32_000, 768, device="cuda", generator=g)).requires_grad_()
    y = torch.randint(0, 32_000, (8 * 1024,), device="cuda", generator=g)
    return h, weight, y


@pytest.mark.parametrize("loss, module", [("liger", "liger_kernel"), ("cce", "cut_cross_entropy")])
def test_fused_losses_match_the_standard_loss_with_less_memory(loss, module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[{loss}]')")
    h, weight, y = default_output_layer()
    ref, ref_grads, ref_mib = loss_memory(
        lambda h, w, y: torch.nn.functional.cross_entropy(h @ w.T, y), h, weight, y
    )
    value, grads, mib = loss_memory(lambda h, w, y: output_loss(loss, h, w, y, 0), h, weight, y)
    torch.testing.assert_close(value, ref.float(), rtol=5e-3, atol=5e-3)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(
            a.float(), b.float(), rtol=5e-2, atol=5e-2 * b.abs().max().item()
        )
    assert mib < ref_mib / 4, (mib, ref_mib)


def train_technique(knobs: dict, steps: int, clip: float = 1.0):
    spec = full_spec(knobs)
    applied = apply_technique(spec, {**SMALL_MODEL, "dropout": 0.0}, SMALL["vocab_size"], 0, "cuda")
    train_cfg = {**TRAIN, "grad_clip": clip}
    opt = technique_optimizer(applied, spec, train_cfg, "cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = torch.randint(0, SMALL["vocab_size"], (8, 257), device="cuda", generator=g)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses = [
        float(train_step(applied, opt, idx[:, :-1], idx[:, 1:], s, train_cfg)) for s in range(steps)
    ]
    return losses, applied, torch.cuda.max_memory_allocated() / 2**20


def test_fp16_trains_with_loss_scaling_like_bf16():
    bf16, _, _ = train_technique({"precision": "bf16", "attention": "flash"}, 20)
    fp16, applied, _ = train_technique({"precision": "fp16", "attention": "flash"}, 20)
    assert applied.scaler._get_growth_tracker() > 0  # the last steps were taken, not skipped
    assert fp16[-1] < fp16[0] - 1.0, fp16
    assert fp16[-1] == pytest.approx(bf16[-1], abs=0.1)


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
    reason="no FP8 tensor cores (compute capability < 8.9)",
)
@pytest.mark.parametrize("compile", [False, True])
def test_fp8_linear_layers_train(compile):
    bf16, _, _ = train_technique({"precision": "bf16", "attention": "flash"}, 20)
    knobs = {"precision": "fp8", "attention": "flash", "compile": compile}
    fp8, applied, _ = train_technique(knobs, 20)
    assert applied.record["fp8_linear_layers"] == 4 * SMALL["n_layers"]  # qkv, proj, fc, fc_proj
    assert fp8[-1] < fp8[0] - 1.0, fp8
    assert fp8[-1] == pytest.approx(bf16[-1], abs=0.2)


def gradients(knobs: dict):
    spec = full_spec(knobs)
    applied = apply_technique(spec, {**SMALL_MODEL, "dropout": 0.0}, SMALL["vocab_size"], 0, "cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = torch.randint(0, SMALL["vocab_size"], (16, 257), device="cuda", generator=g)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with applied.autocast, offload_context(spec["offload"], None, applied.model.parameters()):
        loss = applied.model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return loss.item(), [p.grad.clone() for p in applied.model.parameters()], peak


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_offloaded_activations_same_gradients_less_gpu_memory(checkpointing):
    # The explicit kernel: deterministic, so the gradients must be bit for bit the same.
    knobs = {"precision": "bf16", "attention": "math", "checkpointing": checkpointing}
    ref_loss, ref, ref_peak = gradients(knobs)
    loss, grads, peak = gradients({**knobs, "offload": "activations"})
    assert loss == ref_loss
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert peak < 0.8 * ref_peak, (peak, ref_peak)


def saved_mib(knobs: dict) -> float:
    """MiB the forward pass leaves allocated for the backward pass (8 x 1,024 tokens)."""
    spec = full_spec(knobs)
    model_cfg = {**SMALL_MODEL, "seq_len": 1024, "n_layers": 4, "dropout": 0.0}
    applied = apply_technique(spec, model_cfg, SMALL["vocab_size"], 0, "cuda")
    idx = torch.randint(0, SMALL["vocab_size"], (8, 1025), device="cuda")
    for _ in range(2):  # the first call compiles
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        with applied.autocast:
            loss = applied.model(idx[:, :-1], idx[:, 1:])
        torch.cuda.synchronize()
        saved = (torch.cuda.memory_allocated() - base) / 2**20
        loss.backward()
        applied.model.zero_grad(set_to_none=True)
    return saved


def test_compile_memory_budget_saves_less_for_the_backward_pass():
    knobs = {"precision": "bf16", "attention": "flash", "compile": True}
    torch._dynamo.reset()
    full = saved_mib(knobs)
    torch._dynamo.reset()
    lean = saved_mib({**knobs, "compile_memory_budget": 0.1})
    torch._dynamo.reset()
    assert lean < 0.6 * full, (lean, full)


def test_compile_mode_reduce_overhead_trains_as_the_default_mode():
    """CUDA graphs change how the compiled step is launched, not what it computes: five BF16
    steps of the small model (batch 8) with compile_mode reduce-overhead give the default
    mode's losses."""
    knobs = {"precision": "bf16", "attention": "flash", "compile": True}
    default, _, _ = train_technique(knobs, 5)
    graphs, applied, _ = train_technique({**knobs, "compile_mode": "reduce-overhead"}, 5)
    assert applied.record["compile_mode"] == "reduce-overhead"
    assert default == pytest.approx(graphs, abs=2e-2), (default, graphs)


def test_compile_mode_reduce_overhead_runs_every_job_kind(tiny_study):
    """CUDA graphs through the jobs that keep every step's loss: the exactness run matches the
    default mode's, a timing cell and a search finish, and a search's trials leave no graph
    memory pool behind (it would count against the next trial's budget)."""
    from memopt.config import validate_config
    from memopt.jobs.cell import run_cell
    from memopt.jobs.quality import run_exactness
    from memopt.jobs.search import search_max_batch

    cpu_cfg, data = tiny_study
    knobs = {"precision": "bf16", "attention": "flash", "compile": True}
    cfg = validate_config(
        {**{k: cpu_cfg[k] for k in ("model", "train", "measure")}, "device": "cuda",
         "search": {"max_batch": 64, "memory_budget_gib": 4},
         "baseline": "plain",
         "techniques": {"plain": knobs, "graphs": {**knobs, "compile_mode": "reduce-overhead"}}}
    )  # fmt: skip
    plain, graphs = (run_exactness(cfg, t, data, "cuda")["losses"] for t in ("plain", "graphs"))
    assert plain == pytest.approx(graphs, abs=2e-2), (plain, graphs)
    cell = run_cell(cfg, "graphs", "8", 8, data, "cuda")
    assert cell["status"] == "ok" and cell["precision_flags"]["compile_mode"] == "reduce-overhead"
    assert len(cell["loss_curve"]) == cell["steps"]
    found = search_max_batch(cfg, "graphs", data, "cuda")
    assert found["status"] in ("ok", "capped") and found["max_batch"] >= 8
    assert torch.cuda.memory_reserved() < 64 * 2**20  # the pools went with the trials
