"""Apply a technique (a dict of knobs from the config) to the model and the training step.

Each knob is defined once here; a combination is just a config entry. What actually ran (the
resolved kernel, the precision flags) is returned so every result can record it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from memopt.attention import resolve_kernel
from memopt.errors import MemoptError
from memopt.model import Decoder, ModelConfig, build_model


def resolve_device(requested: str) -> str:
    """`auto` -> cuda when present, else cpu; `cuda` without a GPU is an error that points to the
    smoke study instead of crawling on a CPU."""
    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if has_cuda else "cpu"
    if requested == "cuda" and not has_cuda:
        raise MemoptError(
            "device: 'cuda' was requested but this machine has no CUDA GPU. The default study "
            "needs one; on a CPU run the smoke study instead:\n"
            "  snakemake --cores all --resources gpu=1 --configfile config/smoke.yaml\n"
            "(or set --config device=cpu to force this study onto the CPU, slowly)"
        )
    return requested


@dataclass
class Applied:
    """A technique applied: the model to train, the autocast context, and what ran."""

    model: torch.nn.Module
    kernel: str
    autocast: contextlib.AbstractContextManager
    record: dict


def set_precision_flags(precision: str) -> None:
    # fp32 means true FP32 matmuls: TF32 must be off explicitly (it is a global switch).
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast_context(precision: str, device: str):
    if precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def apply_technique(
    spec: dict, model_cfg: dict, vocab_size: int, seed: int, device: str
) -> Applied:
    kernel = resolve_kernel(spec["attention"], spec["window"], device, spec["precision"])
    cfg = ModelConfig(
        vocab_size=vocab_size,
        attention=kernel,
        window=spec["window"],
        checkpointing=spec["checkpointing"],
        checkpoint_every=spec["checkpoint_every"],
        loss=spec["loss"],
        loss_chunk=spec["loss_chunk"],
        **model_cfg,
    )
    set_precision_flags(spec["precision"])
    model: torch.nn.Module = build_model(cfg, seed, device)
    if spec["compile"]:
        model = torch.compile(model)
    record = {
        "kernel": kernel,
        "precision": spec["precision"],
        "tf32": torch.backends.cuda.matmul.allow_tf32,
        "compile": spec["compile"],
        "loss": cfg.loss,
    }
    return Applied(model, kernel, autocast_context(spec["precision"], device), record)


def eval_model(applied: Applied) -> Decoder:
    """The module to evaluate: the uncompiled decoder (weights shared with the trained one)."""
    m = applied.model
    return getattr(m, "_orig_mod", m)
