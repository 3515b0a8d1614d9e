"""The README's tables from published studies (tools/publish_study.sh): for one study, its headline
table; for two (the same config on two GPUs), the two side by side, what differs and each study's
job time.

    python tools/study_report.py studies/h100-default
    python tools/study_report.py studies/h100-default studies/h200-default
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def load(study: Path) -> dict:
    """A study's cells (indexed by technique and batch entry), its quality runs per function, its
    GPU and its job time (the sum of Snakemake's benchmark files, the paper's render included)."""
    cells = pd.read_csv(study / "results" / "summary.csv", dtype={"batch_entry": str})
    quality = pd.read_csv(study / "results" / "quality.csv")
    ppl = quality[quality["status"] == "ok"].groupby("function")["val_ppl"]
    job_s = sum(
        float(p.read_text().splitlines()[-1].split("\t")[0])
        for p in (study / "results" / "benchmarks").rglob("*.tsv")
    )
    (gpu,) = set(cells["device_name"])  # a published study ran on one GPU model (its test)
    searches = [json.loads(p.read_text()) for p in (study / "results" / "search").glob("*.json")]
    return {
        "name": study.name,
        "cells": cells.set_index(["technique", "batch_entry"]),
        "order": list(dict.fromkeys(cells["technique"])),
        "ppl": ppl.agg(["mean", "min", "max"]),
        "gpu": gpu,
        "job_s": job_s,
        # a maximum found at the search's cap is a lower bound
        "capped": {s["technique"] for s in searches if s.get("status") == "capped"},
    }


def headline(s: dict) -> list[str]:
    c, ppl = s["cells"], s["ppl"]
    base = c.loc[("baseline", "same")]
    tf32 = c.loc[("tf32", "same")] if ("tf32", "same") in c.index else None  # the TF32 reference
    rows = [
        f"| technique | function | peak allocated at {base['batch_size']} (MiB) | tokens/s at "
        f"{base['batch_size']} | vs FP32 |{' vs TF32 |' if tf32 is not None else ''} max batch "
        "| tokens/s at max | val ppl (seeds) |",
        "|---|---|---:|---:|---:|" + ("---:|" if tf32 is not None else "") + "---:|---:|---:|",
    ]
    for t in s["order"]:
        same, top = c.loc[(t, "same")], c.loc[(t, "max")]
        f = same["function"]
        rows.append(
            f"| `{t}` | {f} | {same['peak_allocated_mib']:,.0f} | {same['tokens_per_s']:,.0f} | "
            f"{same['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
            + (f"{same['tokens_per_s'] / tf32['tokens_per_s']:.2f}x | " if tf32 is not None else "")
            + f"{_batch(s, t)} | "
            f"{top['tokens_per_s']:,.0f} | {ppl.loc[f, 'mean']:.1f} "
            f"({ppl.loc[f, 'min']:.1f}–{ppl.loc[f, 'max']:.1f}) |"
        )
    return rows


def side_by_side(a: dict, b: dict) -> list[str]:
    ca, cb = a["cells"], b["cells"]
    ra = _ranks(ca, a["order"])
    rb = _ranks(cb, b["order"])
    rows = [
        f"| technique | max batch ({a['name']} / {b['name']}) | tokens/s at max ({a['name']} / "
        f"{b['name']}, ratio) | tokens/s at the baseline's batch (ratio) | speed rank |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in [t for t in a["order"] if t in b["order"]]:
        ma, mb = ca.loc[(t, "max")], cb.loc[(t, "max")]
        sa, sb = ca.loc[(t, "same")], cb.loc[(t, "same")]
        rows.append(
            f"| `{t}` | {_batch(a, t)} / {_batch(b, t)} | {ma['tokens_per_s']:,.0f} / "
            f"{mb['tokens_per_s']:,.0f} ({mb['tokens_per_s'] / ma['tokens_per_s']:.2f}x) | "
            f"{sa['tokens_per_s']:,.0f} / {sb['tokens_per_s']:,.0f} "
            f"({sb['tokens_per_s'] / sa['tokens_per_s']:.2f}x) | {ra[t]} / {rb[t]} |"
        )
    return rows


def _batch(s: dict, technique: str) -> str:
    size = s["cells"].loc[(technique, "max"), "batch_size"]
    return f"≥ {size}" if technique in s["capped"] else f"{size}"


def _ranks(cells: pd.DataFrame, order: list[str]) -> dict:
    """Rank by tokens/s at the technique's own maximum batch (1 = fastest)."""
    speed = sorted(order, key=lambda t: -cells.loc[(t, "max"), "tokens_per_s"])
    return {t: speed.index(t) + 1 for t in order}


def main(paths: list[str]) -> None:
    studies = [load(Path(p)) for p in paths]
    for s in studies:
        print(f"{s['name']} ({s['gpu']}; {s['job_s']:,.0f} s of jobs):\n")
        print("\n".join(headline(s)) + "\n")
    if len(studies) == 2:
        print("\n".join(side_by_side(*studies)))


if __name__ == "__main__":
    main(sys.argv[1:])
