"""The training step and what every job builds around it: the technique applied to a freshly
initialized model with its optimizer and batches (`prepare`), one optimizer step (`train_step`), the
same step read phase by phase for memory (`measured_step`), the memory budget, and freeing memory
between jobs. The jobs that drive it (search, cell, quality) are in memopt.jobs.
"""

from __future__ import annotations

import gc

import torch

from memopt.data.tokens import Batches, TokenData
from memopt.runtime import parallel
from memopt.runtime.measure import (
    MIB,
    MemoryProbe,
)
from memopt.runtime.offload import (
    OffloadedBytes,
    empty_host_cache,
    offload_context,
    set_host_budget,
)
from memopt.runtime.optimizers import make_optimizer, state_bytes, tensor_bytes
from memopt.runtime.techniques import (
    Applied,
    apply_technique,
    dynamic_batch,
    eval_model,
    forget_cuda_graphs,
)


def budget_bytes(cfg: dict, device: str) -> float | None:
    """The memory budget in bytes for this device (None: the whole GPU)."""
    gib = cfg["search"]["cpu_memory_budget_gib" if device == "cpu" else "memory_budget_gib"]
    return None if gib is None else gib * 2**30


def limit_gpu_memory(cfg: dict, device: str) -> None:
    """Emulate a smaller card: cap this process's share of the GPU at the configured budget; and
    the host's pinned memory for offloading at search.host_pinned_gib."""
    set_host_budget(cfg["search"]["host_pinned_gib"])
    budget = budget_bytes(cfg, device)
    if device == "cuda" and budget is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))


def technique_optimizer(applied: Applied, spec: dict, train_cfg: dict, device: str):
    """The technique's optimizer (memopt.runtime.optimizers) over the applied model."""
    return make_optimizer(
        applied.model,
        train_cfg,
        device,
        spec["optimizer"],
        spec["optimizer_in_backward"],
        spec["shard"],
        spec.get("lr_scale", 1.0),
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
    the gradients unscaled before clipping (memopt.runtime.precision). `mark(phase)` is called after each
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
        # A copy: under CUDA graphs (compile_mode reduce-overhead) the output is overwritten by
        # the next replay, and the caller keeps every step's loss.
        total = loss.detach().clone() if total is None else total + loss.detach()
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


def free_memory(device: str, host_cache: bool = True) -> None:
    """Everything a job or trial left behind given back; `host_cache` False keeps the cached
    pinned buffers of offloaded activations for the next trial of a search (pinning tens of GiB
    again takes seconds per trial; the search gives them back when it ends)."""
    gc.collect()
    if device == "cuda":
        forget_cuda_graphs()  # their memory pools (compile_mode reduce-overhead)
        torch.cuda.empty_cache()
        if host_cache:
            empty_host_cache()  # pinned buffers of offloaded activations


def prepare(cfg: dict, spec: dict, data: TokenData, batch_size: int, device: str, seed: int):
    """The technique applied to a freshly initialized model, its optimizer and its batches, all
    from `seed`: the same weights, batches and dropout masks for every technique. `batch_size`
    is the sequences of one optimizer step (a technique with grad_accum k splits them in k; one
    with several GPUs trains its rank's slice of them: memopt.runtime.parallel)."""
    applied = apply_technique(spec, cfg["model"], data.vocab_size, seed, device)
    applied.model.train()
    # Dropout masks; each rank of a parallel technique draws its own (its slice's).
    torch.manual_seed(seed + 1_000_003 * parallel.rank())
    opt = technique_optimizer(applied, spec, cfg["train"], device)
    part = (parallel.rank(), parallel.world())
    batches = Batches(data.train, cfg["model"]["seq_len"], batch_size, seed, device, part)
    return applied, opt, batches
