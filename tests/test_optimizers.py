"""The `optimizer` and `optimizer_in_backward` knobs: in-backward updates are the ordinary step's,
the lighter optimizers train with less state, and what cannot run is refused up front."""

import sys

import pytest
import torch

from memopt.config import ConfigError, full_spec, validate_config
from memopt.errors import KernelUnavailable
from memopt.runtime.functions import function_of, functions
from memopt.runtime.model import ModelConfig, build_model
from memopt.runtime.optimizers import make_optimizer, state_bytes
from memopt.runtime.step import train_step
from memopt.runtime.techniques import apply_technique

TINY = dict(vocab_size=97, n_layers=2, d_model=32, n_heads=4, d_ff=64, seq_len=16, dropout=0.1)
TRAIN = {"lr": 3e-3, "weight_decay": 0.1, "warmup_steps": 2, "grad_clip": 0.0}


# Matrices of 4,096+ values: torchao quantizes the state of those only.
WIDER = dict(TINY, d_model=64, d_ff=256)


def train(optimizer="adamw", in_backward=False, steps=3, checkpointing="none", model=TINY):
    spec = full_spec({"checkpointing": checkpointing, "optimizer": optimizer})
    model_cfg = {k: v for k, v in model.items() if k != "vocab_size"}
    applied = apply_technique(spec, model_cfg, model["vocab_size"], 5, "cpu")
    opt = make_optimizer(applied.model, TRAIN, "cpu", optimizer, in_backward)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 97, (4, 17), generator=g)  # one fixed batch: the loss must fall
    torch.manual_seed(2)
    losses = [
        float(train_step(applied, opt, idx[:, :-1], idx[:, 1:], s, TRAIN)) for s in range(steps)
    ]
    state = state_bytes(opt)
    return applied.model, losses, state


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "adafactor"])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_in_backward_updates_are_the_ordinary_steps(optimizer, checkpointing):
    ref, ref_losses, ref_state = train(optimizer, False, 4, checkpointing)
    model, losses, state = train(optimizer, True, 4, checkpointing)
    assert losses == ref_losses and state == ref_state
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), name
        assert p.grad is None  # freed in the hook: the model's gradients never coexist


def test_lighter_optimizers_train_with_less_state():
    _, adamw_losses, adamw_state = train("adamw", steps=30)
    for name in ("sgd", "adafactor"):
        _, losses, state = train(name, steps=30)
        assert losses[-1] < losses[0] - 0.25, name
        assert state < adamw_state * 0.6, (name, state, adamw_state)
    assert adamw_losses[-1] < adamw_losses[0] - 0.5


@pytest.mark.parametrize("name, at_most", [("adamw8bit", 0.4), ("adamw4bit", 0.3)])
def test_low_bit_adamw_trains_with_less_state(name, at_most):
    """Through the training step (which sets the learning rate every step: torchao keeps it a
    tensor) on a CPU; the GPU kernels are checked by tests/test_gpu_knobs.py."""
    _, _, adamw_state = train("adamw", steps=2, model=WIDER)
    _, losses, state = train(name, steps=30, model=WIDER)
    assert losses[-1] < losses[0] - 0.5, losses
    assert state < at_most * adamw_state, (state, adamw_state)


@pytest.mark.parametrize("name", ["adamw8bit", "adamw4bit"])
def test_low_bit_adamw_without_torchao_says_how_to_install(name, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # as if torchao were missing
    model = build_model(ModelConfig(**TINY), 0, "cpu")
    with pytest.raises(KernelUnavailable, match=r"pip install torchao"):
        make_optimizer(model, TRAIN, "cpu", name)


def test_in_backward_with_clipping_is_refused_naming_both_keys():
    techniques = {"t": {"optimizer_in_backward": True}}
    with pytest.raises(
        ConfigError, match=r"techniques\.t\.optimizer_in_backward.*train\.grad_clip"
    ):
        validate_config({"techniques": techniques, "baseline": "t"})
    cfg = validate_config({"techniques": techniques, "baseline": "t", "train": {"grad_clip": 0}})
    assert cfg["techniques"]["t"]["optimizer_in_backward"] is True
    with pytest.raises(ConfigError, match="optimizer"):
        validate_config({"techniques": {"t": {"optimizer": "lion"}}, "baseline": "t"})


def test_an_optimizer_is_a_function_in_backward_is_not():
    base = dict(precision="bf16", window=None)
    techniques = {
        "flash": dict(base, attention="flash"),
        "flash_ib": dict(base, attention="flash", optimizer_in_backward=True),
        "flash_8bit": dict(base, attention="flash", optimizer="adamw8bit"),
        "local_sgd": dict(base, attention="flex", window=128, optimizer="sgd"),
    }
    assert functions(techniques) == {
        "bf16": ["flash", "flash_ib"],
        "bf16_adamw8bit": ["flash_8bit"],
        "bf16_w128_sgd": ["local_sgd"],
    }
    assert function_of(dict(base, optimizer="adamw")) == "bf16"
