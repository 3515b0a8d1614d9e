"""Quality runs and exactness runs.

A quality run trains one *function* (precision and attention window: see memopt.runtime.functions) for a
token budget at one common batch with one seed, using the fastest exact kernel for it, and
evaluates it on validation sequences spread over the whole split. Every technique of that function
shares its quality numbers; the exactness run is the evidence that it may: each technique trains
`exactness.steps` steps from the same initialization on the same batches as its function's
reference, and the loss trajectories are compared (memopt.report.results.exactness).
"""

from __future__ import annotations

import contextlib
import math
import time
from functools import partial

import torch
from torch._dynamo.exc import TorchDynamoException
from tqdm import tqdm

from memopt.config import technique_spec
from memopt.data.tokens import TokenData, eval_sequences
from memopt.errors import KernelUnavailable
from memopt.jobs.outcome import guarded, stamp
from memopt.runtime import parallel
from memopt.runtime.attention import math_attention, resolve_kernel, second_kernel
from memopt.runtime.divergence import Diverged, LossWatch
from memopt.runtime.functions import function_of, quality_spec
from memopt.runtime.measure import device_name
from memopt.runtime.model import LlamaAttention, SelfAttention
from memopt.runtime.precision import set_precision_flags
from memopt.runtime.step import free_memory, limit_gpu_memory, prepare, train_step
from memopt.runtime.techniques import eval_model, forget_compiled


@contextlib.contextmanager
def _explicit_fp32(model: torch.nn.Module):
    """Evaluate every function the same way: FP32, TF32 off, the explicit kernel (window kept),
    in either block's attention (memopt.runtime.model)."""
    attn = [m for m in model.modules() if isinstance(m, (SelfAttention, LlamaAttention))]
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


