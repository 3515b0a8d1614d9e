"""The largest batch a technique trains at within the memory budget.

A trial runs `search.trial_steps` full training steps (forward, backward, clipping, optimizer; at
least two, so the optimizer state exists). The search doubles the batch until a trial fails (or
the cap is reached), then bisects to granularity 1, so the answer B is proven: B fits, B + 1 does
not, and both trials are recorded. Out of memory means "does not fit"; any other error is raised.
"""

from __future__ import annotations

import contextlib
import time

import torch

from memopt.config import technique_spec
from memopt.data import Batches, TokenData
from memopt.errors import MemoptError
from memopt.measure import MIB, TensorMemoryTracker, is_oom
from memopt.techniques import apply_technique
from memopt.train import budget_bytes, free_memory, limit_gpu_memory, make_optimizer, train_step


def _trial(cfg: dict, spec: dict, data: TokenData, batch: int, device: str) -> dict:
    t0 = time.perf_counter()
    train_cfg = cfg["train"]
    peak, fits = None, True
    try:
        applied = apply_technique(spec, cfg["model"], data.vocab_size, train_cfg["seed"], device)
        opt = make_optimizer(applied.model, train_cfg, device)
        batches = Batches(data.train, cfg["model"]["seq_len"], batch, train_cfg["seed"], device)
        tracker = (
            TensorMemoryTracker(budget_bytes(cfg, device), list(applied.model.parameters()))
            if device == "cpu"
            else contextlib.nullcontext()
        )
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with tracker:
            for step in range(cfg["search"]["trial_steps"]):
                x, y = batches.next()
                train_step(applied, opt, x, y, step, train_cfg)
        if device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / MIB
        else:
            peak = tracker.peak / MIB
    except Exception as err:
        if not is_oom(err):
            raise
        fits = False
    # Nothing of the trial may survive into the next one: drop every reference, empty the cache.
    applied = opt = batches = tracker = x = y = None
    free_memory(device)
    return {
        "batch": batch,
        "fits": fits,
        "peak_mib": peak,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def search_max_batch(
    cfg: dict, technique: str, data: TokenData, device: str, progress=print
) -> dict:
    spec = technique_spec(cfg, technique)
    if device == "cpu" and cfg["search"]["cpu_memory_budget_gib"] is None:
        raise MemoptError(
            "search.cpu_memory_budget_gib: None is not allowed on a CPU (there is no device "
            "memory to run out of); allowed: a number > 0 (GiB of tracked tensor memory), e.g. "
            "--config \"search={'cpu_memory_budget_gib': 0.0625}\""
        )
    limit_gpu_memory(cfg, device)
    cap = min(cfg["search"]["max_batch"], data.max_batch(cfg["model"]["seq_len"]))
    t0, trials = time.perf_counter(), []

    def fits(batch: int) -> bool:
        trials.append(_trial(cfg, spec, data, batch, device))
        t = trials[-1]
        progress(
            f"[search {technique}] batch {batch}: {'fits' if t['fits'] else 'out of memory'}"
            f" ({t['seconds']:.1f} s)"
        )
        return t["fits"]

    lo, hi, batch = 0, None, 1
    while hi is None:
        batch = min(batch, cap)
        if not fits(batch):
            hi = batch
        elif batch == cap:
            break
        else:
            lo, batch = batch, batch * 2
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    else:
        lo = cap
    status = "capped" if hi is None else ("none_fits" if lo == 0 else "ok")
    budget = budget_bytes(cfg, device)
    if budget is None and device == "cuda":
        budget = torch.cuda.get_device_properties(0).total_memory
    return {
        "technique": technique,
        "spec": spec,
        "status": status,
        "max_batch": lo,
        "first_failing_batch": hi,
        "cap": cap,
        "budget_mib": budget / MIB,
        "device": device,
        "seconds": round(time.perf_counter() - t0, 3),
        "trials": trials,
    }
