"""Estimate a study's wall time on N GPUs from one run's job times (Snakemake benchmark files).

    python tools/study_critical_path.py RUN [--baseline NAME] [--gpus 1 2 4 8]

RUN is a directory (or .tar.gz) holding results/benchmarks/ of a finished run. The data rules run
first, one after another; then the training jobs on N GPUs, each GPU taking the longest ready job
whenever it is free (a list schedule: Snakemake's own order may differ); then the paper rules.
Dependencies are the workflow's: a cell waits for its technique's search and the baseline's, a
`max` cell for its `same` cell; quality runs wait for the data alone. The critical path is the
longest of these chains. An estimate from measured job times, not a measurement.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import tarfile
import tempfile
from pathlib import Path

import yaml

DATA = ("corpus", "tokenizer", "tokens")
PAPER = ("aggregate", "figures", "render", "pdf")


def job_times(bench: Path) -> dict[str, float]:
    out = {}
    for f in bench.rglob("*.tsv"):
        with open(f) as fh:
            out[str(f.relative_to(bench))[: -len(".tsv")]] = float(next(csv.DictReader(fh, delimiter="\t"))["s"])  # fmt: skip
    return out


def needs(job: str, baseline: str) -> list[str]:
    kind, *rest = job.split("/")
    if kind == "cell":
        technique, batch = rest
        first = [f"search/{technique}", f"search/{baseline}"]
        return first + ([f"cell/{technique}/same"] if batch == "max" else [])
    return []


def schedule(times: dict[str, float], baseline: str, gpus: int) -> float:
    """Wall time of the training jobs on `gpus` GPUs (list schedule, longest ready job first)."""
    train = {j: t for j, t in times.items() if j.split("/")[0] in ("search", "cell", "quality")}
    done_at: dict[str, float] = {}
    free = [0.0] * gpus
    left = set(train)
    while left:
        ready = [j for j in left if all(d in done_at or d not in train for d in needs(j, baseline))]
        # a job starts when a GPU is free and its inputs exist; take the one that can start first,
        # the longest among those
        gpu_free = heapq.heappop(free)
        start = {j: max([gpu_free] + [done_at[d] for d in needs(j, baseline) if d in train]) for j in ready}  # fmt: skip
        job = min(ready, key=lambda j: (start[j], -train[j]))
        done_at[job] = start[job] + train[job]
        heapq.heappush(free, done_at[job])
        left.remove(job)
    return max(done_at.values(), default=0.0)


def critical_path(times: dict[str, float], baseline: str) -> float:
    memo: dict[str, float] = {}

    def finish(job: str) -> float:
        if job not in memo:
            memo[job] = times[job] + max([finish(d) for d in needs(job, baseline) if d in times] + [0.0])  # fmt: skip
        return memo[job]

    return max(finish(j) for j in times if j.split("/")[0] in ("search", "cell", "quality"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--baseline", help="the study's baseline (default: config.yaml's)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4, 8])
    args = ap.parse_args()
    baseline = args.baseline or yaml.safe_load(open(Path(__file__).parents[1] / "config.yaml"))["baseline"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if not run.is_dir():
            with tarfile.open(run) as tar:
                tar.extractall(tmp, filter="data")
            run = Path(tmp)
        times = job_times(run / "results" / "benchmarks")
    serial = sum(t for j, t in times.items() if j in DATA or j in PAPER)
    total = sum(times.values())
    print(f"job time {total:.0f} s; data and paper rules {serial:.0f} s (serial); critical path of "
          f"the training jobs {critical_path(times, baseline):.0f} s")  # fmt: skip
    print("\n| GPUs | estimated wall (s) | speed-up |\n|---:|---:|---:|")
    one = serial + schedule(times, baseline, 1)
    for n in args.gpus:
        wall = serial + schedule(times, baseline, n)
        print(f"| {n} | {wall:.0f} | {one / wall:.2f}x |")


if __name__ == "__main__":
    main()
