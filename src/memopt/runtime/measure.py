"""Measuring: step timers, peak memory (CUDA allocator, or tracked tensor memory on a CPU),
summary statistics and provenance."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import memopt
from memopt.runtime.lease import INDEX_ENV, LEASE_ENV, nvidia_smi

MIB = 2**20
# When the running job got its GPU (memopt.run.worker.run_job sets it): provenance records it with the
# job's end, so that jobs on one GPU can be shown never to overlap, and jobs on several to overlap.
_job_started: list[float | None] = [None]


def mark_job_started(t: float | None) -> None:
    _job_started[0] = t


def _utc(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class MemoryBudgetExceeded(RuntimeError):
    """Tracked tensor memory went over the budget: the CPU's stand-in for a CUDA out-of-memory."""


def is_oom(err: BaseException) -> bool:
    return isinstance(err, (torch.OutOfMemoryError, MemoryBudgetExceeded))


class TensorMemoryTracker(TorchDispatchMode):
    """Live and peak bytes of every tensor storage, counted op by op.

    A CPU has no caching allocator to read, so this plays its part: storages that exist when the
    tracker starts (weights, optimizer state) are counted too, and a storage counts until it dies.
    With a budget, an op that would take live memory over it raises MemoryBudgetExceeded.
    """

    def __init__(self, budget_bytes: float | None = None, existing=()):
        super().__init__()
        self.budget = budget_bytes
        self.live: dict[tuple[int, int], tuple[StorageWeakRef, int]] = {}
        self.current = self.peak = 0
        for t in existing:
            self._add(t)

    def _add(self, t) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        if hasattr(t, "__tensor_flatten__"):  # a wrapper (FSDP2's DTensor): the tensors inside
            for name in t.__tensor_flatten__()[0]:
                self._add(getattr(t, name))
            return
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        old = self.live.get(key)
        if old is not None:
            if not old[0].expired():
                return  # a view of a storage already counted
            self.current -= old[1]
        self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        if self.budget is not None and self.current > self.budget:
            raise MemoryBudgetExceeded(
                f"tracked tensor memory {self.current / MIB:.1f} MiB exceeds the budget "
                f"{self.budget / MIB:.1f} MiB"
            )

    def _sweep(self) -> None:
        for key, (ref, nbytes) in list(self.live.items()):
            if ref.expired():
                del self.live[key]
                self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for t in tree_leaves(out):
            self._add(t)
        return out


