"""Compare a study run on one GPU with the same study on several (tools/gpu_scaleout.sh).

    python tools/scaleout_report.py ONE_GPU_RUN SEVERAL_GPU_RUN

Each run is a directory or a .tar.gz holding its results/ (results/benchmarks included). Prints,
as Markdown: every training job of the several-GPU run with its GPU and time span (from the
results' provenance: started = GPU leased, finished = result written), how many pairs of jobs ran
at the same time on different GPUs, that no two jobs overlapped on one GPU, each cell's step time
and each search's maximum batch beside the one-GPU run's, and both runs' wall and job time.
Exits 1 if two jobs overlapped on one GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tarfile
import tempfile
from datetime import datetime
from itertools import combinations
from pathlib import Path


def unpack(path: Path, into: Path) -> Path:
    if path.is_dir():
        return path
    with tarfile.open(path) as tar:
        tar.extractall(into / path.name, filter="data")
    return into / path.name


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def jobs(run: Path) -> dict[str, dict]:
    """Training jobs (searches, cells, quality runs) by their result's path under results/."""
    out = {}
    for kind in ("search", "cells", "quality"):
        for f in sorted((run / "results" / kind).rglob("*.json")):
            d = json.loads(f.read_text())
            p = d.get("provenance") or {}
            if d.get("measured_as") or not p.get("started"):  # a copy of another cell, or old
                continue
            out[str(f.relative_to(run / "results"))] = {
                "gpu": p.get("gpu_uuid") or p.get("gpu_lease"),  # (a fake lease on a CPU)
                "start": when(p["started"]),
                "end": when(p["finished"]),
                "data": d,
            }
    return out


def job_time(run: Path) -> float:
    total = 0.0
    for f in (run / "results" / "benchmarks").rglob("*.tsv"):
        with open(f) as fh:
            total += sum(float(r["s"]) for r in csv.DictReader(fh, delimiter="\t"))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("one", type=Path)
    ap.add_argument("several", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one, several = (unpack(p, Path(tmp)) for p in (args.one, args.several))
        a, b = jobs(one), jobs(several)
        span = {name: (min(j["start"] for j in r.values()), max(j["end"] for j in r.values()))
                for name, r in (("one", a), ("several", b))}  # fmt: skip
        t0 = span["several"][0]
        print("| job | GPU | started (s) | finished (s) |\n|---|---|---:|---:|")
        for k, j in sorted(b.items(), key=lambda kv: kv[1]["start"]):
            print(f"| {k} | {j['gpu'][:8]} | {j['start'] - t0:.1f} | {j['end'] - t0:.1f} |")
        same, other = [], []
        for (k1, j1), (k2, j2) in combinations(b.items(), 2):
            overlap = min(j1["end"], j2["end"]) - max(j1["start"], j2["start"])
            if overlap > 0:
                (same if j1["gpu"] == j2["gpu"] else other).append((k1, k2, overlap))
        gpus = sorted({j["gpu"] for j in b.values()})
        print(f"\n{len(gpus)} GPUs used: {', '.join(gpus)}.")
        print(f"{len(other)} pairs of jobs ran at the same time on different GPUs "
              f"({sum(o for *_, o in other):.0f} s of overlap in all).")  # fmt: skip
        for k1, k2, o in same:
            print(f"OVERLAP ON ONE GPU: {k1} and {k2} ({o:.1f} s)")
        print("\n| cell | median step ms, 1 GPU | several GPUs | ratio |\n|---|---:|---:|---:|")
        for k in sorted(set(a) & set(b)):
            if k.startswith("cells/"):
                s1, s2 = (r[k]["data"]["step_time_ms"]["median"] for r in (a, b))
                print(f"| {k[6:-5]} (batch {b[k]['data']['batch_size']}) | {s1:.1f} | {s2:.1f} "
                      f"| {s2 / s1:.3f} |")  # fmt: skip
        print("\n| search | max batch, 1 GPU | several |\n|---|---:|---:|")
        for k in sorted(set(a) & set(b)):
            if k.startswith("search/"):
                print(f"| {k[7:-5]} | {a[k]['data']['max_batch']} | {b[k]['data']['max_batch']} |")
        print(
            "\n| run | wall, first job start to last result (s) | job time (s) |\n|---|---:|---:|"
        )
        for name, run in (("1 GPU", one), (f"{len(gpus)} GPUs", several)):
            lo, hi = span["one" if run is one else "several"]
            print(f"| {name} | {hi - lo:.0f} | {job_time(run):.0f} |")
        return 1 if same else 0


if __name__ == "__main__":
    sys.exit(main())
