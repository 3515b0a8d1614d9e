"""Issue 17's table from a parallel study's results (tools/gpu_parallel.sh): per technique, the
model state each GPU holds (weights, gradients, optimizer state, measured at the first batch
entry) beside what the ZeRO arithmetic predicts from the one-GPU technique's, the peak per GPU,
the maximum batch per GPU and the throughput of all the job's GPUs.

    python tools/parallel_report.py studies/h200x2-parallel/results
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The share of (weights, gradients, optimizer state) one of N GPUs stores (memopt.runtime.parallel).
SHARE = {
    ("none", "none"): lambda n: (1, 1, 1),
    ("ddp", "none"): lambda n: (1, 1, 1),
    ("ddp", "optimizer"): lambda n: (1, 1, 1 / n),
    ("fsdp2", "grads"): lambda n: (1 / n, 1 / n, 1 / n),
    ("fsdp2", "full"): lambda n: (1 / n, 1 / n, 1 / n),
}
PARTS = ("weights_mib", "gradients_mib", "optimizer_state_mib")


def main(results: Path, entry: str | None = None) -> None:
    cells = {p.parent.name: p for p in sorted(results.glob("cells/*/*.json"))}
    techniques = sorted(cells, key=lambda t: (json.loads(cells[t].read_text())["gpus"], t))
    first = entry or sorted({p.stem for p in results.glob("cells/*/*.json")} - {"max", "same"})[0]
    one = next(t for t in techniques if json.loads(cells[t].read_text())["gpus"] == 1)
    base = json.loads((results / "cells" / one / f"{first}.json").read_text())["memory_breakdown"]
    print(f"Batch {first} per GPU; predicted = the one-GPU technique ({one}) x the ZeRO share.\n")
    print("| technique | mode | GPUs | weights / grads / optimizer MiB per GPU (predicted) "
          f"| activations MiB | peak MiB per GPU at {first} | max batch per GPU | tokens/s at "
          f"{first} | tokens/s at max |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for t in techniques:
        c = json.loads((results / "cells" / t / f"{first}.json").read_text())
        top = json.loads((results / "cells" / t / "max.json").read_text())
        spec, n = c["spec"], c["gpus"]
        share = SHARE[spec["parallel"], spec["shard"]](n)
        got = " / ".join(f"{c['memory_breakdown'][k]:,.0f}" for k in PARTS)
        want = " / ".join(f"{base[k] * s:,.0f}" for k, s in zip(PARTS, share))
        peaks = {round(r["peak_allocated_mib"]) for r in c.get("ranks", [])} or {
            round(c["peak_allocated_mib"])
        }
        mode = spec["parallel"] + ("" if spec["shard"] == "none" else f", shard {spec['shard']}")
        print(
            f"| {t} | {mode} | {n} | {got} ({want}) | {c['memory_breakdown']['activations_mib']:,.0f}"
            f" | {' / '.join(f'{p:,}' for p in sorted(peaks))} | {top['batch_size']} | "
            f"{c['tokens_per_s']:,.0f} | {top['tokens_per_s']:,.0f} |"
        )
    uuids = {
        r["gpu_uuid"] for p in cells.values() for r in json.loads(p.read_text()).get("ranks", [])
    }
    print(f"\nGPUs: {', '.join(sorted(uuids))}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *(sys.argv[2:3]))
