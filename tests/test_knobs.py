"""The offload, grad_accum, compile_memory_budget, compile_mode and precision (fp16, fp8) knobs,
and the liger/cce adapters (with stand-ins for their packages); the refusals: test_knob_refusals.py."""

import os
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from memopt.config import ConfigError, full_spec, validate_config
from memopt.errors import KernelUnavailable, MemoptError
from memopt.runtime import offload
from memopt.runtime.losses import check_loss, output_loss
from memopt.runtime.offload import OffloadedBytes, offload_context
from memopt.runtime.precision import check_fp8
from memopt.runtime.step import technique_optimizer, train_step
from memopt.runtime.techniques import apply_technique, compile_cache_counts

TINY = dict(n_layers=2, d_model=32, n_heads=4, d_ff=64, seq_len=16, dropout=0.0)
VOCAB = 97
TRAIN = {"lr": 3e-3, "weight_decay": 0.1, "warmup_steps": 2, "grad_clip": 1.0}


def batch(n=6):
    idx = torch.randint(0, VOCAB, (n, 17), generator=torch.Generator().manual_seed(1))
    return idx[:, :-1], idx[:, 1:]


def gradients(knobs: dict, stats=None):
    """Loss and gradients of one forward/backward pass of the technique, as train_step runs it
    (its offload context included), on one fixed batch."""
    spec = full_spec(knobs)
    # A CPU run refuses offloading (nothing to gain); its hooks run here all the same.
    applied = apply_technique(dict(spec, offload="none"), TINY, VOCAB, 5, "cpu")
    x, y = batch()
    params = applied.model.parameters()
    with offload_context(spec["offload"], stats, params) if stats is not None else applied.autocast:
        loss = applied.model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in applied.model.named_parameters()}


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_offloaded_activations_give_identical_gradients(checkpointing):
    ref_loss, ref = gradients({"checkpointing": checkpointing})
    stats = OffloadedBytes()
    loss, grads = gradients({"checkpointing": checkpointing, "offload": "activations"}, stats)
    assert torch.equal(loss, ref_loss)
    for name, g in grads.items():
        assert torch.equal(g, ref[name]), name
    assert stats.tensors > 0 and stats.bytes > 0


def test_with_checkpointing_only_the_checkpoints_are_offloaded():
    plain, checkpointed = OffloadedBytes(), OffloadedBytes()
    gradients({"offload": "activations"}, plain)
    gradients({"offload": "activations", "checkpointing": "full"}, checkpointed)
    # Two blocks, each with a dozen saved tensors, against one input per block (and what the
    # embedding, final LayerNorm and loss save outside the blocks).
    assert checkpointed.tensors < plain.tensors / 2
    assert checkpointed.bytes < plain.bytes / 2


