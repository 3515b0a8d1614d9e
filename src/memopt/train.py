"""One cell: train a technique at one batch size, time it, measure memory, evaluate quality.

Protocol: `measure.warmup_steps` steps first (compilation, allocator and optimizer-state warm-up;
excluded from timing), then the timed steps, each timed on its own. Peak memory covers whole
steps, optimizer step included: on CUDA the allocator's peak over the timed steps (reset after
warm-up); on a CPU the tracked tensor memory over the warm-up steps (tracking is too slow to time).
Quality: the same validation sequences for every cell, evaluated in FP32 with the explicit kernel
(the technique's window kept), so precision and kernel do not change how quality is measured.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time

import torch

from memopt.attention import kernel_detail, math_attention, resolve_kernel
from memopt.config import config_hash, technique_spec
from memopt.data import Batches, TokenData, eval_sequences
from memopt.measure import (
    MIB,
    MemoryProbe,
    StepTimer,
    TensorMemoryTracker,
    device_name,
    flops_per_token,
    is_oom,
    peak_bf16_flops,
    provenance,
    summarize,
)
from memopt.model import SelfAttention
from memopt.techniques import Applied, apply_technique, eval_model, set_precision_flags


def budget_bytes(cfg: dict, device: str) -> float | None:
    """The memory budget in bytes for this device (None: the whole GPU)."""
    gib = cfg["search"]["cpu_memory_budget_gib" if device == "cpu" else "memory_budget_gib"]
    return None if gib is None else gib * 2**30


def limit_gpu_memory(cfg: dict, device: str) -> None:
    """Emulate a smaller card: cap this process's share of the GPU at the configured budget."""
    budget = budget_bytes(cfg, device)
    if device == "cuda" and budget is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))


def make_optimizer(model: torch.nn.Module, train_cfg: dict, device: str):
    # Weight decay on matrices only (not on biases, LayerNorm or position tables' 1-D params).
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": train_cfg["weight_decay"]},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=train_cfg["lr"], betas=(0.9, 0.95), fused=device == "cuda")


def lr_at(step: int, train_cfg: dict) -> float:
    warm = train_cfg["warmup_steps"]
    return train_cfg["lr"] * (min(1.0, (step + 1) / warm) if warm else 1.0)


def train_step(
    applied: Applied, opt, x, y, step: int, train_cfg: dict, mark=lambda phase: None
) -> torch.Tensor:
    """One full step: forward, backward, clipping, optimizer. `mark(phase)` is called after each
    phase (for phase memory); it must not synchronize."""
    for group in opt.param_groups:
        group["lr"] = lr_at(step, train_cfg)
    with applied.autocast:
        loss = applied.model(x, y)
    mark("forward")
    loss.backward()
    mark("backward")
    if train_cfg["grad_clip"]:
        torch.nn.utils.clip_grad_norm_(applied.model.parameters(), train_cfg["grad_clip"])
    opt.step()
    mark("optimizer")
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def measured_step(applied: Applied, opt, x, y, step: int, cfg: dict, probe: MemoryProbe):
    """A training step that also reads memory after each phase, each phase's peak, and a
    breakdown into weights, gradients, optimizer state and activations."""
    phases = {"before_step_mib": probe.now() / MIB}
    probe.reset_peak()
    grads = []

    def mark(phase):
        phases[f"after_{phase}_mib"] = probe.now() / MIB
        phases[f"peak_{phase}_mib"] = probe.peak() / MIB
        probe.reset_peak()
        if phase == "backward":
            grads.append(_tensor_bytes(p.grad for p in applied.model.parameters()))

    loss = train_step(applied, opt, x, y, step, cfg["train"], mark)
    params = list(applied.model.parameters())
    logit_bytes = 2 if applied.record["precision"] == "bf16" else 4
    breakdown = {
        "weights_mib": _tensor_bytes(params) / MIB,
        "gradients_mib": grads[0] / MIB,
        "optimizer_state_mib": _tensor_bytes(
            t for state in opt.state.values() for t in state.values()
        )
        / MIB,
        "activations_mib": phases["after_forward_mib"] - phases["before_step_mib"],
        "logits_mib": x.numel() * eval_model(applied).cfg.vocab_size * logit_bytes / MIB,
    }
    return loss, phases, breakdown


