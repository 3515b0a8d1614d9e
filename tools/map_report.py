"""docs/results.md's map tables from a published map study (tools/publish_study.sh with
config/map.yaml): per point, each technique's proven maximum in tokens per step and, in brackets,
its multiple of the reference's; then its tokens/s at that maximum (r: cudaMalloc retried in the
timed steps). Read from the study's results/map.csv and results/map_findings.json, as its paper.

    python tools/map_report.py studies/h100-map
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def _tokens(row, ref) -> str:
    if row.search_status == "none_fits":
        return "OOM"
    host = " h" if row.limit == "host" else ""
    if row.technique == ref.technique or not ref.max_tokens:
        return f"{row.max_tokens / 1000:,.0f}k{host}"
    return f"{row.max_tokens / 1000:,.0f}k ({row.max_tokens / ref.max_tokens:.2f}x){host}"


def _speed(row) -> str:
    if pd.isna(row.tokens_per_s):
        return "OOM" if row.search_status == "none_fits" else "n/a"
    retried = " r" if (row.alloc_retries or 0) > 0 else ""  # NaN > 0 is False
    return f"{row.tokens_per_s / 1000:,.0f}k{retried}"


def tables(study: Path) -> list[str]:
    table = pd.read_csv(study / "results" / "map.csv")
    reference = json.loads((study / "results" / "map_findings.json").read_text())["reference"]
    techniques = list(dict.fromkeys(table["technique"]))
    head = ["| point | " + " | ".join(f"`{t}`" for t in techniques) + " |",
            "|---|" + "---:|" * len(techniques)]  # fmt: skip
    out = {"tokens": list(head), "speed": list(head)}
    for point, rows in table.groupby("point", sort=False):
        by = {r.technique: r for r in rows.itertuples()}
        ref = by[reference]
        cells = [by[t] for t in techniques]
        out["tokens"].append(f"| `{point}` | " + " | ".join(_tokens(r, ref) for r in cells) + " |")
        out["speed"].append(f"| `{point}` | " + " | ".join(_speed(r) for r in cells) + " |")
    gpus = sorted(set(table["gpu"].dropna()))
    return [
        f"Maximum tokens per step (x: over `{reference}`'s; h: the host's pinned memory stopped "
        f"it; OOM: batch 1 does not fit), {', '.join(gpus)}:",
        "\n".join(out["tokens"]),
        "Tokens/s at each maximum (r: cudaMalloc retried in the timed steps):",
        "\n".join(out["speed"]),
    ]


if __name__ == "__main__":
    print("\n\n".join(tables(Path(sys.argv[1]))))