def test_parameters_and_their_views_stay_where_they_are():
    """nn.Linear saves weight.t(), a view of the parameter: it must not be copied every step."""
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    stats = OffloadedBytes()
    with offload_context("activations", stats, layer.parameters()):
        y = layer(x).sum()
    y.backward()
    assert stats.tensors == 1 and stats.bytes == x.numel() * 4  # x alone
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(3, 8))


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(4, 6, 8).transpose(0, 2),  # dense, permuted
        lambda: torch.randn(4, 3 * 8)[:, 8:16],  # gaps between rows (like q, k, v)
        lambda: torch.randn(4, 1, 8).expand(4, 5, 8),  # expanded
        lambda: torch.randn(10, 4, 6)[2:].transpose(1, 2),  # dense, offset into its storage
    ],
)
@pytest.mark.parametrize("piece", [1 << 28, 64])  # one pinned buffer, or pieces of 16 floats
def test_offloaded_tensors_come_back_with_their_values_and_strides(make, piece, monkeypatch):
    monkeypatch.setattr(offload, "PIECE_BYTES", piece)
    t = make()
    stats = OffloadedBytes()
    packed = offload._pack(stats, set())(t)
    assert len(packed[1]) == (1 if piece > 1024 else -(-stats.bytes // piece))
    back = offload._unpack(packed)
    assert back.size() == t.size() and back.stride() == t.stride()
    assert torch.equal(back, t)


def test_offload_under_compile_gives_identical_gradients():
    ref_loss, ref = gradients({"compile": True})
    stats = OffloadedBytes()
    loss, grads = gradients({"compile": True, "offload": "activations"}, stats)
    assert stats.tensors > 0
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref[name], rtol=1e-6, atol=1e-7, msg=name)


def test_offloading_past_the_host_budget_is_out_of_memory():
    x = torch.randn(256, 256, requires_grad=True)
    stats = OffloadedBytes(budget=3 * x.numel() * 4)  # three such tensors fit
    with pytest.raises(torch.OutOfMemoryError, match="host memory") as share:
        with offload_context("activations", stats):
            y = x
            for _ in range(5):
                y = y.sin()  # each saves its input
    assert stats.tensors == 3
    assert "share of 50% of the host's memory" in str(share.value)
    offload.set_host_budget(1)  # a study's search.host_pinned_gib: the error names it
    try:
        stats = OffloadedBytes(budget=3 * x.numel() * 4)
        with pytest.raises(torch.OutOfMemoryError, match=r"search\.host_pinned_gib, in pinned"):
            with offload_context("activations", stats):
                y = x
                for _ in range(5):
                    y = y.sin()
    finally:
        offload.set_host_budget(None)


@pytest.mark.parametrize("gpus", [0, 1, 4])
def test_the_host_budget_is_shared_by_the_hosts_gpus(monkeypatch, gpus):
    """Jobs on every GPU of a host at once may pin HOST_FRACTION of its memory in all."""
    from memopt.runtime import lease

    calls = []
    monkeypatch.setattr(
        lease, "nvidia_smi", lambda query: calls.append(query) or [str(i) for i in range(gpus)]
    )
    offload._host_share.cache_clear()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        for _ in range(3):  # every step reads it: nvidia-smi runs once per process
            assert offload.host_budget_bytes() == int(offload.HOST_FRACTION * physical) // max(
                1, gpus
            )
        assert calls == ["index"]
    finally:
        offload._host_share.cache_clear()


def test_a_configured_host_budget_replaces_the_hosts_share(monkeypatch):
    """search.host_pinned_gib: the same budget on hosts of any memory (no nvidia-smi asked)."""
    from memopt.runtime import lease

    monkeypatch.setattr(lease, "nvidia_smi", lambda query: pytest.fail("asked the host"))
    import yaml

    from memopt.config import validate_config
    from memopt.runtime.step import limit_gpu_memory

    raw = yaml.safe_load((Path(__file__).parents[1] / "config.yaml").read_text())
    cfg = validate_config({**raw, "search": {**raw.get("search", {}), "host_pinned_gib": 60}})
    try:
        limit_gpu_memory(cfg, "cpu")  # every job's start (search, cell, quality run)
        assert offload.host_budget_bytes() == 60 * 2**30
        assert offload.OffloadedBytes().budget == 60 * 2**30
    finally:
        offload.set_host_budget(None)
    with pytest.raises(MemoptError, match=r"search\.host_pinned_gib.*0"):
        validate_config({**raw, "search": {**raw.get("search", {}), "host_pinned_gib": 0}})
    monkeypatch.setattr(lease, "nvidia_smi", lambda query: ["0", "1"])
    offload._host_share.cache_clear()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        assert offload.host_budget_bytes() == int(offload.HOST_FRACTION * physical) // 2
    finally:
        offload._host_share.cache_clear()


def train(knobs: dict, steps: int = 3, n: int = 6):
    spec = full_spec(knobs)
    applied = apply_technique(spec, TINY, VOCAB, 5, "cpu")
    opt = technique_optimizer(applied, spec, TRAIN, "cpu")
    x, y = batch(n)
    losses = [float(train_step(applied, opt, x, y, s, TRAIN)) for s in range(steps)]
    return losses, applied


