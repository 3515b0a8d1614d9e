"""Timing cells: train a technique at one batch size, time it, measure its memory.

Protocol: `measure.warmup_steps` steps first (compilation, autotuning, allocator and
optimizer-state warm-up; excluded), the last of them measured phase by phase (memory after each
phase and a breakdown). Then timed steps, each on its own, until the 95% confidence half-width of
the mean step time is within `measure.target_rel_ci` of the mean (between `min_timed_steps` and
`max_timed_steps`, or until `max_timed_s` seconds of timed steps). Peak memory covers whole
steps, optimizer step included: on CUDA the allocator's peak over the timed steps (reset after warm-up) and its retry/OOM counters over them;
on a CPU the tracked tensor memory over the warm-up steps (tracking is too slow to time).
Quality is not measured here: see memopt.quality (one run per function, several seeds).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time

import torch

from memopt import parallel
from memopt.attention import kernel_detail, resolve_kernel
from memopt.config import config_hash, technique_spec
from memopt.data import Batches, TokenData
from memopt.divergence import Diverged, LossWatch
from memopt.flops import flops_per_token
from memopt.functions import function_of
from memopt.measure import (
    MIB,
    MemoryProbe,
    StepTimer,
    TensorMemoryTracker,
    allocator_counters,
    counter_delta,
    device_name,
    enough_timed_steps,
    is_oom,
    peak_bf16_flops,
    provenance,
    summarize,
)
from memopt.offload import OffloadedBytes, empty_host_cache, offload_context
from memopt.optimizers import make_optimizer, state_bytes, tensor_bytes
from memopt.techniques import (
    Applied,
    apply_technique,
    compile_cache_counts,
    dynamic_batch,
    eval_model,
)


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


def technique_optimizer(applied: Applied, spec: dict, train_cfg: dict, device: str):
    """The technique's optimizer (memopt.optimizers) over the applied model."""
    return make_optimizer(
        applied.model,
        train_cfg,
        device,
        spec["optimizer"],
        spec["optimizer_in_backward"],
        spec["shard"],
    )


def lr_at(step: int, train_cfg: dict) -> float:
    warm = train_cfg["warmup_steps"]
    return train_cfg["lr"] * (min(1.0, (step + 1) / warm) if warm else 1.0)


