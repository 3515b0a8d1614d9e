"""The decoder: identical seeded init, tied embeddings, checkpointing that changes nothing."""

import pytest
import torch

from memopt.runtime.model import ModelConfig, build_model, n_params

TINY = dict(vocab_size=97, n_layers=3, d_model=32, n_heads=4, d_ff=64, seq_len=16, dropout=0.1)


def test_init_is_identical_for_every_build_and_tied():
    a, b = build_model(ModelConfig(**TINY), 7, "cpu"), build_model(ModelConfig(**TINY), 7, "cpu")
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), na
    assert a.head.weight is a.tok.weight
    c = build_model(ModelConfig(**TINY), 8, "cpu")
    assert not torch.equal(a.tok.weight, c.tok.weight)


def test_param_count_by_hand():
    d, f, v, t, n = 32, 64, 97, 16, 3
    per_layer = 3 * d * d + 3 * d + d * d + d + d * f + f + f * d + d + 4 * d
    assert (
        n_params(build_model(ModelConfig(**TINY), 0, "cpu"))
        == v * d + t * d + n * per_layer + 2 * d
    )


def loss_and_grads(mode, window=None):
    model = build_model(
        ModelConfig(**TINY, checkpointing=mode, checkpoint_every=2, window=window), 3, "cpu"
    )
    idx = torch.randint(0, 97, (4, 17), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(123)  # the same dropout masks for every mode
    loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["full", "every_k", "selective"])
@pytest.mark.parametrize("window", [None, 5])
def test_checkpointing_gives_same_loss_and_grads(mode, window):
    ref_loss, ref_grads = loss_and_grads("none", window)
    loss, grads = loss_and_grads(mode, window)
    assert torch.equal(loss, ref_loss)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-6, atol=1e-7, msg=name)


def test_dropout_is_active_in_training():
    a, _ = loss_and_grads("none")
    torch.manual_seed(999)
    model = build_model(ModelConfig(**TINY), 3, "cpu")
    idx = torch.randint(0, 97, (4, 17), generator=torch.Generator().manual_seed(0))
    assert not torch.equal(model(idx[:, :-1], idx[:, 1:]).detach(), a)


def test_checkpointing_modes_keep_less_after_forward():
    from memopt.runtime.measure import TensorMemoryTracker

    kept = {}
    for mode in ("none", "selective", "every_k", "full"):
        cfg = ModelConfig(
            **{**TINY, "n_layers": 4, "d_model": 64, "seq_len": 64}, checkpointing=mode
        )
        model = build_model(cfg, 0, "cpu")
        idx = torch.randint(0, 97, (8, 65), generator=torch.Generator().manual_seed(0))
        with TensorMemoryTracker(existing=list(model.parameters())) as tracker:
            model(idx[:, :-1], idx[:, 1:])
            kept[mode] = tracker.current
    assert kept["none"] > kept["selective"] > kept["full"]
    assert kept["none"] > kept["every_k"] > kept["full"]
