"""The knobs a technique is made of: one entry per knob, the one home of its facts.

A technique in the config is a mapping of these knobs (`techniques.<name>`). Each entry holds the
knob's name, the mechanism it belongs to (`group`), its one-line doc, the JSON Schema of its value,
its default, and whether it changes the function the technique computes (`function`: precision,
window and optimizer do; every other knob changes how the function is computed, speed and memory,
which the exactness runs check). The config schema's technique part is generated from these
entries (memopt.config.load_schema), so a knob's type, values and default are written once.

Torch-free: the Snakefile and config validation import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    group: str  # the mechanism: precision, attention, checkpointing, loss, optimizer, ...
    doc: str
    value: dict  # JSON Schema of the value: enum, or type with its range
    default: object = None
    function: bool = False  # changes the function computed (quality is measured per function)
    # Every cell's spec holds it: one of the first six knobs. A cell written before a later knob
    # existed lacks it and ran at its default (memopt.report.results reads it so).
    required: bool = False

    def schema(self) -> dict:
        return {"description": self.doc, **self.value, "default": self.default}


KNOBS: tuple[Knob, ...] = (
    Knob(
        "precision",
        "precision",
        (
            "fp32 (TF32 off), tf32 (TF32 matmuls), bf16 (autocast, FP32 master weights), fp16 "
            "(autocast, FP32 master weights, dynamic loss scaling), fp8 (BF16 autocast, the blocks' "
            "linear layers in FP8 through torchao's float8 training; a GPU with FP8 tensor cores, "
            "compute capability >= 8.9; no MFU is reported)."
        ),
        {"enum": ["fp32", "tf32", "bf16", "fp16", "fp8"]},
        default="fp32",
        function=True,
        required=True,
    ),
    Knob(
        "attention",
        "attention",
        (
            "math: explicit QK^T/softmax/V with the N x N matrix materialized; flash: PyTorch's flash "
            "SDPA backend, forced (16-bit on CUDA); efficient: PyTorch's memory-efficient SDPA "
            "backend, forced; cudnn: PyTorch's cuDNN SDPA backend, forced; flex: FlexAttention (CUDA, "
            "compiled); flash_attn: the flash-attn package (FA2 flash_attn_func, or FA3/FA4 through "
            "PyTorch's registry); auto: the fastest exact kernel for the device and precision, "
            "resolved and recorded."
        ),
        {"enum": ["math", "flash", "efficient", "cudnn", "flex", "flash_attn", "auto"]},
        default="math",
        required=True,
    ),
    Knob(
        "window",
        "attention",
        "Sliding-window attention, W keys per query including itself; null = full causal.",
        {"type": ["integer", "null"], "minimum": 1},
        default=None,
        function=True,
        required=True,
    ),
    Knob(
        "checkpointing",
        "checkpointing",
        (
            "Activation checkpointing: none, full (every block), every_k (every k-th block), "
            "selective (every block, but matmul and attention outputs are saved; only the cheap ops "
            "are recomputed)."
        ),
        {"enum": ["none", "full", "every_k", "selective"]},
        default="none",
        required=True,
    ),
    Knob(
        "checkpoint_every",
        "checkpointing",
        "k for checkpointing every_k.",
        {"type": "integer", "minimum": 1},
        default=2,
        required=True,
    ),
    Knob(
        "compile",
        "compile",
        "Wrap the model in torch.compile.",
        {"type": "boolean"},
        default=False,
        required=True,
    ),
    Knob(
        "loss",
        "loss",
        (
            "The output layer and cross-entropy. standard: the (tokens x vocab) logits computed whole "
            "and kept for the backward pass; chunked: plain PyTorch, loss_chunk rows at a time, each "
            "chunk's logits recomputed in the backward pass (exact; at most one chunk's logits exist "
            "at a time); liger: liger-kernel's fused linear cross-entropy (extra [liger], CUDA); cce: "
            "cut cross-entropy (extra [cce], CUDA)."
        ),
        {"enum": ["standard", "chunked", "liger", "cce"]},
        default="standard",
    ),
    Knob(
        "loss_chunk",
        "loss",
        "Rows (tokens) per chunk for loss: chunked.",
        {"type": "integer", "minimum": 1},
        default=4096,
    ),
    Knob(
        "optimizer",
        "optimizer",
        (
            "adamw: torch AdamW, betas (0.9, 0.95), fused on CUDA; adamw8bit / adamw4bit: torchao's "
            "low-bit AdamW (torchao, a dependency); adafactor: torch Adafactor (factored second "
            "moment); sgd: SGD with momentum 0.9. All but adamw change the arithmetic: a function of "
            "their own."
        ),
        {"enum": ["adamw", "adamw8bit", "adamw4bit", "adafactor", "sgd"]},
        default="adamw",
        function=True,
    ),
    Knob(
        "optimizer_in_backward",
        "optimizer",
        (
            "Update each parameter in its post-accumulate-grad hook and free its gradient at once, so "
            "the whole model's gradients never coexist. Needs train.grad_clip 0 (global clipping "
            "needs every gradient at once), grad_accum 1 and a precision other than fp16 (loss "
            "scaling unscales and checks every gradient before any update)."
        ),
        {"type": "boolean"},
        default=False,
    ),
    Knob(
        "offload",
        "offload",
        (
            "none, or activations: the tensors saved for the backward pass (parameters excepted) go "
            "to pinned host memory and come back when needed; with checkpointing only the checkpoints "
            "do. Needs a GPU."
        ),
        {"enum": ["none", "activations"]},
        default="none",
    ),
    Knob(
        "compile_memory_budget",
        "compile",
        (
            "torch.compile's activation memory budget, 0.0-1.0: the share of the activations the "
            "compiled graph may keep (min-cut recomputation of the rest); null = torch's default "
            "(1.0). Needs compile true."
        ),
        {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        default=None,
    ),
    Knob(
        "grad_accum",
        "accumulation",
        (
            "Micro-batches per optimizer step: the technique's batch entries are micro-batches, a "
            "step trains grad_accum of them (the effective batch), and throughput counts all of them."
        ),
        {"type": "integer", "minimum": 1, "maximum": 1024},
        default=1,
    ),
    Knob(
        "parallel",
        "parallel",
        (
            "none: one GPU; ddp: data parallel over `gpus` GPUs (DistributedDataParallel, gradients "
            "all-reduced); fsdp2: sharded data parallel (torch.distributed.fsdp.fully_shard per block "
            "and at the root). Run by torchrun on the GPUs the job leased; a batch entry is per GPU, "
            "a step trains gpus x batch sequences. The same function as one GPU (the global batch is "
            "split across ranks)."
        ),
        {"enum": ["none", "ddp", "fsdp2"]},
        default="none",
    ),
    Knob(
        "shard",
        "parallel",
        (
            "What is split across the GPUs (ZeRO stages). none: nothing (ddp); optimizer: the "
            "optimizer state (ZeRO-1: ddp with torch's ZeroRedundancyOptimizer); grads: gradients and "
            "optimizer state, the weights gathered once per step and kept through the backward pass "
            "(ZeRO-2: fsdp2, reshard_after_forward false); full: weights too, gathered per block in "
            "the forward and again in the backward pass (ZeRO-3: fsdp2, reshard_after_forward true)."
        ),
        {"enum": ["none", "optimizer", "grads", "full"]},
        default="none",
    ),
    Knob(
        "gpus",
        "parallel",
        (
            "GPUs one training job of this technique uses (1 unless parallel is ddp or fsdp2; then at "
            "least 2). Snakemake's --resources gpu=N counts them."
        ),
        {"type": "integer", "minimum": 1, "maximum": 64},
        default=1,
    ),
)
BY_NAME = {k.name: k for k in KNOBS}


def schema_properties() -> dict:
    """The JSON Schema of a technique's knobs, in this order (the config schema's technique part)."""
    return {k.name: k.schema() for k in KNOBS}


def defaults() -> dict:
    """Every knob at its default: a technique that sets nothing."""
    return {k.name: k.default for k in KNOBS}


def function_knobs() -> tuple[str, ...]:
    """The knobs that define the function a technique computes."""
    return tuple(k.name for k in KNOBS if k.function)