def position_buckets(bounds: list[int], seq_len: int) -> list[tuple[int, int]]:
    """Positions 1..seq_len split at `bounds` (each bucket's last position; those at or past
    seq_len dropped): [64, 128, 512] at 1,024 -> (1, 64), (65, 128), (129, 512), (513, 1024)."""
    lasts = [b for b in sorted(set(bounds)) if b < seq_len] + [seq_len]
    return [(first + 1, last) for first, last in zip([0, *lasts[:-1]], lasts)]


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    sequences: torch.Tensor,
    batch_size: int,
    device: str,
    buckets: list[tuple[int, int]] = (),
) -> dict:
    """The validation loss over every predicted token of `sequences` ("loss") and, per bucket of
    positions (first, last; 1-based), the mean over sequences of each sequence's mean loss there
    with its standard error over sequences ("positions")."""
    model.eval()
    per_token = []
    with _explicit_fp32(model):
        for chunk in sequences.split(batch_size):
            chunk = chunk.to(device)
            logits = model(chunk[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.float().transpose(1, 2), chunk[:, 1:], reduction="none"
            )
            per_token.append(loss.double().cpu())
    model.train()
    losses = torch.cat(per_token)  # (sequences, seq_len)
    positions = []
    for first, last in buckets:
        means = losses[:, first - 1 : last].mean(dim=1)
        se = means.std().item() / math.sqrt(len(means)) if len(means) > 1 else None
        positions.append({"first": first, "last": last, "loss": means.mean().item(), "se": se})
    return {"loss": losses.mean().item(), "positions": positions}


def quality_budget(cfg: dict, data: TokenData) -> dict:
    """Tokens, batch and steps of every quality run: `quality.tokens` (null: one epoch of the
    training split) rounded up to whole steps of `quality.batch` sequences."""
    q, seq_len = cfg["quality"], cfg["model"]["seq_len"]
    tokens = q["tokens"] if q["tokens"] is not None else len(data.train)
    tokens_per_step = q["batch"] * seq_len
    return {
        "batch_size": q["batch"],
        "tokens_per_step": tokens_per_step,
        "steps": max(1, math.ceil(tokens / tokens_per_step)),
    }


# A quality run reads its losses every this many steps (a wait for the device): one that diverges
# stops within them.
CHECK_EVERY = 20


def _losses(applied, opt, batches, steps: int, cfg: dict, device: str, label: str, watch=None):
    """Train `steps` steps; per-step training losses and the seconds they took (synchronized).
    With `watch` (a LossWatch), a non-finite loss raises Diverged within CHECK_EVERY steps. The
    progress bar counts launched steps (the GPU may be a few behind)."""
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses = []
    for step in tqdm(range(steps), desc=label, unit=" step", mininterval=2.0):
        x, y = batches.next()
        losses.append(train_step(applied, opt, x, y, step, cfg["train"]))
        if watch is not None and (step + 1) % CHECK_EVERY == 0:
            watch.check(losses)
    if watch is not None:
        watch.check(losses)
    # Synchronizes; under several GPUs the global batch's loss (memopt.runtime.parallel).
    curve = parallel.mean_over_ranks(torch.stack(losses).float()).tolist()
    return curve, time.perf_counter() - t0


def _common(cfg: dict, spec: dict, device: str) -> dict:
    return {
        "spec": spec,
        "function": function_of(spec),
        "device": device,
        "device_name": device_name(device),
        "seq_len": cfg["model"]["seq_len"],
    }


def run_quality(cfg: dict, function: str, seed: int, data: TokenData, device: str) -> dict:
    """One quality run of `function` with `seed`; out of memory is a result (status `oom`), and
    so is a non-finite training loss (status `diverged`, memopt.runtime.divergence)."""
    spec = quality_spec(cfg["techniques"], function)
    budget = quality_budget(cfg, data)
    limit_gpu_memory(cfg, device)
    result = {"function": function, "seed": seed, **_common(cfg, spec, device), **budget}
    wall0 = time.perf_counter()
    work = partial(_quality_run, cfg, spec, function, seed, data, device, budget)
    result.update(guarded(work, device, budget["batch_size"], ("val_loss", "val_ppl"),
                          oom_prefix=f"quality.batch {budget['batch_size']} does not fit: "))  # fmt: skip
    result["wall_s"] = time.perf_counter() - wall0
    return stamp(result, cfg, spec, device, ("model", "train", "quality"))


def _quality_run(cfg, spec, function, seed, data: TokenData, device: str, budget: dict) -> dict:
    applied, opt, batches = prepare(cfg, spec, data, budget["batch_size"], device, seed)
    label = f"[quality {function} seed {seed}]"
    curve, train_s = _losses(
        applied, opt, batches, budget["steps"], cfg, device, label, LossWatch()
    )
    del opt
    t0 = time.perf_counter()
    seq_len = cfg["model"]["seq_len"]
    seqs = eval_sequences(data.val, seq_len, cfg["train"]["eval_sequences"])
    buckets = position_buckets(cfg["quality"]["position_buckets"], seq_len)
    scored = evaluate(eval_model(applied), seqs, cfg["train"]["eval_batch_size"], device, buckets)
    val_loss = scored["loss"]
    if not math.isfinite(val_loss):  # the last update broke the weights
        raise Diverged(
            budget["steps"] + 1, val_loss, curve, "validation loss after the last update"
        )
    return {
        "status": "ok",
        "kernel": applied.kernel,
        "precision_flags": applied.record,
        "tokens": budget["steps"] * budget["tokens_per_step"],
        "loss_curve": curve,
        "train_s": train_s,
        "eval_s": time.perf_counter() - t0,
        "eval_sequences": len(seqs),
        "val_loss": val_loss,
        "val_ppl": math.exp(min(val_loss, 50.0)),
        "val_positions": scored["positions"],  # loss by position (quality.position_buckets)
        "error": None,
    }


def run_exactness(
    cfg: dict, technique: str, data: TokenData, device: str, change: dict | None = None
) -> dict:
    """`exactness.steps` training steps of `technique` at `exactness.batch` from train.seed: the
    loss trajectory its function's reference must match (`change`: knobs set otherwise than the
    technique's, e.g. another attention kernel, for the function's noise floor)."""
    spec = technique_spec(cfg, technique) | (change or {})
    e = cfg["exactness"]
    limit_gpu_memory(cfg, device)
    # A compiled run draws eager's random numbers (inductor's fallback_random; the default draws
    # its own), so its dropout masks are the reference's and the two differ by rounding alone.
    # Dynamo reuses a compiled graph whatever inductor's settings are now, so the run compiles
    # its own graph, and leaves none for the search trials and cells (which draw their own).
    if spec["compile"]:
        forget_compiled()
    applied, opt, batches = prepare(cfg, spec, data, e["batch"], device, cfg["train"]["seed"])
    with torch._inductor.config.patch(fallback_random=True):
        curve, seconds = _losses(
            applied, opt, batches, e["steps"], cfg, device, f"[exactness {technique}]"
        )
    del applied, opt
    if spec["compile"]:
        forget_compiled()
    free_memory(device)
    result = {
        "technique": technique,
        **_common(cfg, spec, device),
        "batch_size": e["batch"],
        "steps": e["steps"],
        # JSON has no NaN: a non-finite loss is null, and the check counts it as a mismatch.
        "losses": [loss if math.isfinite(loss) else None for loss in curve],
        "seconds": seconds,
    }
    return stamp(result, cfg, spec, device, ("model", "train", "exactness"))


def add_floor(cfg: dict, exact: dict, data: TokenData, device: str) -> dict:
    """The reference's exactness run again, computing the same function with other rounding (same
    initialization, batches and dropout masks: no attention dropout), under exact["floor"]; the
    largest per-step difference of the two is the function's noise floor (memopt.report.verdicts.
    exactness). exactness.floor `kernel`: another exact attention kernel; `compile`: the whole
    model under torch.compile (fused kernels round every layer differently). Where that cannot
    run, the reason."""
    spec = exact["spec"]
    kernel = resolve_kernel(spec["attention"], spec["window"], device, spec["precision"])
    if cfg["exactness"].get("floor") == "compile":
        other, against, change = "compiled", "eager", {"compile": True}
    else:
        other, against = second_kernel(kernel, spec["window"], device), kernel
        change = {"attention": other}
    if other is None:
        exact["floor"] = {"kernel": None, "reason": f"no second exact kernel on {device}"}
        return exact
    try:
        run = run_exactness(cfg, exact["technique"], data, device, change)
    except (KernelUnavailable, torch.OutOfMemoryError, TorchDynamoException) as err:
        # (no second kernel, out of memory, a compile that failed): the check falls back, says why
        free_memory(device)
        exact["floor"] = {"kernel": other, "reason": f"{other}: {' '.join(str(err).split())[:200]}"}
        return exact
    exact["floor"] = {"kernel": other, "against": against, "losses": run["losses"]}
    return exact