@pytest.mark.parametrize("k", [2, 4, 6])  # 6 sequences: 3 + 3, 2 + 2 + 1 + 1, one each
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])  # SGD's update is linear in the gradient
def test_grad_accum_is_the_whole_batch_step(k, optimizer):
    """Micro-batches weighted by their share give the whole batch's gradient: the same losses
    and parameters after several steps with clipping (dropout off)."""
    ref_losses, ref = train({"optimizer": optimizer})
    losses, applied = train({"grad_accum": k, "optimizer": optimizer})
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for (name, p), (_, q) in zip(applied.model.named_parameters(), ref.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_grad_accum_with_uneven_micro_batches():
    ref_losses, ref = train({"optimizer": "sgd"}, n=7)
    losses, applied = train({"grad_accum": 3, "optimizer": "sgd"}, n=7)  # 3 + 2 + 2 sequences
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for p, q in zip(applied.model.parameters(), ref.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_fp16_trains_with_loss_scaling():
    losses, applied = train({"precision": "fp16"}, steps=6)
    assert applied.scaler._get_growth_tracker() == 6  # six scaled steps, none skipped
    assert applied.record["loss_scaling"] is True
    assert losses[-1] < losses[0] - 0.05, losses
    fp32_losses, _ = train({}, steps=6)
    assert losses == pytest.approx(fp32_losses, abs=0.02)  # the same training within FP16


def test_fp16_overflow_skips_the_step_and_lowers_the_scale():
    spec = full_spec({"precision": "fp16"})
    applied = apply_technique(spec, TINY, VOCAB, 5, "cpu")
    opt = technique_optimizer(applied, spec, TRAIN, "cpu")
    applied.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120)  # FP16 gradients overflow
    before = [p.detach().clone() for p in applied.model.parameters()]
    x, y = batch()
    train_step(applied, opt, x, y, 0, TRAIN)
    assert applied.scaler.get_scale() < 2.0**120
    for p, q in zip(applied.model.parameters(), before):
        assert torch.equal(p, q)  # the overflowed step changed nothing


def test_compile_memory_budget_is_set_for_the_compiled_technique():
    functorch = torch._functorch.config
    apply_technique(
        full_spec({"compile": True, "compile_memory_budget": 0.3}), TINY, VOCAB, 5, "cpu"
    )
    assert functorch.activation_memory_budget == 0.3
    applied = apply_technique(full_spec({"compile": True}), TINY, VOCAB, 5, "cpu")
    assert functorch.activation_memory_budget == 1.0  # no budget leaks into the next technique
    assert applied.record["compile_memory_budget"] is None


def test_a_compiled_technique_compiles_once_for_every_batch_size():
    """The batch dimension is dynamic: after batch 2, batches 3 and 5 reuse the graph (a search's
    trials and the cells of a compiled technique do not compile per batch size)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    applied = apply_technique(full_spec({"compile": True}), TINY, VOCAB, 5, "cpu")
    opt = technique_optimizer(applied, full_spec({}), TRAIN, "cpu")
    for step, n in enumerate((2, 3, 5, 3)):
        x, y = batch(n)
        assert torch.isfinite(train_step(applied, opt, x, y, step, TRAIN))
    frames = torch._dynamo.utils.counters["frames"]
    assert frames["ok"] == 1, dict(frames)  # one frame compiled, never recompiled
    counts = compile_cache_counts()  # recorded in cells and search trials
    assert counts["graphs"] == 1 and counts["fx_hit"] + counts["fx_miss"] >= 1, counts
    torch._dynamo.reset()


def test_offload_on_a_cpu_is_refused_at_run_time_too():  # device auto resolved to a CPU
    with pytest.raises(KernelUnavailable, match="offload 'activations'.*allowed here: none"):
        apply_technique(full_spec({"offload": "activations"}), TINY, VOCAB, 5, "cpu")


def test_fp8_needs_a_gpu_with_fp8_tensor_cores():
    with pytest.raises(KernelUnavailable, match="fp8.*CUDA GPU"):
        check_fp8("cpu")
    with pytest.raises(KernelUnavailable, match="fp8"):
        apply_technique(full_spec({"precision": "fp8"}), TINY, VOCAB, 5, "cpu")


@pytest.mark.parametrize("loss, extra", [("liger", "liger"), ("cce", "cce")])
def test_a_missing_loss_package_names_its_install_command(loss, extra, monkeypatch):
    module = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}[loss]
    monkeypatch.setitem(sys.modules, module, None)  # import fails even where it is installed
    with pytest.raises(KernelUnavailable, match=rf"pip install -e '\.\[{extra}\]'"):
        check_loss(loss, "cuda")


def _stand_ins(monkeypatch, calls):
    """Fake liger_kernel and cut_cross_entropy modules with the real call signatures, computing
    the standard loss, so the adapter's argument order and dtypes are checked on a CPU."""

    class LigerFusedLinearCrossEntropyLoss:
        def __init__(self, accum_dtype=None):
            assert accum_dtype == torch.float32  # the weight's gradient accumulates in FP32

        def __call__(self, lin_weight, _input, target):
            calls.append(("liger", _input.dtype, lin_weight.dtype, _input.shape))
            return F.cross_entropy(F.linear(_input, lin_weight).float(), target)

    def linear_cross_entropy(e, c, targets):
        calls.append(("cce", e.dtype, c.dtype, e.shape))
        return F.cross_entropy((e @ c.T).float(), targets)

    transformers = types.ModuleType("liger_kernel.transformers")
    transformers.LigerFusedLinearCrossEntropyLoss = LigerFusedLinearCrossEntropyLoss
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", transformers)
    cce = types.ModuleType("cut_cross_entropy")
    cce.linear_cross_entropy = linear_cross_entropy
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", cce)


@pytest.mark.parametrize("loss", ["liger", "cce"])
@pytest.mark.parametrize("autocast", [False, True])
def test_fused_loss_adapters_pass_rows_weight_and_targets(loss, autocast, monkeypatch):
    calls = []
    _stand_ins(monkeypatch, calls)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, 8, generator=g, requires_grad=True)
    w = torch.randn(11, 8, generator=g, requires_grad=True)
    y = torch.randint(0, 11, (2, 5), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        value = output_loss(loss, h, w, y, 4096)
        ref = F.cross_entropy(F.linear(h, w).float().reshape(-1, 11), y.reshape(-1))
    dtype = torch.bfloat16 if autocast else torch.float32
    assert calls == [(loss, dtype, dtype, torch.Size([10, 8]))]  # rows flattened, 16-bit inputs
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, ref, rtol=2e-2, atol=2e-2)
    value.backward()
    assert h.grad is not None and w.grad is not None and h.grad.dtype == torch.float32


