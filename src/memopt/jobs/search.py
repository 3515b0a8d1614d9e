"""The largest batch a technique trains at within the memory budget.

A trial runs `search.trial_steps` full training steps (forward, backward, clipping, optimizer; at
least two, so the optimizer state exists). The answer B is proven: B fits and B + g does not
(g = `search.granularity`), and both trials are recorded. A trial fits when it trains and, on a
GPU, its allocated peak stays `search.allocator_slack_mib` below the budget: near the budget the
caching allocator keeps 60-250 MiB reserved but unallocated (on the H100's map searches), so
there a batch runs out of memory or not by chance, while the allocated peak repeats to the MiB.
Out of memory, or a peak past that limit, means "does not fit"; any other error is raised.

Strategy `fit` (the default) aims every trial from what the earlier ones measured: each phase's
peak memory (forward, backward, optimizer step) and, with offloaded activations, the host's
pinned memory, each close to linear in the batch (memopt.jobs.bracket says how; at most 8
trials on the curves its tests draw). The first trial is the maximum `memopt plan`
predicts (search.from_plan; memopt.plan.memory) and the second the batch after it: a right
prediction is proven in 2 trials, and a third at half of it gives the memory line (on the
synthetic curves of tests/test_bracket.py at most 8 from a prediction 90% low to 3% high, 10
from one higher). Strategy `bisect`: plain doubling, then bisection (about 2 log2 B trials),
kept for comparison. The search's upper bound is the data's and an optional `search.max_batch`,
never a round number below memory.

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
from memopt.jobs.bracket import prove_max
from memopt.jobs.host_bound import host_bound
from memopt.jobs.outcome import guarded, stamp
from memopt.runtime import parallel
from memopt.runtime.measure import MIB, MemoryProbe, TensorMemoryTracker
from memopt.runtime.offload import host_budget_bytes
from memopt.runtime.step import (
    budget_bytes,
    free_memory,
    limit_gpu_memory,
    technique_optimizer,
    train_step,
)
from memopt.runtime.techniques import apply_technique, compile_cache_counts

PHASES = ("forward", "backward", "optimizer")


def _trial_steps(cfg: dict, spec: dict, data: TokenData, batch: int, device: str) -> dict:
    """`search.trial_steps` training steps at `batch`: the peak memory of each phase, the memory
    that exists before a batch (weights, optimizer state: at the last step's start), the host's
    pinned bytes of offloaded activations and, on CUDA, the last step's time. Every reference of
    the trial dies with this frame."""
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
    probe = MemoryProbe(device, tracker if device == "cpu" else None)
    phases, reserved = dict.fromkeys(PHASES, 0), [0]

    def mark(phase: str) -> None:  # allocator counters only: no synchronization
        phases[phase] = max(phases[phase], probe.peak())
        if device == "cuda":
            reserved[0] = max(reserved[0], torch.cuda.max_memory_reserved())
        probe.reset_peak()

    steps, state, host, host_tensors = cfg["search"]["trial_steps"], 0, 0, {}
    with tracker:
        probe.reset_peak()
        for step in range(steps):
            x, y = batches.next()
            if step == steps - 1:
                state = probe.now()
                if device == "cuda":
                    torch.cuda.synchronize()  # the last step alone: a rough speed at this batch
                    t_last = time.perf_counter()
            train_step(applied, opt, x, y, step, train_cfg, mark)
            if applied.offloaded is not None and applied.offloaded.bytes >= host:
                host, host_tensors = applied.offloaded.bytes, applied.offloaded.sizes
    out = {
        "status": "ok",
        "peak_mib": max(phases.values()) / MIB,
        "phase_peak_mib": {k: v / MIB for k, v in phases.items()},
        "state_mib": state / MIB,
        "host_pinned_mib": host / MIB if spec["offload"] != "none" else None,
        # The offloaded tensors' sizes, from which the search predicts the host's limit exactly.
        "host_tensors": sorted(host_tensors.items()) if spec["offload"] != "none" else None,
        "peak_reserved_mib": max(phases.values()) / MIB,
        "last_step_ms": None,  # a CPU trial runs under the slow memory tracker
    }
    if device == "cuda":
        torch.cuda.synchronize()
        out["last_step_ms"] = (time.perf_counter() - t_last) * 1e3
        out["peak_reserved_mib"] = reserved[0] / MIB
    return out


MEASURED = ("peak_mib", "phase_peak_mib", "state_mib", "host_pinned_mib", "host_tensors",
            "peak_reserved_mib", "last_step_ms")  # fmt: skip


def _trial(
    cfg: dict, spec: dict, data: TokenData, batch: int, device: str, limit_mib: float | None
) -> dict:
    """One trial, its memory freed before the next: it fits when it trains (memopt.jobs.outcome)
    and its peak is within `limit_mib` (None: any peak)."""
    t0 = time.perf_counter()
    work = partial(_trial_steps, cfg, spec, data, batch, device)
    out = guarded(work, device, batch, MEASURED, keep_host_cache=True)  # the search frees it
    phases = out["phase_peak_mib"] or {}
    # Every rank must take the search's next step alike: the fit follows the fullest one.
    peak = parallel.max_over_ranks(out["peak_mib"])
    trained = out["status"] == "ok"
    return {
        "batch": batch,
        "fits": trained and (limit_mib is None or peak <= limit_mib),
        "out_of_memory": not trained,
        "peak_mib": peak,
        "phase_peak_mib": {k: parallel.max_over_ranks(v) for k, v in phases.items()} or None,
        "state_mib": parallel.max_over_ranks(out["state_mib"]),
        "host_pinned_mib": parallel.max_over_ranks(out["host_pinned_mib"]),
        "host_tensors": out["host_tensors"],
        "peak_reserved_mib": parallel.max_over_ranks(out["peak_reserved_mib"]),
        # CUDA only (a CPU trial runs under the slow memory tracker): one synchronized step.
        "last_step_ms": out["last_step_ms"],
        "seconds": round(time.perf_counter() - t0, 3),
        "compile_cache": compile_cache_counts() if spec["compile"] else None,
        **({"error": out["error"]} if "error" in out else {}),
    }


def _bisect_search(test, cap: int) -> dict:
    """Doubling, then bisection, in units of the granularity (`strategy: bisect`)."""
    lo, hi, k, order = 0, None, 1, []
    while hi is None and lo < cap:
        k = min(k, cap)
        order.append((k, test(k) is not None))
        lo, hi, k = (k, None, 2 * k) if order[-1][1] else (lo, k, k)
    while hi is not None and hi - lo > 1:
        mid = lo + (hi - lo) // 2
        order.append((mid, test(mid) is not None))
        lo, hi = (mid, hi) if order[-1][1] else (lo, mid)
    return {"lo": lo, "hi": hi, "first_guess": None, "order": order}


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


def limit_trials(cfg: dict, device: str) -> float:
    """What a trial may use (MiB, the fullest rank's least), set as this process's limit on a
    GPU so the headroom stays free: a check of the answer outside the search sets it too."""
    avail = parallel.min_over_ranks(available_mib(cfg, device))
    if device == "cuda":
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, avail * MIB / torch.cuda.get_device_properties(0).total_memory)
        )
    return avail


def fit_limit_mib(cfg: dict, device: str, avail: float) -> float:
    """The allocated peak a fitting trial may reach (MiB): on a GPU the budget less
    search.allocator_slack_mib, on a CPU (whose tracker has no cache) the budget."""
    if device != "cuda":
        return avail
    slack = cfg["search"]["allocator_slack_mib"]
    if slack >= avail:
        raise MemoptError(
            f"search.allocator_slack_mib: {slack} is not allowed here; allowed: less than the "
            f"{avail:,.0f} MiB a trial may use on this GPU"
        )
    return avail - slack


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
    data_max = data.max_batch(cfg["model"]["seq_len"])
    cap = min(search["max_batch"] or data_max, data_max) // g * g
    avail = limit_trials(cfg, device)
    fit_limit = fit_limit_mib(cfg, device, avail)
    # What a trial may use of each resource: GPU memory in every phase (the allocator's
    # allocated bytes: near the limit it reserves whatever is free, so peak reserved is no
    # function of the batch), and the host's pinned memory for offloaded activations.
    limits = dict.fromkeys(PHASES, fit_limit)
    host_budget = host_budget_bytes() if spec["offload"] != "none" else None
    trials, state = [], {}
    # A parallel search started again after a rank ran out of memory: its trials so far, and
    # its start (its seconds count every launch).
    known = {t["batch"]: t for t in parallel.saved("trials") or []}
    started = parallel.saved("search_started") or time.time()
    parallel.barrier()  # every rank has read them before rank 0 writes them again
    parallel.save("search_started", started)

    def test(k: int):
        batch = k * g
        trials.append(known.get(batch) or _trial(cfg, spec, data, batch, device, fit_limit))
        parallel.save("trials", trials)
        t = trials[-1]
        if t.get("out_of_memory", not t["fits"]):  # (a trial saved by older code)
            verdict = "out of memory"
        else:
            verdict = f"{'fits' if t['fits'] else 'over the limit'}, peak {t['peak_mib']:,.0f} MiB"
        progress(
            f"[search {technique}] trial {len(trials)}, batch {batch}: {verdict}"
            + f" ({t['seconds']:.1f} s{', an earlier launch' if batch in known else ''})"
        )
        if t["fits"] and not state:  # weights and optimizer state: what exists before a batch
            state.update(dict.fromkeys(PHASES, t["state_mib"]), host=0.0)
        return _usage(t) if t["fits"] else None

    planned = None  # memopt plan's maximum (where it models every knob), as a batch tried
    if search["from_plan"] and search["strategy"] == "fit":
        planned = planned_batch(cfg, spec, data.vocab_size, fit_limit, host_budget, cap, device)
        planned = (planned or 0) // g * g or None
    if cap < g:
        found = {"lo": 0, "hi": None, "first_guess": None}
    elif search["strategy"] == "fit":
        # A compiled model specializes batch 1 (its own graph, ~30 s on an H100); from batch 2
        # one dynamic-batch graph serves every trial (memopt.runtime.techniques.dynamic_batch).
        first = 2 if spec["compile"] else 1
        chunk = (cfg["model"]["seq_len"], spec["loss_chunk"]) if spec["loss"] == "chunked" else None
        bound = None if host_budget is None else partial(host_bound, trials, g, host_budget, cap,
                                                         chunk=chunk)  # fmt: skip
        start_at = planned // g if planned else None
        found = prove_max(test, cap // g, limits, state, first, bound, start_at)
        spread = [t["batch"] for t in trials if t["fits"]]
        if start_at and spread and 2 * min(spread) > max(spread) and found["lo"] // 2 >= first:
            test(found["lo"] // 2)  # one fit at half the maximum: the memory line (_line)
    else:
        found = _bisect_search(test, cap // g)
    free_memory(device)  # the pinned buffers the trials kept too
    lo = found["lo"] * g
    hi = None if found["hi"] is None else found["hi"] * g
    guess = found["first_guess"]
    guess = None if guess is None else int(guess) * g
    fit = _line([t for t in trials if t["fits"]])
    status = "capped" if hi is None else ("none_fits" if lo == 0 else "ok")
    result = {
        "technique": technique,
        "spec": spec,
        "status": status,
        "max_batch": lo,
        "first_failing_batch": hi,
        "granularity": g,
        "cap": cap,
        "cap_from": "data" if cap == data_max // g * g else "search.max_batch",
        "strategy": search["strategy"],
        "budget_mib": avail,
        "allocator_slack_mib": avail - fit_limit if device == "cuda" else None,
        "fit_limit_mib": fit_limit,
        "host_budget_mib": None if host_budget is None else host_budget / MIB,
        "headroom_mib": search["headroom_mib"] if device == "cuda" else None,
        "fit": fit,
        "predicted_batch": guess,
        "prediction_error": None if guess is None or status != "ok" else guess - lo,
        "plan_batch": planned,
        "plan_error": None if planned is None or status != "ok" else planned - lo,
        "allocator": cfg["measure"]["cuda_alloc_conf"] if device == "cuda" else None,
        "device": device,
        "n_trials": len(trials),
        "seconds": round(time.time() - started, 3),
        "trials": trials,
    }
    # The GPU leased for the search included.
    return stamp(result, cfg, spec, device, ("model", "train", "measure", "search"))


def planned_batch(cfg, spec, vocab, limit_mib, host_budget, cap, device="cuda") -> int | None:
    """memopt plan's maximum batch (within the cap) on `device` (a GPU's allocator, or a CPU's
    tracked tensors), or None where it models not every knob."""
    from memopt.plan.memory import CALIBRATION, largest_batch, unmodelled

    if unmodelled(spec, device):
        return None
    host = None if host_budget is None else host_budget / MIB
    return largest_batch(cfg["model"], vocab, spec, limit_mib, host, cap, CALIBRATION,
                         device)[0] or None  # fmt: skip


def _usage(trial: dict) -> dict:
    """A fitting trial's GPU memory in each phase, in MiB."""
    return dict(trial["phase_peak_mib"] or {"optimizer": trial["peak_mib"]})


def _line(fits: list[dict]) -> dict | None:
    """Peak memory against the batch, fixed and per-sequence MiB (what the paper and the map
    report), through the largest fit and the largest at most half of it (else the smallest):
    the search's last fits are often a batch or two apart, where the allocator's rounding
    would make most of the slope. None with fewer than two fits."""
    if len(fits) < 2:
        return None
    points = sorted((t["batch"], t["peak_mib"]) for t in fits)
    b2, p2 = points[-1]
    b1, p1 = max((p for p in points[:-1] if 2 * p[0] <= b2), default=points[0])
    per_sample = (p2 - p1) / (b2 - b1)
    return {"fixed_mib": p2 - per_sample * b2, "per_sample_mib": per_sample,
            "batches": [b1, b2]}  # fmt: skip
