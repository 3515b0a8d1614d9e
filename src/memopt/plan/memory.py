"""Peak training memory against the batch, predicted from the model's shape and a technique's
knobs, without a GPU: a fixed part (what exists at any batch) and a part per sequence (what the
step keeps for each), so the largest batch under a memory budget follows. Torch-free.

Per token and layer, what autograd keeps, counted from the code (memopt.runtime.model,
attention, precision), h = d_model, f = d_ff, a = heads, kvd = n_kv_heads x head dim, s = the
sequence length, m = 1 with dropout:

- GPT-2: FP32 (math attention) 32h + 8f + 2mh + 4as; BF16 math 20h + 4f + 2mh + 6as; BF16
  flash or flex 20h + 4f + 2mh + 4a (windows change no saved tensor).
- Llama: FP32 32h + 16f + 2mh + 4as; BF16 math 22h + 2kvd + 8f + 2mh + 6as; BF16 flash or flex
  20h + 6kvd + 8f + 2mh + 4a.

Korthikanti et al. (2022) count 34h + 5as per layer (16-bit, dropout in attention too); the code
differs where it keeps the residual stream in FP32 under autocast (norm inputs and checkpoints
4h, not 2h), where BF16 math attention runs softmax in FP32 (6as), and in Llama's separate casts
and rotated keys. Outside the layers BF16 keeps 6h + mh, FP32 8h + mh; the logits with the
standard loss 10V (BF16) or 12V (FP32) bytes a token. Full checkpointing keeps 4h a layer; with
the chunked loss the backward pass then holds one recomputed layer and a workspace, with offload
only those. These, and compile's saving, are calibrated (CALIBRATION) from the H100 and H200
searches; the fixed part is the FP32 master weights (4 bytes a parameter), the optimizer's state
(AdamW 8, 8-bit AdamW 2.04), ~66 MiB the step keeps, and in BF16 the casts of the matmul weights
(2 bytes each) where no checkpointing recomputes them.

The peak is a line in the batch; the largest batch under a budget is where it crosses the
budget less the search's allocator slack (memopt.jobs.search).

On a CPU the search counts tracked tensors (memopt.runtime.measure), and three things differ
from CUDA (measured on the smoke model, at 2 and 4 layers and 32 and 64 tokens): dropout keeps
its mask in the dropped tensor's type, not as bools (the FP32 embeddings', the BF16 residual
branches' under autocast); BF16 math attention's softmax runs in BF16 (2as, not 6as); and the
loss holds three FP32 copies of the logits in BF16 as well (12V). The step's CUDA state and the
classes' fixed extras do not exist there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from memopt.knobs import defaults
from memopt.runtime.blocks import technique_model
from memopt.runtime.flops import matmul_params, param_count

MIB = 2**20

# Fitted to the measured searches of studies/h100-default, h200-default, h100-protocol-v2 and the
# map's first points (GPT-2 110M, Llama 128M, 360M, 1B; 1,024 to 16,384 tokens): each value is
# the median of what those searches imply. Workspaces are bytes per token in units of d_ff.
CALIBRATION = {
    "state_mib": 66.0,  # kept at any batch beyond weights and optimizer state
    "ckpt_chunked_workspace": {"gpt2": 0.26, "llama": 1.31},
    "offload_workspace": {"gpt2": 3.26, "llama": 5.00},
    "compile_layer_factor": {"gpt2": 1.00, "llama": 0.81},  # of the eager layer's bytes
    "compile_logits_bytes": 2.0,  # per token and vocabulary entry
    "fixed_extra_mib": {
        "eager": 0.0,
        "ckpt": 24.0,
        "ckpt_chunked": 256.0,
        "offload": -14.0,
        "compiled": 50.0,
    },
}
# What the model covers: other values of these knobs have no measured point yet.
MODELLED = {
    "precision": ("fp32", "tf32", "bf16"),
    "attention": ("math", "flash", "flex"),
    "checkpointing": ("none", "full"),
    "loss": ("standard", "chunked"),
    "optimizer": ("adamw", "adamw8bit"),
    "offload": ("none", "activations"),
    "compile_mode": ("default",),
    "parallel": ("none",),
    "optimizer_in_backward": (False,),
    "compile_memory_budget": (None,),
    "grad_accum": (1,),  # more: the gradients stay through the next micro-batch
    "loss_chunk": (4096,),  # the chunked loss's logits scale with it
}
OPTIMIZER_BYTES = {"adamw": 8.0, "adamw8bit": 2.04}  # per parameter (8-bit: + block scales)


@dataclass
class Line:
    """Predicted peak memory at batch B (sequences): fixed_mib + per_sequence_mib * B."""

    fixed_mib: float
    per_sequence_mib: float
    parts: dict = field(default_factory=dict)  # MiB: the fixed part's terms, per sequence's
    kind: str = "eager"  # the measured class (terms)

    def at(self, batch: int) -> float:
        return self.fixed_mib + self.per_sequence_mib * batch

    def max_batch(self, limit_mib: float) -> int:
        """The largest batch whose peak stays within limit_mib (0: not even one)."""
        return max(0, math.floor((limit_mib - self.fixed_mib) / self.per_sequence_mib))


def complete(spec: dict) -> dict:
    """`spec` with every knob: older results leave out knobs added since (their defaults)."""
    full = {**defaults(), **spec}
    return {k: defaults()[k] if v is None and k in defaults() else v for k, v in full.items()}


def kernel(spec: dict, device: str = "cuda") -> str:
    """The attention kernel `spec` runs on `device`, as memopt.runtime.attention.resolve_kernel
    turns `auto` into one. `auto` on a GPU may choose cuDNN's kernel or flash-attn's; they keep
    what PyTorch's flash kernel keeps (the output and a log-sum-exp a row), so `auto` counts as
    `flash` there (an assumption: no cell chose them explicitly, and an explicit `cudnn` or
    `flash_attn` is not predicted)."""
    spec = complete(spec)
    if spec["attention"] != "auto":
        return spec["attention"]
    if device != "cuda":
        return "math" if spec["window"] is not None else "flash"
    if spec["window"] is not None:
        return "flex"
    return "flash" if spec["precision"] in ("bf16", "fp16", "fp8") else "efficient"


# What a CPU search has measured: the eager and fully checkpointed classes (the smoke study); the
# others' terms are fitted to CUDA's memory.
CPU_CLASSES = ("eager", "ckpt")


def unmodelled(spec: dict, device: str = "cuda") -> list[str]:
    """The knob settings of `spec` the model has no measured point for ("key=value")."""
    spec = complete(spec)
    out = [f"{k}={spec.get(k)}" for k, allowed in MODELLED.items() if spec.get(k) not in allowed
           and k != "attention"]  # fmt: skip
    runs = kernel(spec, device)
    auto = f" ({runs} on {device})" if spec["attention"] == "auto" else ""
    if runs not in MODELLED["attention"] or (device != "cuda" and runs == "flex"):
        out.insert(1, f"attention={spec['attention']}{auto}")
    elif runs != "math" and spec["precision"] in ("fp32", "tf32"):  # measured with math only
        out.insert(1, f"attention={spec['attention']}{auto} with precision={spec['precision']}")
    kind = _kind(spec)
    if kind is None:
        out.append(
            f"checkpointing={spec['checkpointing']} loss={spec['loss']} "
            f"offload={spec['offload']} compile={spec['compile']} together"
        )
    elif device != "cuda" and kind not in CPU_CLASSES:
        out.append(f"{kind} on a CPU")
    return out


def _kind(spec: dict) -> str | None:
    """The measured class of `spec`: eager, compiled, ckpt (full checkpointing, standard loss),
    ckpt_chunked, offload (full checkpointing, chunked loss, offloaded); None for another."""
    ckpt, chunked, offload = (spec["checkpointing"] == "full", spec["loss"] == "chunked",
                              spec["offload"] != "none")  # fmt: skip
    if spec["compile"]:
        return "compiled" if not (ckpt or chunked or offload) else None
    if offload:
        return "offload" if ckpt and chunked else None
    if ckpt:
        return "ckpt_chunked" if chunked else "ckpt"
    return None if chunked else "eager"


def mask_bytes(model: dict, spec: dict, device: str, branch: bool) -> int:
    """Bytes a dropout mask keeps per element: CUDA's fused dropout keeps a bool mask; on a CPU
    PyTorch multiplies by a mask of the input's type, FP32 for the embeddings and the residual
    branches' type (BF16 under autocast) in the blocks (branch); 0 without dropout."""
    if model.get("dropout", 0.0) <= 0:
        return 0
    if device == "cuda":
        return 1
    return 4 if not branch or spec["precision"] in ("fp32", "tf32") else 2


