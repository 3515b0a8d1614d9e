"""The `loss` knob: the chunked loss computes the standard loss and gradients, keeping far less."""

import pytest
import torch

from memopt.config import ConfigError, full_spec, validate_config
from memopt.report.effects import incremental_effects
from memopt.runtime.losses import chunked_cross_entropy
from memopt.runtime.measure import TensorMemoryTracker
from memopt.runtime.model import ModelConfig, build_model

TINY = dict(vocab_size=97, n_layers=2, d_model=32, n_heads=4, d_ff=64, seq_len=16, dropout=0.1)


def loss_and_grads(loss, chunk=4096, autocast=False, vocab=97, batch=4):
    cfg = ModelConfig(**{**TINY, "vocab_size": vocab}, loss=loss, loss_chunk=chunk)
    model = build_model(cfg, 3, "cpu")
    idx = torch.randint(0, vocab, (batch, 17), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(123)  # the same dropout masks
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        value = model(idx[:, :-1], idx[:, 1:])
    value.backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])  # one row, uneven chunks, exactly whole, more
def test_chunked_loss_is_the_standard_loss_with_its_gradients(chunk):
    ref_loss, ref_grads = loss_and_grads("standard")
    loss, grads = loss_and_grads("chunked", chunk)
    assert loss.dtype == ref_loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_chunked_loss_under_bf16_autocast_stays_within_bf16_tolerance():
    ref_loss, ref_grads = loss_and_grads("standard", autocast=True)
    loss, grads = loss_and_grads("chunked", 10, autocast=True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=1e-2)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=5e-2, atol=5e-3, msg=name)


def test_chunked_loss_never_holds_the_whole_logits():
    """Peak tracked memory of the loss alone (hidden states and weight already live): the
    standard loss keeps all rows x vocab logits; the chunked one about one chunk's worth."""
    rows, d, vocab, chunk = 512, 16, 4000, 32
    h = torch.randn(rows, d, requires_grad=True)
    weight = torch.randn(vocab, d, requires_grad=True)
    y = torch.randint(0, vocab, (rows,))
    peaks = {}
    for name, fn in {
        "standard": lambda: torch.nn.functional.cross_entropy(h @ weight.T, y),
        "chunked": lambda: chunked_cross_entropy(h, weight, y, chunk),
    }.items():
        with TensorMemoryTracker(existing=[h, weight, y]) as tracker:
            fn().backward()
        peaks[name] = tracker.peak - sum(t.numel() * t.element_size() for t in (h, weight, y))
        h.grad = weight.grad = None
    logits_bytes = rows * vocab * 4
    assert peaks["standard"] >= logits_bytes
    assert peaks["chunked"] < logits_bytes / 4


def test_loss_knob_is_validated_and_named_in_a_change():
    with pytest.raises(ConfigError, match="loss"):
        validate_config({"techniques": {"t": {"loss": "fused"}}})
    with pytest.raises(ConfigError, match="loss_chunk"):
        validate_config({"techniques": {"t": {"loss": "chunked", "loss_chunk": 0}}})
    base = full_spec({"precision": "bf16", "attention": "flash"})
    cells = [
        dict(base, technique="flash", kernel="flash", batch_entry="same", status="ok"),
        dict(base, technique="flash_chunked", kernel="flash", batch_entry="same", status="ok"),
    ]
    cells[1]["loss"] = "chunked"
    for c in cells:
        c.update(peak_allocated_mib=100.0, tokens_per_s=10.0)
    (row,) = incremental_effects(cells)
    assert (row["knob"], row["change"]) == ("loss", "standard → chunked")


def test_chunked_loss_is_traced_into_a_compiled_graph():
    """Under torch.compile the chunk loop is unrolled into the graph (no graph break, where the
    cross-entropy fuses), with the same loss and gradients as eager."""
    import torch._dynamo

    from memopt.runtime.techniques import apply_technique

    model_cfg = {k: v for k, v in TINY.items() if k not in ("vocab_size", "dropout")}
    idx = torch.randint(0, 97, (6, 17), generator=torch.Generator().manual_seed(1))
    out = []
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for compile in (False, True):
        knobs = {"loss": "chunked", "loss_chunk": 16, "compile": compile}
        applied = apply_technique(full_spec(knobs), {**model_cfg, "dropout": 0.0}, 97, 5, "cpu")
        loss = applied.model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        out.append((loss.detach(), [p.grad for p in applied.model.parameters()]))
    assert not torch._dynamo.utils.counters["graph_break"]
    torch.testing.assert_close(out[1][0], out[0][0])
    for a, b in zip(out[1][1], out[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
