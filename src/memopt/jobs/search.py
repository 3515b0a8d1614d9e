"""The largest batch a technique trains at within the memory budget.

A trial runs `search.trial_steps` full training steps (forward, backward, clipping, optimizer; at
least two, so the optimizer state exists). The answer B is proven: B fits and B + g does not
(g = `search.granularity`), and both trials are recorded. Out of memory means "does not fit"; any
other error is raised.

Strategy `fit` (the default): peak memory grows almost linearly in the batch, so two small probes
give peak(B) ~ fixed + per_sample * B, and a third at a quarter of their guess shortens the
extrapolation; the search tries the predicted boundary, refits on every success, walks away from
a miss (one step, then doubling steps) and bisects what is left. Strategy `bisect`:
plain doubling, then bisection (about 2 log2 B trials), kept for comparison.

Trials run in this process. A fresh process per trial would cost a Python, torch and CUDA start
(seconds) for every trial; instead every reference of a trial is dropped and the CUDA cache
emptied before the next, and tests check that results do not depend on the search order.
"""

from __future__ import annotations

import contextlib
import time
from functools import partial

import torch

from memopt.config import technique_spec
from memopt.data.tokens import Batches, TokenData
from memopt.errors import MemoptError
from memopt.jobs.outcome import guarded, stamp
from memopt.runtime import parallel
from memopt.runtime.measure import MIB, TensorMemoryTracker
from memopt.runtime.step import (
    budget_bytes,
    free_memory,
    limit_gpu_memory,
    technique_optimizer,
    train_step,
)
from memopt.runtime.techniques import apply_technique, compile_cache_counts


def _trial_steps(cfg: dict, spec: dict, data: TokenData, batch: int, device: str) -> dict:
    """`search.trial_steps` training steps at `batch`: their peak memory and, on CUDA, the last
    step's time. Every reference of the trial dies with this frame."""
    train_cfg = cfg["train"]
    applied = apply_technique(spec, cfg["model"], data.vocab_size, train_cfg["seed"], device)
    opt = technique_optimizer(applied, spec, train_cfg, device)
    # `batch` is one GPU's micro-batch: a step trains grad_accum of them on every GPU.
    sequences = batch * spec["grad_accum"] * parallel.world()
    part = (parallel.rank(), parallel.world())
    seq_len = cfg["model"]["seq_len"]
    batches = Batches(data.train, seq_len, sequences, train_cfg["seed"], device, part)
    tracker = (
        TensorMemoryTracker(budget_bytes(cfg, device), list(applied.model.parameters()))
        if device == "cpu"
        else contextlib.nullcontext()
    )
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steps = cfg["search"]["trial_steps"]
    with tracker:
        for step in range(steps):
            x, y = batches.next()
            if device == "cuda" and step == steps - 1:
                torch.cuda.synchronize()  # the last step alone: a rough speed at this batch
                t_last = time.perf_counter()
            train_step(applied, opt, x, y, step, train_cfg)
    if device != "cuda":
        return {"status": "ok", "peak_mib": tracker.peak / MIB, "peak_reserved_mib": tracker.peak / MIB,
                "last_step_ms": None}  # fmt: skip
    torch.cuda.synchronize()
    return {
        "status": "ok",
        "peak_mib": torch.cuda.max_memory_allocated() / MIB,
        "peak_reserved_mib": torch.cuda.max_memory_reserved() / MIB,
        "last_step_ms": (time.perf_counter() - t_last) * 1e3,
    }


def _trial(cfg: dict, spec: dict, data: TokenData, batch: int, device: str) -> dict:
    """One trial: fits or out of memory (memopt.jobs.outcome), its memory freed before the next."""
    t0 = time.perf_counter()
    work = partial(_trial_steps, cfg, spec, data, batch, device)
    out = guarded(work, device, batch, ("peak_mib", "peak_reserved_mib", "last_step_ms"))
    return {
        "batch": batch,
        "fits": out["status"] == "ok",
        # Every rank must take the search's next step alike: the fit follows the fullest one.
        "peak_mib": parallel.max_over_ranks(out["peak_mib"]),
        "peak_reserved_mib": parallel.max_over_ranks(out["peak_reserved_mib"]),
        # CUDA only (a CPU trial runs under the slow memory tracker): one synchronized step.
        "last_step_ms": out["last_step_ms"],
        "seconds": round(time.perf_counter() - t0, 3),
        "compile_cache": compile_cache_counts() if spec["compile"] else None,
    }