def layer_bytes(model: dict, spec: dict, device: str = "cuda") -> float:
    """Bytes a layer keeps per token for the backward pass (the module docstring's table)."""
    h, f, a, s = (model[k] for k in ("d_model", "d_ff", "n_heads", "seq_len"))
    m = mask_bytes(model, spec, device, branch=True)
    kvd = (model.get("n_kv_heads") or a) * (h // a)
    fp32 = spec["precision"] in ("fp32", "tf32")
    math_kernel = kernel(spec, device) == "math"
    # BF16 math attention's softmax: FP32 under CUDA's autocast (kept, and its BF16 cast), BF16
    # under the CPU's
    soft = 6 if device == "cuda" else 2
    if model.get("arch", "gpt2") == "llama":
        if fp32:
            return 32 * h + 16 * f + 2 * m * h + 4 * a * s
        core = 22 * h + 2 * kvd if math_kernel else 20 * h + 6 * kvd
        return core + 8 * f + 2 * m * h + (soft * a * s if math_kernel else 4 * a)
    if fp32:
        return 32 * h + 8 * f + 2 * m * h + 4 * a * s
    return 20 * h + 4 * f + 2 * m * h + (soft * a * s if math_kernel else 4 * a)


def terms(model: dict, vocab: int, spec: dict, device: str = "cuda") -> dict:
    """What memory_line adds up, before the calibrated constants: the class (kind), the bytes a
    token keeps that the code says (known), the multiplier of the class's calibrated term
    (per_unit: a workspace in units of d_ff; compile's share of the eager layers), and the fixed
    MiB (weights, optimizer state, casts, gradients). ValueError for a spec the model does not
    cover (unmodelled says which knobs)."""
    spec = complete(spec)
    missing = unmodelled(spec, device)
    if missing:
        raise ValueError(f"no measured point for {', '.join(missing)}")
    model = technique_model(model, spec)
    kind = _kind(spec)
    h, f, L = (model[k] for k in ("d_model", "d_ff", "n_layers"))
    fp32 = spec["precision"] in ("fp32", "tf32")
    layer = layer_bytes(model, spec, device)
    outside = (8 if fp32 else 6) * h + mask_bytes(model, spec, device, branch=False) * h
    logits = (12 if fp32 or device != "cuda" else 10) * vocab  # the CPU's: three FP32 copies
    known, per_unit = {
        "eager": (L * layer + outside + logits, 0.0),
        "ckpt": (L * 4 * h + outside + logits, 0.0),
        "ckpt_chunked": (L * 4 * h + outside + 2 * h + layer, f),
        "offload": (layer, f),
        "compiled": (outside, L * layer),
    }[kind]
    params = param_count(model, vocab)
    fixed = {
        "weights": 4 * params / MIB,  # FP32 master weights
        "optimizer_state": OPTIMIZER_BYTES[spec["optimizer"]] * params / MIB,
        # BF16 copies of the matmul weights, kept for the backward pass unless recomputed
        "casts": 0.0 if fp32 or kind not in ("eager", "compiled")
        else 2 * matmul_params(model, vocab) / MIB,
        # offload peaks late in the backward pass, with every gradient there
        "gradients": 4 * params / MIB if kind == "offload" else 0.0,
    }  # fmt: skip
    return {"kind": kind, "arch": model.get("arch", "gpt2"), "known": known,
            "per_unit": per_unit, "fixed": fixed}  # fmt: skip


CALIBRATED = {"ckpt_chunked": "ckpt_chunked_workspace", "offload": "offload_workspace",
              "compiled": "compile_layer_factor"}  # fmt: skip


def memory_line(model: dict, vocab: int, spec: dict, cal: dict = CALIBRATION,
                device: str = "cuda") -> Line:  # fmt: skip
    """The predicted peak of one GPU's micro-batch against its size (terms, and the
    calibrated constants `cal`); ValueError for a spec the model does not cover. On a CPU
    (memopt.runtime.measure's tracked tensors) the step's CUDA state and the classes' fixed
    extras are not there."""
    t = terms(model, vocab, spec, device)
    kind = t["kind"]
    per_token = t["known"]
    if kind in CALIBRATED:
        per_token += cal[CALIBRATED[kind]][t["arch"]] * t["per_unit"]
    if kind == "compiled":
        per_token += cal["compile_logits_bytes"] * vocab
    cuda = device == "cuda"
    fixed = {**t["fixed"], "step": cal["state_mib"] if cuda else 0.0,
             "class": cal["fixed_extra_mib"][kind] if cuda else 0.0}  # fmt: skip
    return Line(sum(fixed.values()), per_token * model["seq_len"] / MIB,
                {**fixed, "per_token_bytes": per_token}, kind)  # fmt: skip


HOST_MARGIN_MIB = 128  # the host model below undercounts measured pinned memory by 0-105 MiB


def host_pinned_mib(model: dict, spec: dict, batch: int) -> float:
    """The host memory offloading pins at `batch` (full checkpointing, chunked loss): every
    block's checkpoint and the final norm's input (FP32, batch x length x d_model each), the
    loss's chunks of loss_chunk rows, and the token ids, each charged as memopt.runtime.offload
    pins it (pieces of 256 MiB, the last rounded up to a power of two)."""
    from memopt.runtime.offload import charged_bytes  # (torch: only for offloaded techniques)

    spec = complete(spec)
    tokens, h, chunk = batch * model["seq_len"], model["d_model"], spec["loss_chunk"]
    full, tail = divmod(tokens, chunk)
    chunks = full * charged_bytes(chunk * h * 4) + (charged_bytes(tail * h * 4) if tail else 0)
    checkpoints = (model["n_layers"] + 1) * charged_bytes(tokens * h * 4)
    return (checkpoints + chunks + charged_bytes(tokens * 8)) / MIB


def host_max_batch(model: dict, spec: dict, budget_mib: float, upper: int) -> int:
    """The largest batch up to `upper` whose pinned host memory (host_pinned_mib, plus
    HOST_MARGIN_MIB) stays within budget_mib."""
    lo, hi = 0, upper + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits = host_pinned_mib(model, spec, mid) + HOST_MARGIN_MIB <= budget_mib
        lo, hi = (mid, hi) if fits else (lo, mid)
    return lo


def largest_batch(model, vocab, spec, limit_mib, host_mib=None, cap=None, cal=CALIBRATION,
                  device="cuda"):  # fmt: skip
    """(the largest batch, what binds it: "gpu", "host" or "cap", the Line): within limit_mib of
    GPU memory, host_mib of pinned host memory for an offloaded technique (None: not checked)
    and the cap (None: none)."""
    line = memory_line(model, vocab, spec, cal, device)
    best, bound = line.max_batch(limit_mib), "gpu"
    if complete(spec)["offload"] != "none" and host_mib is not None and best > 0:
        host = host_max_batch(model, spec, host_mib, best)
        best, bound = (host, "host") if host < best else (best, bound)
    if cap is not None and best > cap:
        best, bound = cap, "cap"
    return best, bound, line