def train_step(
    applied: Applied, opt, x, y, step: int, train_cfg: dict, mark=lambda phase: None
) -> torch.Tensor:
    """One optimizer step over the sequences `x`, `y`: forward and backward in
    `applied.grad_accum` micro-batches (each loss weighted by its share of the sequences, so the
    gradient is that of the whole batch), clipping, optimizer. Under FP16 the loss is scaled and
    the gradients unscaled before clipping (memopt.precision). `mark(phase)` is called after each
    phase (for phase memory: with micro-batches, `forward` is the first one's forward pass and
    `backward` all that follows it); it must not synchronize. Returns the batch's mean loss."""
    for group in opt.param_groups:
        lr = lr_at(step, train_cfg) * group.get("lr_scale", 1.0)
        if isinstance(group["lr"], torch.Tensor):  # torchao's low-bit AdamW keeps it a tensor
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
    scaler, k = applied.scaler, applied.grad_accum
    total = None
    for i, (xi, yi) in enumerate(zip(x.tensor_split(k), y.tensor_split(k))):
        if applied.record["compile"]:
            dynamic_batch(xi, yi)
        applied.offloaded = OffloadedBytes() if applied.offload != "none" else None
        offload = offload_context(applied.offload, applied.offloaded, applied.model.parameters())
        with applied.autocast, offload:
            loss = applied.model(xi, yi)
        if i == 0:
            mark("forward")
        if k > 1:
            loss = loss * (xi.size(0) / x.size(0))
        (scaler.scale(loss) if scaler is not None else loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    mark("backward")
    if train_cfg["grad_clip"]:
        if scaler is not None:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(applied.model.parameters(), train_cfg["grad_clip"])
    if scaler is not None:
        scaler.step(opt)  # skipped when the gradients overflowed
        scaler.update()
    else:
        opt.step()
    mark("optimizer")
    opt.zero_grad(set_to_none=True)
    return total


def _tensor_bytes(tensors) -> int:
    return sum(tensor_bytes(t) for t in tensors if isinstance(t, torch.Tensor))


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

    output = {}
    # Under compile the hooks would run inside the graph: not measured there.
    hooks = [] if applied.record["compile"] else _output_hooks(eval_model(applied), probe, output)
    try:
        loss = train_step(applied, opt, x, y, step, cfg["train"], mark)
    finally:
        for hook in hooks:
            hook.remove()
    params = list(applied.model.parameters())
    measured = len(output) == 2
    breakdown = {
        "weights_mib": _tensor_bytes(params) / MIB,
        "gradients_mib": grads[0] / MIB,
        "optimizer_state_mib": state_bytes(opt) / MIB,
        "activations_mib": phases["after_forward_mib"] - phases["before_step_mib"],
        # In pinned host memory instead (offload: activations), for one micro-batch.
        "offloaded_mib": applied.offloaded.bytes / MIB if applied.offloaded else 0.0,
        # The output layer (final LayerNorm, logits, loss), measured: what its forward pass
        # keeps for the backward pass, and what its backward pass needs on top (the logits'
        # gradient), for the first micro-batch.
        "logits_mib": phases["after_forward_mib"] - output["before"] / MIB if measured else None,
        "logits_grad_mib": output["peak"] / MIB - phases["after_forward_mib"] if measured else None,
    }
    return loss, phases, breakdown


def _output_hooks(model, probe: MemoryProbe, out: dict) -> list:
    """Hooks on the final LayerNorm: allocated memory when the output layer's forward pass
    starts, and the peak from the end of the forward pass until the output layer's backward pass
    has ended (measured_step resets the peak after the forward pass). The first micro-batch's."""

    def before(module, args):
        out.setdefault("before", probe.now())

    def after_backward(module, grad_input, grad_output):
        out.setdefault("peak", probe.peak())

    return [
        model.ln_f.register_forward_pre_hook(before),
        model.ln_f.register_full_backward_hook(after_backward),
    ]


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        empty_host_cache()  # pinned buffers of offloaded activations


def prepare(cfg: dict, spec: dict, data: TokenData, batch_size: int, device: str, seed: int):
    """The technique applied to a freshly initialized model, its optimizer and its batches, all
    from `seed`: the same weights, batches and dropout masks for every technique. `batch_size`
    is the sequences of one optimizer step (a technique with grad_accum k splits them in k; one
    with several GPUs trains its rank's slice of them: memopt.parallel)."""
    applied = apply_technique(spec, cfg["model"], data.vocab_size, seed, device)
    applied.model.train()
    # Dropout masks; each rank of a parallel technique draws its own (its slice's).
    torch.manual_seed(seed + 1_000_003 * parallel.rank())
    opt = technique_optimizer(applied, spec, cfg["train"], device)
    part = (parallel.rank(), parallel.world())
    batches = Batches(data.train, cfg["model"]["seq_len"], batch_size, seed, device, part)
    return applied, opt, batches


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
    flops = flops_per_token(cfg["model"], data.vocab_size, spec["window"]) * tokens_per_s
    # No MFU for FP8: its peak would be a mix of FP8 and BF16 peaks (memopt.precision).
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
    so is a non-finite loss (status `diverged`, memopt.divergence).
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
    # What a cell that did not finish records instead of measurements (the exception itself is
    # not kept: its traceback would keep the model and optimizer alive past free_memory).
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
    else:
        t0 = time.perf_counter()
        try:
            result.update(_train(cfg, spec, data, batch_size, device, snapshot))
        except Diverged as err:
            failed = {"status": "diverged", "diverged_step": err.step, "error": str(err),
                      "loss_curve": err.curve}  # fmt: skip
        except Exception as err:
            if not is_oom(err):
                raise
            parallel.out_of_memory(err, batch_size, time.perf_counter() - t0)
            failed = {"status": "oom", "error": str(err).splitlines()[0][:500]}
    if failed is not None:
        result.update(dict.fromkeys(MEASURED) | {"loss_curve": []} | failed)
    free_memory(device)
    result["allocator"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") if device == "cuda" else None
    result["provenance"] = provenance(device) | {
        "config_hash": config_hash(
            {k: cfg[k] for k in ("model", "train", "measure", "search")} | {"technique": spec}
        )
    }
    return result
