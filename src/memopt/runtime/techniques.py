"""Apply a technique (a dict of knobs from the config) to the model and the training step.

Each knob is defined once here; a combination is just a config entry. What actually ran (the
resolved kernel, the precision flags) is returned so every result can record it.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import torch

from memopt.errors import MemoptError
from memopt.knobs import KNOBS
from memopt.runtime.attention import resolve_kernel
from memopt.runtime.blocks import technique_model
from memopt.runtime.losses import check_loss
from memopt.runtime.model import Decoder, ModelConfig, build_model
from memopt.runtime.offload import check_offload
from memopt.runtime.parallel import check_launched, unwrap, wrap
from memopt.runtime.precision import (
    autocast_context,
    check_fp8,
    convert_fp8,
    grad_scaler,
    set_precision_flags,
)


def resolve_device(requested: str) -> str:
    """`auto` -> cuda when present, else cpu; `cuda` without a GPU is an error that points to the
    smoke study instead of crawling on a CPU."""
    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if has_cuda else "cpu"
    if requested == "cuda" and not has_cuda:
        raise MemoptError(
            "device: 'cuda' was requested but this machine has no CUDA GPU. The default study "
            "needs one; on a CPU run the smoke study instead (snakemake --profile profiles/smoke), "
            "or set device to 'auto' or 'cpu' in the study's config to train it on the CPU, slowly"
        )
    return requested


@dataclass
class Applied:
    """A technique applied: the model to train, how its step runs (autocast, loss scaling,
    micro-batches, where saved activations live), and what ran."""

    model: torch.nn.Module
    kernel: str
    autocast: contextlib.AbstractContextManager
    record: dict
    scaler: torch.amp.GradScaler | None = None
    grad_accum: int = 1
    offload: str = "none"
    offloaded: object = None  # the last forward pass's memopt.runtime.offload.OffloadedBytes


def set_compile_memory_budget(budget: float | None) -> None:
    """torch.compile's activation memory budget (min-cut recomputation; 1.0 = torch's default,
    save what is cheapest to save). A global of torch's, read when a graph is compiled: set for
    every technique, so one technique's budget never leaks into the next one's graphs."""
    torch._functorch.config.activation_memory_budget = 1.0 if budget is None else budget


def forget_compiled() -> None:
    """No compiled graph, cache counter or memory budget of an earlier job, as in a new process
    (the undo of the `compile` and `compile_memory_budget` knobs). The next job finds earlier
    graphs in inductor's disk cache, as a new process would."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    set_compile_memory_budget(None)


def forget_cuda_graphs() -> None:
    """Drop the CUDA graphs a CUDA-graph compile mode recorded, with their memory pools, and the
    compiled code that replays them (it cannot run without them): the next job or search trial
    starts as a new process would, instead of finding the last one's pools counted against its
    memory. Nothing happens unless graphs were recorded (the default mode records none)."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None or not torch._C._is_key_in_tls("tree_manager_containers"):
        return
    containers = trees.get_obj(trees.local, "tree_manager_containers")
    if any(c.tree_manager is not None for c in containers.values()):
        torch._dynamo.reset()  # resets the graph trees too


def dynamic_batch(*tensors: torch.Tensor) -> None:
    """Mark the batch dimension of a compiled model's inputs dynamic: one graph (and inductor's
    on-disk cache entry) serves every batch size of 2 or more, so a search's trials and the cells of
    a compiled technique compile once instead of once per batch size (~30 s each for the default
    model on an H100; the exactness run compiles its own graph: memopt.jobs.quality). The sequence length stays static. `maybe`: code that
    specializes on the batch (the chunked loss's chunk count does) still compiles per batch."""
    for t in tensors:
        torch._dynamo.maybe_mark_dynamic(t, 0)


def compile_cache_counts() -> dict[str, int]:
    """This process's compile-cache counters (the worker clears them per job): whether a compiled
    technique's jobs reuse each other's graphs from inductor's and AOTAutograd's disk caches."""
    from torch._dynamo.utils import counters

    fx, aot = counters["inductor"], counters["aot_autograd"]
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "fx_hit": fx["fxgraph_cache_hit"],
        "fx_miss": fx["fxgraph_cache_miss"],
        "fx_bypass": fx["fxgraph_cache_bypass"],
        "autograd_hit": aot["autograd_cache_hit"],
        "autograd_miss": aot["autograd_cache_miss"],
        "autograd_guard_miss": aot["autograd_cache_guard_miss"],
        "autograd_bypass": aot["autograd_cache_bypass"],
    }


def apply_technique(
    spec: dict, model_cfg: dict, vocab_size: int, seed: int, device: str
) -> Applied:
    kernel = resolve_kernel(spec["attention"], spec["window"], device, spec["precision"])
    check_loss(spec["loss"], device)
    if spec["precision"] == "fp8":
        check_fp8(device)
    check_offload(spec["offload"], device)
    check_launched(spec)
    cfg = ModelConfig(
        vocab_size=vocab_size,
        attention=kernel,
        window=spec["window"],
        checkpointing=spec["checkpointing"],
        checkpoint_every=spec["checkpoint_every"],
        loss=spec["loss"],
        loss_chunk=spec["loss_chunk"],
        **technique_model(model_cfg, spec),
    )
    set_precision_flags(spec["precision"])
    model: torch.nn.Module = build_model(cfg, seed, device)
    fp8_layers = convert_fp8(model, device) if spec["precision"] == "fp8" else 0
    # Always: FlexAttention compiles its kernel even when the model is not compiled.
    set_compile_memory_budget(spec["compile_memory_budget"])
    model = wrap(model, spec, device)
    if spec["compile"]:
        model = torch.compile(model, mode=spec["compile_mode"])
    record = {
        "kernel": kernel,
        **{k.name: spec[k.name] for k in KNOBS},  # every knob as it ran
        "tf32": torch.backends.cuda.matmul.allow_tf32,
        "loss_scaling": spec["precision"] == "fp16",
        "fp8_linear_layers": fp8_layers,
    }
    return Applied(
        model,
        kernel,
        autocast_context(spec["precision"], device),
        record,
        scaler=grad_scaler(spec["precision"], device),
        grad_accum=spec["grad_accum"],
        offload=spec["offload"],
    )


def eval_model(applied: Applied) -> Decoder:
    """The module to evaluate: the uncompiled decoder, outside DDP (weights shared with the
    trained one)."""
    m = applied.model
    return unwrap(getattr(m, "_orig_mod", m))
