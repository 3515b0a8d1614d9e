"""Measuring: step timers, peak memory (CUDA allocator, or tracked tensor memory on a CPU),
summary statistics and provenance."""

from __future__ import annotations

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

MIB = 2**20


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


def flops_per_token(model_cfg: dict, vocab_size: int, window: int | None) -> float:
    """Model FLOPs per trained token (forward + backward; recomputation is not counted).

    6 * N_matmul (every weight matrix, the tied output head included) plus attention's two
    matmuls: 4 * d_model * keys per layer forward, times 3 with the backward pass, where keys is
    the average number of keys a query sees (causal: (T + 1) / 2; with window W: min(i + 1, W)).
    """
    d, L, f, T = (model_cfg[k] for k in ("d_model", "n_layers", "d_ff", "seq_len"))
    n_matmul = L * (4 * d * d + 2 * d * f) + d * vocab_size
    w = T if window is None else min(window, T)
    keys = (w * (w + 1) / 2 + (T - w) * w) / T
    return 6 * n_matmul + 12 * L * d * keys


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


def summarize(values: list[float]) -> dict:
    """mean, median, std, p10, p90 of a sample."""
    s = sorted(values)

    def pct(p):
        k = (len(s) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {
        "mean": statistics.fmean(s),
        "median": statistics.median(s),
        "std": statistics.stdev(s) if len(s) > 1 else 0.0,
        "p10": pct(0.1),
        "p90": pct(0.9),
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
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


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
        "flash_attn": flash_attn_version,
        "git_commit": git_commit(),
    }


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