@contextlib.contextmanager
def _explicit_fp32(model: torch.nn.Module):
    """Evaluate every technique the same way: FP32, TF32 off, the explicit kernel."""
    attn = [m for m in model.modules() if isinstance(m, SelfAttention)]
    saved = [m.attend for m in attn]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    set_precision_flags("fp32")
    try:
        for m in attn:
            m.attend = math_attention
        yield
    finally:
        for m, f in zip(attn, saved):
            m.attend = f
        torch.backends.cuda.matmul.allow_tf32 = tf32


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, sequences: torch.Tensor, batch_size: int, device: str
) -> float:
    model.eval()
    total, count = 0.0, 0
    with _explicit_fp32(model):
        for chunk in sequences.split(batch_size):
            chunk = chunk.to(device)
            loss = model(chunk[:, :-1], chunk[:, 1:])
            total += loss.item() * chunk.size(0)
            count += chunk.size(0)
    model.train()
    return total / count


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _train(cfg, spec, data: TokenData, batch_size: int, device: str, snapshot=None) -> dict:
    train_cfg, seq_len = cfg["train"], cfg["model"]["seq_len"]
    steps, warmup = train_cfg["steps"], cfg["measure"]["warmup_steps"]
    applied = apply_technique(spec, cfg["model"], data.vocab_size, train_cfg["seed"], device)
    applied.model.train()
    torch.manual_seed(train_cfg["seed"])  # the same dropout masks in every cell of this batch size
    opt = make_optimizer(applied.model, train_cfg, device)
    batches = Batches(data.train, seq_len, batch_size, train_cfg["seed"], device)
    losses, timer = [], StepTimer(device)
    tracker = (
        TensorMemoryTracker(budget_bytes(cfg, device), existing=list(applied.model.parameters()))
        if device == "cpu"
        else contextlib.nullcontext()
    )
    probe = MemoryProbe(device, tracker if device == "cpu" else None)
    wall0 = time.perf_counter()
    with tracker:
        for step in range(warmup - 1):
            x, y = batches.next()
            losses.append(train_step(applied, opt, x, y, step, train_cfg))
        # The last warm-up step (the optimizer state exists by now) is measured phase by phase.
        cpu_peak = probe.peak()
        x, y = batches.next()
        with _memory_history(snapshot):
            loss, phases, breakdown = measured_step(applied, opt, x, y, warmup - 1, cfg, probe)
        losses.append(loss)
        cpu_peak = max([cpu_peak] + [v * MIB for k, v in phases.items() if k.startswith("peak_")])
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    # A full garbage collection over compile's large heaps can stall the host long enough to
    # starve the GPU; collect once and freeze what exists, so timed steps see no such pause.
    gc.collect()
    gc.freeze()
    try:
        for step in range(warmup, steps):
            x, y = batches.next()
            timer.start()
            losses.append(train_step(applied, opt, x, y, step, train_cfg))
            timer.stop()
        times = timer.times_ms()  # synchronizes on CUDA
    finally:
        gc.unfreeze()
    wall_s = time.perf_counter() - wall0
    if device == "cuda":
        peak_alloc = torch.cuda.max_memory_allocated() / MIB
        peak_reserved = torch.cuda.max_memory_reserved() / MIB
    else:
        peak_alloc, peak_reserved = cpu_peak / MIB, None
    del opt
    seqs = eval_sequences(data.val, seq_len, train_cfg["eval_sequences"])
    val_loss = evaluate(eval_model(applied), seqs, train_cfg["eval_batch_size"], device)
    loss_curve = torch.stack(losses).float().tolist()
    stats = summarize(times)
    tokens_per_step = batch_size * seq_len
    tokens_per_s = tokens_per_step / (stats["mean"] / 1e3)
    flops = flops_per_token(cfg["model"], data.vocab_size, spec["window"]) * tokens_per_s
    peak_flops = peak_bf16_flops(device_name(device)) if device == "cuda" else None
    return {
        "status": "ok",
        "kernel": applied.kernel,
        "kernel_detail": kernel_detail(applied.kernel),
        "precision_flags": applied.record,
        "steps": steps,
        "warmup_steps": warmup,
        "timed_steps": len(times),
        "step_time_ms": stats,
        "step_times_ms": times,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_s,
        "model_tflops": flops / 1e12,
        "mfu": flops / peak_flops if peak_flops else None,
        "peak_bf16_tflops": peak_flops / 1e12 if peak_flops else None,
        "wall_s": wall_s,
        "peak_allocated_mib": peak_alloc,
        "peak_reserved_mib": peak_reserved,
        "phase_memory": phases,
        "memory_breakdown": breakdown,
        "val_loss": val_loss,
        "val_ppl": math.exp(min(val_loss, 50.0)),
        "final_train_loss": loss_curve[-1],
        "loss_curve": loss_curve,
        "error": None,
    }


@contextlib.contextmanager
def _memory_history(path):
    """Record a CUDA memory snapshot of one step, for https://pytorch.org/memory_viz."""
    if path is None or not torch.cuda.is_available():
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        yield
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


# What an out-of-memory cell reports as null (it never got to measure them).
MEASURED = (
    "kernel_detail steps warmup_steps timed_steps step_time_ms step_times_ms tokens_per_step "
    "tokens_per_s model_tflops mfu peak_bf16_tflops wall_s peak_allocated_mib peak_reserved_mib "
    "phase_memory memory_breakdown val_loss val_ppl final_train_loss"
).split()


def run_cell(
    cfg: dict,
    technique: str,
    batch_entry: str,
    batch_size: int,
    data: TokenData,
    device: str,
    snapshot=None,
) -> dict:
    """Train one cell and return its result dict; out of memory is a result (status `oom`).
    With `snapshot` (a path), a CUDA memory snapshot of one training step is written there."""
    spec = technique_spec(cfg, technique)
    limit_gpu_memory(cfg, device)
    result = {
        "technique": technique,
        "batch_entry": str(batch_entry),
        "batch_size": batch_size,
        "spec": spec,
        "device": device,
        "device_name": device_name(device),
        "seq_len": cfg["model"]["seq_len"],
        "kernel": resolve_kernel(spec["attention"], spec["window"], device, spec["precision"]),
    }
    oom_message = None
    if batch_size < 1:
        oom_message = f"no batch fits ({batch_entry} resolved to {batch_size})"
    else:
        try:
            result.update(_train(cfg, spec, data, batch_size, device, snapshot))
        except Exception as err:
            if not is_oom(err):
                raise
            oom_message = str(err).splitlines()[0][:500]
    if oom_message is not None:
        result.update(dict.fromkeys(MEASURED), status="oom", error=oom_message, loss_curve=[])
    free_memory(device)
    result["allocator"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") if device == "cuda" else None
    result["provenance"] = provenance(device) | {
        "config_hash": config_hash(
            {k: cfg[k] for k in ("model", "train", "measure", "search")} | {"technique": spec}
        )
    }
    return result
