"""The `precision` knob: the arithmetic of the matmuls and what the training step adds for it.

- fp32: FP32 everywhere, TF32 off (it is a global switch, so it is set explicitly every time).
- tf32: FP32 weights and activations, TF32 tensor-core matmuls.
- bf16: autocast to BF16, FP32 master weights.
- fp16: autocast to FP16, FP32 master weights, and dynamic loss scaling (torch.amp.GradScaler):
  the loss is scaled up before the backward pass so small gradients survive FP16's range, the
  gradients are unscaled before clipping, and a step whose gradients overflowed is skipped
  while the scale is lowered.
- fp8: BF16 autocast, and the linear layers of the blocks train in FP8 with torchao's float8
  training (dynamic tensor-wise scaling; the output layer, which shares its weight with the
  embedding, stays BF16, as in torchtitan). Needs torchao and a GPU with FP8 tensor cores
  (compute capability 8.9 or newer). Its model FLOP/s are reported, its MFU is not: the
  peak would be a mix of FP8 and BF16 peaks (torchtitan does the same).
"""

from __future__ import annotations

import contextlib

import torch

from memopt.errors import KernelUnavailable

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
FP8_MIN_CAPABILITY = (8, 9)


def is_16bit(precision: str) -> bool:
    """Whether activations (and so attention's inputs) are 16-bit."""
    return precision in AUTOCAST_DTYPES


# TF32 as this process found it: set_precision_flags changes a global switch.
_INITIAL_TF32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def restore_flags() -> None:
    """TF32 as the process started with it (the `precision` knob's undo)."""
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = _INITIAL_TF32


def set_precision_flags(precision: str) -> None:
    # fp32 means true FP32 matmuls: TF32 must be off explicitly (it is a global switch).
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast_context(precision: str, device: str):
    if precision in AUTOCAST_DTYPES:
        return torch.autocast(device_type=device, dtype=AUTOCAST_DTYPES[precision])
    return contextlib.nullcontext()


def grad_scaler(precision: str, device: str) -> torch.amp.GradScaler | None:
    """Dynamic loss scaling for FP16; None for every other precision."""
    return torch.amp.GradScaler(device) if precision == "fp16" else None


def _fp8_filter(module: torch.nn.Module, fqn: str) -> bool:
    # The blocks' linear layers; the tied output layer stays BF16. torchao's kernels need both
    # dimensions to be multiples of 16.
    return (
        fqn.startswith("blocks.")
        and isinstance(module, torch.nn.Linear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def check_fp8(device: str) -> None:
    """Raise KernelUnavailable unless FP8 training can run here."""
    if device != "cuda":
        raise KernelUnavailable("precision 'fp8' needs a CUDA GPU with FP8 tensor cores")
    capability = torch.cuda.get_device_capability()
    if capability < FP8_MIN_CAPABILITY:
        raise KernelUnavailable(
            f"precision 'fp8' needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper "
            f"or newer); {torch.cuda.get_device_name()} has {capability[0]}.{capability[1]}; "
            "allowed here: fp32, tf32, bf16, fp16"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as err:
        raise KernelUnavailable(
            "precision 'fp8' needs torchao's float8 training, and torchao is not installed "
            "(pip install torchao)"
        ) from err


def convert_fp8(model: torch.nn.Module, device: str) -> int:
    """Swap the blocks' linear layers for torchao's Float8Linear in place; returns how many."""
    check_fp8(device)
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    convert_to_float8_training(model, module_filter_fn=_fp8_filter)
    converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    if not converted:
        raise KernelUnavailable(
            "precision 'fp8': no linear layer of the blocks has both dimensions divisible by 16 "
            "(torchao's FP8 matmuls need them); allowed: model.d_model and model.d_ff "
            "multiples of 16, or another precision"
        )
    return converted
