"""The knobs a technique is made of: one entry per knob, the one home of its facts.

A technique in the config is a mapping of these knobs (`techniques.<name>`). Each entry holds:
- what it is: name, the mechanism it belongs to (`group`: the table of single-knob changes
  compares techniques that differ in one group), one-line doc, JSON Schema of its value, default;
- what it means: whether it changes the function the technique computes (`function`: precision,
  window and optimizer do; every other knob changes how the function is computed, speed and
  memory, which the exactness runs check);
- what it needs: values that need a CUDA GPU (`gpu_only`), other knobs' values it needs when not
  at its default (`needs`), the value a data-parallel technique must keep (`parallel`);
- how it is named: `describe` (its value in a change, "bf16 → fp8"), `label` (its value in the
  technique table's `other` column, for knobs without a column of their own);
- how its process-wide effect is undone before the next job in the same process (`undo`: a
  "module:function" the worker calls).
The config schema's technique part, the cross-key rules for devices, needs and parallel modes, the
results' columns and knob groups, the paper's labels and the worker's restore read these entries;
what a knob *does* to the model and the step lives in its module under memopt.runtime.

Torch-free: the Snakefile and config validation import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


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
    gpu_only: dict = field(default_factory=dict)  # value -> why a CPU cannot run it, what it can
    needs: dict = field(default_factory=dict)  # when not at its default: knob -> value it needs
    parallel: tuple | None = None  # (the value a ddp/fsdp2 technique must keep, why)
    # Its value in a change ("A → B"), from a summary row; None: not named. Default: the value.
    describe: Callable[[dict], str | None] | None = None
    # The technique table shows it in a column (or in another knob's); else in `other`, by label.
    column: bool = False
    # Its phrase in `other` where it is not at its default. Default: "<name> <value>".
    label: Callable[[dict], str | None] | None = None
    # Named in a change only through its group's first knob (k for every_k, the chunk size...).
    subordinate: bool = False
    undo: str | None = None  # "module:function" that undoes its process-wide effect

    def schema(self) -> dict:
        return {"description": self.doc, **self.value, "default": self.default}

    def value_in(self, row: dict):
        """Its value in a spec or summary row; a row from before the knob existed ran at its
        default."""
        return row.get(self.name, self.default)

    def describes(self, row: dict) -> str | None:
        if self.describe is not None:
            return self.describe(row)
        value = self.value_in(row)
        return None if value is None else str(value)

    def labels(self, row: dict) -> str | None:
        if self.column or self.value_in(row) == self.default:
            return None
        return self.label(row) if self.label is not None else f"{self.name} {self.value_in(row)}"


def parallel_label(row: dict) -> str:
    """`one GPU`, `ddp on 2 GPUs`, `fsdp2 (shard full) on 4 GPUs`."""
    mode = row.get("parallel", "none")
    if mode == "none":
        return "one GPU"
    shard = row.get("shard", "none")
    return f"{mode}{'' if shard == 'none' else f' (shard {shard})'} on {row.get('gpus')} GPUs"


_SDPA_CPU = "allowed on a CPU: math, flash, auto"


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
        gpu_only={"fp8": "FP8 tensor cores are a GPU's; allowed on a CPU: fp32, tf32, bf16, fp16"},
        column=True,
        undo="memopt.runtime.precision:restore_flags",  # TF32 is a global switch
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
        gpu_only={
            "efficient": f"PyTorch has no CPU kernel of it; {_SDPA_CPU}",
            "cudnn": f"cuDNN runs on NVIDIA GPUs; {_SDPA_CPU}",
            "flex": f"memopt runs FlexAttention on CUDA only; {_SDPA_CPU}",
            "flash_attn": f"the flash-attn package runs on CUDA GPUs; {_SDPA_CPU}",
        },
        describe=lambda r: r.get("kernel") or r["attention"],  # the kernel that ran (auto)
        column=True,
        undo="memopt.runtime.attention:restore_flash_impl",  # FA3/FA4 activated for SDPA
    ),
    Knob(
        "window",
        "attention",
        "Sliding-window attention, W keys per query including itself; null = full causal.",
        {"type": ["integer", "null"], "minimum": 1},
        default=None,
        function=True,
        required=True,
        describe=lambda r: None if r.get("window") is None else f"window {r['window']}",
        column=True,
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
        column=True,
    ),
    Knob(
        "checkpoint_every",
        "checkpointing",
        "k for checkpointing every_k.",
        {"type": "integer", "minimum": 1},
        default=2,
        required=True,
        column=True,
        subordinate=True,
    ),
    Knob(
        "compile",
        "compile",
        "Wrap the model in torch.compile.",
        {"type": "boolean"},
        default=False,
        required=True,
        describe=lambda r: "compile" if r.get("compile") else "no compile",
        column=True,
        undo="memopt.runtime.techniques:forget_compiled",  # graphs, counters, memory budget
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
        gpu_only={
            "liger": "it runs Triton kernels; allowed on a CPU: standard, chunked",
            "cce": "it runs Triton kernels; allowed on a CPU: standard, chunked",
        },
        column=True,
    ),
    Knob(
        "loss_chunk",
        "loss",
        "Rows (tokens) per chunk for loss: chunked.",
        {"type": "integer", "minimum": 1},
        default=4096,
        column=True,
        subordinate=True,
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
        parallel=("adamw", "sharding is measured with AdamW; others are not"),
        column=True,
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
        parallel=(False, "its per-parameter hooks run before gradients are reduced"),
        describe=lambda r: "in backward" if r.get("optimizer_in_backward") else None,
        column=True,  # in the optimizer's
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
        gpu_only={
            "activations": "it moves saved activations from GPU to host memory, where a CPU run "
            "keeps them already; allowed on a CPU: none"
        },
        parallel=("none", "its hooks move tensors that FSDP2 also manages"),
        describe=lambda r: f"offload {r.get('offload', 'none')}",
        label=lambda r: f"offload {r['offload']}",
        undo="memopt.runtime.offload:empty_host_cache",  # its pinned host buffers
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
        needs={"compile": (True, "it is torch.compile's activation budget")},
        describe=lambda r: (
            None
            if r.get("compile_memory_budget") is None
            else f"memory budget {r['compile_memory_budget']}"
        ),
        label=lambda r: f"compile memory budget {r['compile_memory_budget']}",
        undo="memopt.runtime.techniques:forget_compiled",
    ),
    Knob(
        "grad_accum",
        "grad_accum",
        (
            "Micro-batches per optimizer step: the technique's batch entries are micro-batches, a "
            "step trains grad_accum of them (the effective batch), and throughput counts all of them."
        ),
        {"type": "integer", "minimum": 1, "maximum": 1024},
        default=1,
        describe=lambda r: f"{r.get('grad_accum', 1)} micro-batches",
        label=lambda r: f"{r['grad_accum']} micro-batches per step",
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
        describe=parallel_label,
        label=lambda r: parallel_label(r) + ", batch per GPU",
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
        column=True,  # in parallel's label
        subordinate=True,
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
        column=True,  # in parallel's label
        subordinate=True,
    ),
    Knob(
        "compile_mode",
        "compile",
        (
            "torch.compile's mode: default; reduce-overhead (CUDA graphs: fewer kernel launches, a "
            "memory pool kept per graph); max-autotune (Triton matmul autotuning, CUDA graphs); "
            "max-autotune-no-cudagraphs. Needs compile true."
        ),
        {"enum": ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]},
        default="default",
        needs={"compile": (True, "it is torch.compile's mode")},
        describe=lambda r: (
            None if r.get("compile_mode", "default") == "default" else f"mode {r['compile_mode']}"
        ),
        label=lambda r: f"compile mode {r['compile_mode']}",
    ),
    Knob(
        "lr_scale",
        "lr",
        (
            "The technique's learning rate as a multiple of train.lr (its warm-up and schedule "
            "scaled alike): another function, not a memory technique; a positive control for the "
            "quality verdicts (a known, small harm they must detect, e.g. 0.5)."
        ),
        {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
        default=1.0,
        function=True,
        describe=lambda r: f"lr x{r.get('lr_scale', 1.0):g}",
        label=lambda r: f"learning rate x{r['lr_scale']:g}",
    ),
    Knob(
        "block",
        "block",
        (
            "The decoder block this technique trains: null = model.arch; gpt2 or llama = the same "
            "shape with that block, its MLP width scaled to keep the parameters comparable "
            "(memopt.runtime.blocks). Another function, not a memory technique: the quality "
            "study's Llama block; its seeds start from another initialization."
        ),
        {"enum": [None, "gpt2", "llama"]},
        default=None,
        function=True,
        describe=lambda r: None if r.get("block") is None else f"{r['block']} block",
        label=lambda r: f"{r['block']} block",
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


def groups() -> dict[str, list[str]]:
    """The knobs of each mechanism, in registry order: techniques that differ in one group are a
    single-knob change (memopt.report.effects.incremental_effects)."""
    out: dict[str, list[str]] = {}
    for k in KNOBS:
        out.setdefault(k.group, []).append(k.name)
    return out


def undo_calls() -> tuple[str, ...]:
    """The "module:function"s that undo the knobs' process-wide effects, each once."""
    return tuple(dict.fromkeys(k.undo for k in KNOBS if k.undo))
