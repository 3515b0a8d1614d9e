"""The processes of a study, read from /proc (Linux): a job stops when the Snakemake process that
started it dies, and an unlock refuses while a study's processes (or, on a SLURM cluster, its
SLURM jobs) still run.

Snakemake killed alone (`kill -9` of its pid, an OOM kill) leaves its jobs' processes running:
they would finish and write results no Snakemake records, and race the next run. Every job
therefore watches the Snakemake process it runs under and, once that process is gone, kills what
it started (a torchrun launch, a figure pool, a warm worker it spawned) and exits; a warm worker
serving it sees its client go and exits as well (memopt.run.worker). Without /proc nothing is watched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PROC = Path("/proc")
POLL_S = 1.0
# How a study's jobs show on their command line: a job's script (Snakemake copies it under
# .snakemake/scripts/), a torchrun launch of a parallel technique. A warm worker is not one: it runs
# a job only while that job's script is connected, and exits when the script is gone.
JOB_MARKS = ("/.snakemake/scripts/", "memopt.run.distributed", "torchrun")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process; None when it is gone (or dead and
    not yet reaped: a zombie)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the name before it may hold spaces and parens
    return None if fields[0] in ("Z", "X") else (int(fields[1]), int(fields[19]))


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_snakemake(args: list[str]) -> bool:
    """`snakemake ...`, `python -m snakemake ...` or python running snakemake's __main__.py."""
    for i, arg in enumerate(args[:3]):
        if Path(arg).name == "snakemake" or arg.endswith("/snakemake/__main__.py"):
            return True
        if arg == "-m" and i + 1 < len(args) and args[i + 1] == "snakemake":
            return True
    return False


def snakemake_ancestor(pid: int | None = None) -> tuple[int, int] | None:
    """(pid, start time) of the nearest Snakemake process above `pid` (default: this one)."""
    stat = _stat(pid or os.getpid())
    while stat is not None and stat[0] > 1:
        parent = stat[0]
        stat = _stat(parent)
        if stat is not None and is_snakemake(cmdline(parent)):
            return parent, stat[1]
    return None


def descendants(pid: int) -> list[int]:
    """Every living process below `pid`, children before their own children."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def _watch(owner: tuple[int, int], poll_s: float) -> None:
    while (stat := _stat(owner[0])) is not None and stat[1] == owner[1]:
        time.sleep(poll_s)
    print(
        f"memopt: the Snakemake process that started this job (pid {owner[0]}) is gone: "
        "stopping the job; it wrote no result",
        file=sys.stderr,
        flush=True,
    )
    for child in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
    os._exit(1)


_watching: list[tuple[int, int]] = []


def stop_with_snakemake(poll_s: float = POLL_S) -> tuple[int, int] | None:
    """Exit this process (and kill what it started) once the Snakemake process above it is gone;
    returns that process's (pid, start time), or None when there is none (the `memopt` command).
    Idempotent: one watcher per process."""
    if _watching:
        return _watching[0]
    owner = snakemake_ancestor()
    if owner is not None:
        _watching.append(owner)
        threading.Thread(target=_watch, args=(owner, poll_s), daemon=True).start()
    return owner


def study_processes(workdir: Path) -> list[tuple[int, str]]:
    """(pid, command line) of the Snakemake runs and memopt jobs whose working directory is
    `workdir` (this process and its ancestors left out), e.g. an orphaned job after `kill -9`."""
    workdir, mine = Path(workdir).resolve(), {os.getpid()}
    stat = _stat(os.getpid())
    while stat is not None and stat[0] > 0:
        mine.add(stat[0])
        stat = _stat(stat[0])
    found = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:  # gone, or another user's
            continue
        args = cmdline(int(entry.name))
        if cwd == workdir and (is_snakemake(args) or any(m in a for a in args for m in JOB_MARKS)):
            found.append((int(entry.name), " ".join(args)))
    return sorted(found)


def slurm_jobs(workdir: Path) -> list[tuple[str, str]]:
    """(job id, comment) of this user's queued or running SLURM jobs that Snakemake's SLURM
    executor submitted from `workdir` (it sets their working directory and a comment
    `rule_<name>...`). A login node's Snakemake killed with -9 cannot cancel them: they run on.
    None where squeue is not installed."""
    if shutil.which("squeue") is None:
        return []
    try:
        out = subprocess.run(
            ["squeue", "--me", "--noheader", "--format=%i|%Z|%k"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        job, folder, comment = (line.split("|", 2) + ["", ""])[:3]
        if comment.startswith("rule_") and Path(folder.strip()) == Path(workdir).resolve():
            found.append((job.strip(), comment.strip()))
    return found


def wait_for_study_processes(workdir: Path, seconds: float) -> list[tuple[int | str, str]]:
    """Nothing once the study's processes and SLURM jobs are gone, else those still there after
    `seconds`: (pid, command line), or (SLURM job id, its comment)."""
    end = time.monotonic() + seconds
    while True:
        running = study_processes(workdir) + slurm_jobs(workdir)
        if not running or time.monotonic() >= end:
            return running
        time.sleep(0.5)