def test_compile_mode_is_the_mode_torch_compile_gets(monkeypatch):
    """compile_mode reaches torch.compile as its mode, is recorded, and is refused without
    compile (it is torch.compile's mode)."""
    seen = []
    real = torch.compile

    def compile_spy(model, **kwargs):
        seen.append(kwargs)
        return real(model, backend="eager")

    monkeypatch.setattr(torch, "compile", compile_spy)
    for mode in ("default", "reduce-overhead", "max-autotune-no-cudagraphs"):
        spec = full_spec({"compile": True, "compile_mode": mode})
        applied = apply_technique(spec, TINY, VOCAB, 5, "cpu")
        assert seen[-1] == {"mode": mode} and applied.record["compile_mode"] == mode
    with pytest.raises(ConfigError, match=r"compile_mode: 'reduce-overhead' needs .*compile true"):
        validate_config({"techniques": {"a": {"compile_mode": "reduce-overhead"}}})


def test_compile_mode_is_named_as_a_compile_change_and_in_the_technique_table():
    from memopt.knobs import BY_NAME
    from memopt.report.effects import incremental_effects

    row = {"compile": True, "compile_mode": "reduce-overhead"}
    assert BY_NAME["compile_mode"].labels(row) == "compile mode reduce-overhead"
    assert BY_NAME["compile_mode"].labels({"compile_mode": "default"}) is None
    base = dict(technique="compiled", batch_entry="same", status="ok", compile=True,
                tokens_per_s=100.0, peak_allocated_mib=1000.0)  # fmt: skip
    graphs = dict(base, technique="graphs", compile_mode="reduce-overhead", tokens_per_s=120.0)
    older = {k: v for k, v in base.items() if k != "compile"}  # a cell from before compile: off
    rows = incremental_effects([base, graphs, dict(older, technique="eager")])
    (change,) = [r for r in rows if r["technique"] == "graphs"]
    assert change["knob"] == "compile" and change["over"] == "compiled"
    assert change["change"] == "compile → compile + mode reduce-overhead"