def _linear_fit(ok: dict[int, float]):
    """(fixed, per_sample) in MiB through the largest fitting batch and the largest one at most
    half of it (else the smallest), or None. The pair is wide, since neighbouring batches differ by
    less than the allocator's rounding, but leaves out the tiniest batches when it can: there a
    fixed floor (workspaces, the allocator's minimum blocks) is a visible part of the peak, and
    extrapolated 50x it made the H100's first guess for fp32 with checkpointing 20% too large."""
    if len(ok) < 2:
        return None
    b2 = max(ok)
    b1 = max((b for b in ok if 2 * b <= b2), default=min(ok))
    p1, p2 = ok[b1], ok[b2]
    per_sample = (p2 - p1) / (b2 - b1)
    return (p1 - per_sample * b1, per_sample) if per_sample > 0 else None


def _fit_search(test, g: int, cap: int, available_mib: float, first: int | None = None) -> dict:
    """Find lo (fits) and hi = lo + g (fails) with few trials; `test(b)` -> peak MiB or None.
    The first fit uses probes at `first` (default g) and 4 g."""
    ok, tried, lo, hi = {}, set(), 0, None
    first_guess, up, down, guessed = None, g, None, False

    def run(b):
        nonlocal lo, hi
        tried.add(b)
        peak = test(b)
        if peak is None:
            hi = b if hi is None else min(hi, b)
        else:
            ok[b], lo = peak, max(lo, b)
        return peak is not None

    for b in sorted({min(first or g, cap), min(4 * g, cap)}):  # two probes for the first fit
        if not run(b):
            break
    fit = _linear_fit(ok)
    if fit is not None and hi is None:  # a third at a quarter of their guess: a short extrapolation
        guess = int((available_mib - fit[0]) / fit[1]) // g * g
        if 32 * g <= guess <= cap:  # (beyond the cap the cap itself is tried next)
            run(guess // 4 // g * g)
    while lo < cap and (hi is None or hi - lo > g):
        upper = cap if hi is None else hi - g
        fit = _linear_fit(ok)
        guess = None if fit is None else int((available_mib - fit[0]) / fit[1]) // g * g
        if first_guess is None:
            first_guess = guess
        if guess is not None and hi is None and guess > cap:
            b = cap  # everything up to the cap should fit: check the cap itself
        elif guess is not None and lo < guess <= upper and guess not in tried:
            b = guess  # the refitted prediction
        elif guessed and lo + g <= upper:
            b = lo + g  # the last prediction fitted: is it the boundary?
        elif hi is None:
            b, up = min(lo + up if fit else 2 * lo, cap), up * 2  # gallop up
        else:
            # A miss is usually a little above the boundary: walk down from it, first one step
            # (a fresh prediction's miss is mostly off by one), then in doubling steps from 2% of
            # the batch, never below the midpoint (worst case: bisection).
            down = down or g
            b = max(hi - down, lo + (hi - lo) // (2 * g) * g)
            down = max(2 * down, hi // 50 // g * g)
        if b == guess:
            down = None  # a fresh prediction: a miss restarts the walk with small steps
        guessed = run(b) and b == guess
    return {"lo": lo, "hi": hi, "fit": _linear_fit(ok), "first_guess": first_guess}


def _bisect_search(test, g: int, cap: int) -> dict:
    lo, hi, b = 0, None, g
    while hi is None and lo < cap:
        b = min(b, cap)
        if test(b) is None:
            hi = b
        else:
            lo, b = b, 2 * b
    while hi is not None and hi - lo > g:
        mid = lo + (hi - lo) // (2 * g) * g
        lo, hi = (mid, hi) if test(mid) is not None else (lo, mid)
    return {"lo": lo, "hi": hi, "fit": None, "first_guess": None}


def available_mib(cfg: dict, device: str) -> float:
    """Memory a trial may take: the budget, or on a GPU what is free (plus our own cache), less
    search.headroom_mib there. A full run adds memory outside PyTorch's allocator that a short
    trial does not (CUDA context growth, library workspaces, fragmentation over many steps): on
    the H100, cells at a batch that fit by 0.4 GiB in the search ran out of memory."""
    budget = budget_bytes(cfg, device)
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        free += torch.cuda.memory_reserved()
        budget = free if budget is None else min(budget, free)
        headroom = cfg["search"]["headroom_mib"] * MIB
        if headroom >= budget:
            raise MemoptError(
                f"search.headroom_mib: {cfg['search']['headroom_mib']} is not allowed here; "
                f"allowed: less than the {budget / MIB:,.0f} MiB this GPU has available"
            )
        budget -= headroom
    return budget / MIB


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
    free_memory(device)
    search = cfg["search"]
    g = search["granularity"]
    cap = min(search["max_batch"], data.max_batch(cfg["model"]["seq_len"])) // g * g
    avail = parallel.min_over_ranks(available_mib(cfg, device))
    if device == "cuda":  # trials may use `avail` and no more: the headroom stays free
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, avail * MIB / torch.cuda.get_device_properties(0).total_memory)
        )
    trials = []
    # A parallel search started again after a rank ran out of memory: its trials so far, and
    # its start (its seconds count every launch).
    known = {t["batch"]: t for t in parallel.saved("trials") or []}
    started = parallel.saved("search_started") or time.time()
    parallel.barrier()  # every rank has read them before rank 0 writes them again
    parallel.save("search_started", started)

    def test(batch: int):
        trials.append(known.get(batch) or _trial(cfg, spec, data, batch, device))
        parallel.save("trials", trials)
        t = trials[-1]
        progress(
            f"[search {technique}] batch {batch}: "
            + (f"fits, peak {t['peak_mib']:,.0f} MiB" if t["fits"] else "out of memory")
            + f" ({t['seconds']:.1f} s{', an earlier launch' if batch in known else ''})"
        )
        # The fit follows allocated memory: near the limit the caching allocator reserves
        # whatever is free, so peak reserved is no function of the batch (seen on the H100).
        return t["peak_mib"] if t["fits"] else None

    if cap < g:
        found = {"lo": 0, "hi": None, "fit": None, "first_guess": None}
    elif search["strategy"] == "fit":
        # A compiled model specializes batch 1 (its own graph, ~30 s on an H100); from batch 2
        # one dynamic-batch graph serves every trial (memopt.runtime.techniques.dynamic_batch).
        first = 2 * g if spec["compile"] else g
        found = _fit_search(test, g, cap, avail, first)
    else:
        found = _bisect_search(test, g, cap)
    lo, hi, fit = found["lo"], found["hi"], found["fit"]
    status = "capped" if hi is None else ("none_fits" if lo == 0 else "ok")
    result = {
        "technique": technique,
        "spec": spec,
        "status": status,
        "max_batch": lo,
        "first_failing_batch": hi,
        "granularity": g,
        "cap": cap,
        "strategy": search["strategy"],
        "budget_mib": avail,
        "headroom_mib": search["headroom_mib"] if device == "cuda" else None,
        "fit": None if fit is None else {"fixed_mib": fit[0], "per_sample_mib": fit[1]},
        "predicted_batch": found["first_guess"],
        "prediction_error": None if found["first_guess"] is None else found["first_guess"] - lo,
        "allocator": cfg["measure"]["cuda_alloc_conf"] if device == "cuda" else None,
        "device": device,
        "seconds": round(time.time() - started, 3),
        "trials": trials,
    }
    # The GPU leased for the search included.
    return stamp(result, cfg, spec, device, ("model", "train", "measure", "search"))
