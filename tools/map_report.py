"""docs/results.md's map tables from a published map study (tools/publish_study.sh with
config/map.yaml): per point, each technique's proven maximum in tokens per step and, in brackets,
its multiple of the reference's; then its tokens/s at that maximum (r: cudaMalloc retried in the
timed steps). Read from the study's results/map.csv and results/map_findings.json, as its paper.

    python tools/map_report.py studies/h200-map [--tokens]

--tokens prints the first table alone (the top-level README's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from memopt.report.map_results import LIMIT_MARKS, retried  # noqa: E402


def _tokens(row, ref) -> str:
    if row.search_status == "none_fits":
        return "OOM"
    mark = f" {LIMIT_MARKS[row.limit]}" if row.limit in LIMIT_MARKS else ""
    if row.technique == ref.technique or not ref.max_tokens:
        return f"{row.max_tokens / 1000:,.0f}k{mark}"
    return f"{row.max_tokens / 1000:,.0f}k ({row.max_tokens / ref.max_tokens:.2f}x){mark}"


def _speed(row) -> str:
    if pd.isna(row.tokens_per_s):
        return "OOM" if row.search_status == "none_fits" else "n/a"
    return f"{row.tokens_per_s / 1000:,.0f}k{' r' if retried(row._asdict()) else ''}"


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
        f"it, d: the training data, c: search.max_batch; OOM: batch 1 does not fit), "
        f"{', '.join(gpus)}:",
        "\n".join(out["tokens"]),
        "Tokens/s at each maximum (r: cudaMalloc retried in the timed steps):",
        "\n".join(out["speed"]),
    ]


if __name__ == "__main__":
    out = tables(Path(sys.argv[1]))
    print("\n\n".join(out[:2] if "--tokens" in sys.argv[2:] else out))
