"""GPU leases: every training job (search, timing cell, quality run) holds one GPU of the host for
its lifetime, so `snakemake --resources gpu=N` runs N jobs on N different GPUs instead of N jobs on
GPU 0 (sharing its memory and corrupting each other's timings and maximum batches).

The GPUs a job may use are those of CUDA_VISIBLE_DEVICES if set (as Snakemake was started, or as
SLURM gives a job), else all of the host's (nvidia-smi). A lease is an exclusive `flock` on one
lock file per GPU, keyed by the GPU's UUID (a SLURM job's index 0 is another job's index 0 on the
same node): the operating system drops it when the process ends, however it ends (SIGKILL
included), so no state file can go stale. The holder pins itself and the processes it starts to
the GPU (CUDA_VISIBLE_DEVICES) before CUDA starts; one warm worker serves each GPU
(memopt.run.worker keys its socket by CUDA_VISIBLE_DEVICES). A job that finds every GPU leased waits.

MEMOPT_FAKE_GPUS (comma-separated names) replaces the host's GPUs, so tests can lease on a CPU;
MEMOPT_GPU_LOCK_DIR moves the lock files (default: `gpus/` in memopt's runtime folder, a checked
per-user folder in the local temp dir: memopt.runtime.private_dir; leases are per user and host). The lock
folder is checked the same way, and lock files are opened without following links.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from memopt.errors import MemoptError
from memopt.runtime.private_dir import open_private, private_dir, runtime_dir

FAKE_ENV = "MEMOPT_FAKE_GPUS"
LOCK_DIR_ENV = "MEMOPT_GPU_LOCK_DIR"
# What the lease tells the job's process (and its provenance): the GPU's key and host index.
LEASE_ENV, INDEX_ENV = "MEMOPT_GPU_LEASE", "MEMOPT_GPU_INDEX"


@dataclass(frozen=True)
class Gpu:
    visible: str  # what CUDA_VISIBLE_DEVICES gets: an index or a UUID, as the job was given it
    key: str  # the lock's name: the UUID where nvidia-smi knows it
    index: str  # the host's index (nvidia-smi's), or the visible entry


def nvidia_smi(query: str) -> list[str]:
    """nvidia-smi's CSV rows for `--query-gpu=<query>`, one per GPU; none without a driver."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines()] if out.returncode == 0 else []


def _host_gpus() -> list[tuple[str, str]]:
    """(index, uuid) of every GPU nvidia-smi sees."""
    rows = [line.split(",", 1) for line in nvidia_smi("index,uuid") if "," in line]
    return [(i.strip(), u.strip()) for i, u in rows]


def candidates() -> list[Gpu]:
    """The GPUs this job may lease, in order."""
    fake = os.environ.get(FAKE_ENV)
    if fake is not None:
        return [Gpu(g, g, g) for g in (x.strip() for x in fake.split(",")) if g]
    host = _host_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [Gpu(i, u, i) for i, u in host]
    by_index, by_uuid = dict(host), {u: i for i, u in host}
    gpus = []
    for entry in (x.strip() for x in visible.split(",")):
        if not entry or entry.startswith("-"):  # CUDA stops at the first invalid entry
            break
        if entry in by_index:
            gpus.append(Gpu(entry, by_index[entry], entry))
        else:  # a UUID (or MIG instance), or an index nvidia-smi does not list
            gpus.append(Gpu(entry, entry, by_uuid.get(entry, entry)))
    return gpus


def lock_dir() -> Path:
    """The checked folder of the lease lock files (created if missing)."""
    if os.environ.get(LOCK_DIR_ENV):
        return private_dir(Path(os.environ[LOCK_DIR_ENV]), env=LOCK_DIR_ENV)
    return private_dir(runtime_dir() / "gpus", repair=True)  # inside a checked folder


def _try_lock(path: Path) -> int | None:
    fd = open_private(path, os.O_RDWR | os.O_CREAT)  # not inherited by child processes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a curious user
    return fd


def _lock_path(folder: Path, gpu: Gpu) -> Path:
    return folder / (re.sub(r"[^A-Za-z0-9_.-]", "_", gpu.key) + ".lock")


def _try_lease(folder: Path, gpus: list[Gpu], count: int) -> list[tuple[Gpu, int]] | None:
    """`count` free GPUs, locked; None (nothing held) when fewer are free."""
    held = []
    for gpu in gpus:
        fd = _try_lock(_lock_path(folder, gpu))
        if fd is not None:
            held.append((gpu, fd))
            if len(held) == count:
                return held
    for _, fd in held:  # all or nothing: two jobs each holding half of what they need would wait
        os.close(fd)  # for each other forever
    return None


@contextlib.contextmanager
def gpu_lease(progress=print, poll_s: float = 1.0, require: bool = False, count: int = 1):
    """Hold `count` free GPUs for the block (a parallel technique's job holds several:
    memopt.runtime.parallel): CUDA_VISIBLE_DEVICES names them alone, MEMOPT_GPU_LEASE and
    MEMOPT_GPU_INDEX say which ones (comma-separated); yields the Gpus, or None where there is
    no GPU list (with a warning where `require`: a CUDA study). Waits while too few are free; the
    environment is restored afterwards."""
    gpus = candidates()
    if not gpus:
        if require:
            progress(
                "memopt: no GPU list (nvidia-smi found none, CUDA_VISIBLE_DEVICES is unset): "
                "this job runs without a GPU lease; run one training job at a time (gpu=1)"
            )
        yield None
        return
    if count > len(gpus):
        raise MemoptError(
            f"this job needs {count} GPUs (the technique's gpus) and may use {len(gpus)} "
            f"({', '.join(g.index for g in gpus)}); allowed: gpus up to {len(gpus)} here, or "
            "a host (CUDA_VISIBLE_DEVICES, a SLURM allocation) with more"
        )
    folder = lock_dir()
    waiting_since = None
    while (held := _try_lease(folder, gpus, count)) is None:
        if waiting_since is None:
            waiting_since = time.monotonic()
            names = ", ".join(g.index for g in gpus)
            progress(
                f"memopt: too many of the GPUs this job may use ({names}) are leased; waiting for "
                + ("one" if count == 1 else f"{count} at once")
            )
        time.sleep(poll_s)
    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", LEASE_ENV, INDEX_ENV)}
    try:
        leased = [gpu for gpu, _ in held]
        if waiting_since is not None:
            waited = time.monotonic() - waiting_since
            names = ", ".join(g.index for g in leased)
            progress(f"memopt: GPU {names} leased after {waited:.0f} s")
        # By UUID where known: nvidia-smi's indices follow the PCI order, CUDA's speed.
        pins = [g.key if g.key.startswith(("GPU-", "MIG-")) else g.visible for g in leased]
        os.environ.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(pins),
                LEASE_ENV: ",".join(g.key for g in leased),
                INDEX_ENV: ",".join(g.index for g in leased),
            }
        )
        yield leased[0] if count == 1 else leased
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for _, fd in held:
            os.close(fd)  # releases the lease
