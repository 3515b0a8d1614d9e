"""Timing cells: train a technique at one batch size, time it, measure its memory.

Protocol: `measure.warmup_steps` steps first (compilation, autotuning, allocator and
optimizer-state warm-up; excluded), the last of them measured phase by phase (memory after each
phase and a breakdown). Then timed steps, each on its own, until the 95% confidence half-width of
the mean step time is within `measure.target_rel_ci` of the mean (between `min_timed_steps` and
`max_timed_steps`, or until `max_timed_s` seconds of timed steps). Peak memory covers whole
steps, optimizer step included: on CUDA the allocator's peak over the timed steps (reset after warm-up) and its retry/OOM counters over them;
on a CPU the tracked tensor memory over the warm-up steps (tracking is too slow to time).
Quality is not measured here: see memopt.jobs.quality (one run per function, several seeds).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from functools import partial

import torch

from memopt.config import technique_spec
from memopt.data.tokens import TokenData
from memopt.jobs.outcome import failure, guarded, stamp
from memopt.runtime import parallel
from memopt.runtime.attention import kernel_detail, resolve_kernel
from memopt.runtime.blocks import technique_model
from memopt.runtime.divergence import LossWatch
from memopt.runtime.flops import flops_per_token
from memopt.runtime.functions import function_of
from memopt.runtime.measure import (
    MIB,
    MemoryProbe,
    StepTimer,
    TensorMemoryTracker,
    allocator_counters,
    counter_delta,
    device_name,
    enough_timed_steps,
    peak_bf16_flops,
    summarize,
)
from memopt.runtime.step import (
    budget_bytes,
    free_memory,
    limit_gpu_memory,
    measured_step,
    prepare,
    train_step,
)
from memopt.runtime.techniques import compile_cache_counts


def _train(cfg, spec, data: TokenData, batch_size: int, device: str, snapshot=None) -> dict:
    train_cfg, measure_cfg = cfg["train"], cfg["measure"]
    warmup = measure_cfg["warmup_steps"]
    # The batch is one GPU's micro-batch: a step trains k of them on each of the job's GPUs.
    k, gpus = spec["grad_accum"], parallel.world()
    applied, opt, batches = prepare(
        cfg, spec, data, batch_size * k * gpus, device, train_cfg["seed"]
    )
    losses, timer, watch = [], StepTimer(device), LossWatch()
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
    watch.check(losses)  # the warm-up's losses, the device being idle here anyway
    warmup_s = time.perf_counter() - wall0
    counters_before = allocator_counters(device)
    # A full garbage collection over compile's large heaps can stall the host long enough to
    # starve the GPU; collect once and freeze what exists, so timed steps see no such pause.
    gc.collect()
    gc.freeze()
    try:
        step, times, enough = warmup, [], False
        while not enough:
            x, y = batches.next()
            timer.start()
            losses.append(train_step(applied, opt, x, y, step, train_cfg))
            timer.stop()
            step += 1
            # The rule is checked once enough steps exist; reading their times waits for the
            # last one to finish (the next step's start event is recorded after that).
            n = step - warmup
            if n >= measure_cfg["min_timed_steps"]:
                times = timer.first_ms(n)
                watch.check(losses)  # the steps are done: reading their losses costs no wait
                # Rank 0's verdict on every rank: the ranks must run the same steps.
                enough = parallel.agree(enough_timed_steps(times, measure_cfg))
        times = timer.times_ms()  # synchronizes on CUDA
    finally:
        gc.unfreeze()
    allocator = counter_delta(counters_before, allocator_counters(device))
    wall_s = time.perf_counter() - wall0
    if device == "cuda":
        peak_alloc = torch.cuda.max_memory_allocated() / MIB
        peak_reserved = torch.cuda.max_memory_reserved() / MIB
    else:
        peak_alloc, peak_reserved = cpu_peak / MIB, None
    del opt
    loss_curve = parallel.mean_over_ranks(torch.stack(losses).float()).tolist()
    stats = summarize(times)
    tokens_per_step = batch_size * k * gpus * cfg["model"]["seq_len"]
    tokens_per_s = tokens_per_step / (stats["mean"] / 1e3)
    model = technique_model(cfg["model"], spec)
    flops = flops_per_token(model, data.vocab_size, spec["window"]) * tokens_per_s
    # No MFU for FP8: its peak would be a mix of FP8 and BF16 peaks (memopt.runtime.precision).
    fp8 = spec["precision"] == "fp8"
    peak_flops = peak_bf16_flops(device_name(device)) if device == "cuda" and not fp8 else None
    if peak_flops:
        peak_flops *= gpus  # MFU: of all the job's GPUs
    return parallel.per_rank(
        {
            "status": "ok",
            "kernel": applied.kernel,
            "kernel_detail": kernel_detail(applied.kernel),
            "precision_flags": applied.record,
            "steps": step,
            "warmup_steps": warmup,
            "timed_steps": len(times),
            "step_time_ms": stats,
            "step_times_ms": times,
            "timed_s": sum(times) / 1e3,
            "warmup_s": warmup_s,  # compilation included
            "compile_cache": compile_cache_counts() if spec["compile"] else None,
            "allocator_events": allocator,
            "tokens_per_step": tokens_per_step,
            "tokens_per_s": tokens_per_s,
            "model_tflops": flops / 1e12,
            "mfu": flops / peak_flops if peak_flops else None,
            "peak_bf16_tflops": peak_flops / 1e12 / gpus if peak_flops else None,  # one GPU's
            "wall_s": wall_s,
            "peak_allocated_mib": peak_alloc,
            "peak_reserved_mib": peak_reserved,
            "phase_memory": phases,
            "memory_breakdown": breakdown,
            "loss_curve": loss_curve,
            "error": None,
        },
        device,
    )


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
    "kernel_detail steps warmup_steps timed_steps step_time_ms step_times_ms timed_s warmup_s "
    "allocator_events tokens_per_step tokens_per_s model_tflops mfu peak_bf16_tflops wall_s "
    "peak_allocated_mib peak_reserved_mib phase_memory memory_breakdown"
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
    """Train one cell and return its result dict; out of memory is a result (status `oom`), and
    so is a non-finite loss (status `diverged`, memopt.runtime.divergence).
    With `snapshot` (a path), a CUDA memory snapshot of one training step is written there."""
    spec = technique_spec(cfg, technique)
    limit_gpu_memory(cfg, device)
    result = {
        "technique": technique,
        "batch_entry": str(batch_entry),
        "batch_size": batch_size,
        # The batch entry is one GPU's micro-batch; an optimizer step trains grad_accum of them
        # on each of the technique's GPUs.
        "effective_batch": batch_size * spec["grad_accum"] * spec["gpus"],
        "gpus": spec["gpus"],
        "spec": spec,
        "function": function_of(spec),
        "device": device,
        "device_name": device_name(device),
        "seq_len": cfg["model"]["seq_len"],
        "kernel": resolve_kernel(spec["attention"], spec["window"], device, spec["precision"]),
    }
    # A cell that cannot start records why instead of measurements.
    failed, earlier = None, parallel.previous_oom()
    if batch_size < 1:
        failed = {
            "status": "oom",
            "error": f"no batch fits ({batch_entry} resolved to {batch_size})",
        }
    elif earlier is not None:  # a rank of this parallel job's last launch ran out of memory
        failed = {
            "status": "oom",
            "error": f"rank {earlier['rank']}: " + earlier["error"].splitlines()[0],
        }
    if failed is not None:
        result.update(failure(failed, MEASURED))
        free_memory(device)
    else:
        work = partial(_train, cfg, spec, data, batch_size, device, snapshot)
        result.update(guarded(work, device, batch_size, MEASURED))
    result["allocator"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") if device == "cuda" else None
    keys = ("model", "train", "measure", "search")
    return stamp(result, cfg, spec, device, keys)