class MemoryProbe:
    """Allocated bytes now and the peak since the last reset: the CUDA caching allocator's
    counters on a GPU, the tracker's on a CPU."""

    def __init__(self, device: str, tracker: TensorMemoryTracker | None = None):
        self.cuda, self.tracker = device == "cuda", tracker

    def now(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else self.tracker.current

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated() if self.cuda else self.tracker.peak

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            self.tracker.peak = self.tracker.current


# Dense (no sparsity) BF16 tensor-core peaks from the vendors' datasheets, in TFLOP/s, matched
# against torch.cuda.get_device_name() in this order. Unknown GPUs get no MFU rather than a guess.
PEAK_BF16_TFLOPS = (
    ("H100 80GB HBM3", 989.0),  # H100 SXM5
    ("H100 SXM", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 756.0),  # other H100 names: the PCIe card's figure, the lower one
    ("H200", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("RTX 5090", 209.5),
    ("RTX 4090", 165.2),
)


def peak_bf16_flops(device_name: str) -> float | None:
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops * 1e12
    return None


class StepTimer:
    """Per-step wall time: CUDA events on a GPU (no host sync inside the step), perf_counter on a CPU."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.pairs, self.cpu_times, self._t0 = [], [], 0.0

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.pairs.append([ev, None])
        else:
            self._t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.pairs[-1][1] = ev
        else:
            self.cpu_times.append((time.perf_counter() - self._t0) * 1e3)

    def times_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.pairs]
        return list(self.cpu_times)

    def first_ms(self, n: int) -> list[float]:
        """Times of the first n steps. On CUDA this waits for step n's end event only, so the
        steps queued after it keep the GPU busy (no idle gap enters a later step's time)."""
        if not self.cuda:
            return self.cpu_times[:n]
        self.pairs[n - 1][1].synchronize()
        return [a.elapsed_time(b) for a, b in self.pairs[:n]]


def t_quantile_975(df: int) -> float:
    """The 97.5% quantile of Student's t with df degrees of freedom (Cornish-Fisher expansion
    around the normal's 1.95996; within 1% of the exact value for df >= 3, 0.1% for df >= 9)."""
    z = 1.959963984540054
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def ci95_half_width(values: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean (Student's t); inf below 2 values."""
    if len(values) < 2:
        return math.inf
    return t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def enough_timed_steps(times: list[float], measure_cfg: dict) -> bool:
    """The adaptive stopping rule: at least min_timed_steps, then stop once the 95% half-width of
    the mean is within target_rel_ci of the mean, at max_timed_steps, or once the timed steps
    (milliseconds) add up to max_timed_s (if set)."""
    n = len(times)
    if n < measure_cfg["min_timed_steps"]:
        return False
    if n >= measure_cfg["max_timed_steps"]:
        return True
    limit_s = measure_cfg.get("max_timed_s")
    if limit_s is not None and sum(times) >= 1000 * limit_s:
        return True
    return ci95_half_width(times) <= measure_cfg["target_rel_ci"] * statistics.fmean(times)


def summarize(values: list[float]) -> dict:
    """mean, median, std, p10, p90 and the 95% confidence half-width of the mean (absolute and
    relative to the mean) of a sample."""
    s = sorted(values)

    def pct(p):
        k = (len(s) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    mean = statistics.fmean(s)
    half = ci95_half_width(s)
    return {
        "mean": mean,
        "median": statistics.median(s),
        "std": statistics.stdev(s) if len(s) > 1 else 0.0,
        "p10": pct(0.1),
        "p90": pct(0.9),
        "ci95_half": half if math.isfinite(half) else None,
        "rel_ci95": half / mean if math.isfinite(half) and mean else None,
    }


# Counters of the CUDA caching allocator read before and after the timed steps: retries (a
# cudaMalloc failed, the cache was flushed and the allocation retried: a synchronizing slow path),
# out-of-memory errors, and cudaMalloc/cudaFree calls (with expandable segments: maps/unmaps).
ALLOCATOR_COUNTERS = {
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
    "device_allocs": "num_device_alloc",
    "device_frees": "num_device_free",
}


def allocator_counters(device: str) -> dict | None:
    if device != "cuda":
        return None
    stats = torch.cuda.memory_stats()
    return {name: stats.get(key) for name, key in ALLOCATOR_COUNTERS.items()}


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """after - before per counter (None where the allocator does not report it)."""
    if before is None or after is None:
        return None
    return {
        k: (after[k] - before[k]) if after[k] is not None and before[k] is not None else None
        for k in after
    }


def git_commit(root: Path | None = None) -> str | None:
    """HEAD of the checkout memopt runs from; MEMOPT_GIT_COMMIT names it for a copy without
    .git (e.g. a working tree shipped to a GPU machine)."""
    if os.environ.get("MEMOPT_GIT_COMMIT"):
        return os.environ["MEMOPT_GIT_COMMIT"]
    root = root or Path(memopt.__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_driver() -> str | None:
    rows = nvidia_smi("driver_version")
    return rows[0] if rows else None


def provenance(device: str) -> dict:
    try:
        import flash_attn

        flash_attn_version = flash_attn.__version__
    except ImportError:
        flash_attn_version = None
    cuda = device == "cuda"
    return {
        "memopt": memopt.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "driver": gpu_driver() if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cpu": platform.processor() or platform.machine(),
        "host": platform.node(),
        "gpu_uuid": str(torch.cuda.get_device_properties(0).uuid) if cuda else None,
        # The GPU leased for the job (memopt.runtime.lease): the host's index and the lock's key.
        "gpu_index": os.environ.get(INDEX_ENV),
        "gpu_lease": os.environ.get(LEASE_ENV),
        "flash_attn": flash_attn_version,
        "git_commit": git_commit(),
        "started": _utc(_job_started[0]),
        "finished": _utc(time.time()),
    }


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
