"""The README's tables from published studies (tools/publish_study.sh): for one study, its headline
table; for two (the same config on two GPUs), the two side by side, what differs and each study's
job time.

    python tools/study_report.py studies/h100-default
    python tools/study_report.py studies/h100-default studies/h200-default [--figure F.png]

With two studies and --figure, it also draws the comparison: per technique, the maximum batch and
the tokens/s at it on each GPU.
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


def figure(a: dict, b: dict, path: Path) -> None:
    """Two panels, one bar per GPU for each technique both studies ran: the maximum batch (log
    scale, hatched where the search stopped at its cap) and the tokens/s at it."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    common = [t for t in a["order"] if t in b["order"]]
    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    batch_ax, speed_ax = fig.subplots(1, 2)
    for k, (s, color) in enumerate(((a, "#4C72B0"), (b, "#DD8452"))):
        x = [i + (k - 0.5) * 0.4 for i in range(len(common))]
        batches = [s["cells"].loc[(t, "max"), "batch_size"] for t in common]
        bars = batch_ax.bar(x, batches, 0.4, color=color, label=f"{s['name']} ({s['gpu']})")
        for bar, t in zip(bars, common):
            if t in s["capped"]:
                bar.set_hatch("//")
        batch_ax.bar_label(bars, fontsize=6)
        speeds = [s["cells"].loc[(t, "max"), "tokens_per_s"] / 1000 for t in common]
        speed_ax.bar_label(speed_ax.bar(x, speeds, 0.4, color=color), fmt="%.0f", fontsize=6)
    every = [s["cells"].loc[(t, "max"), "batch_size"] for s in (a, b) for t in common]
    if max(every) > 10 * min(every):  # the maxima span decades
        batch_ax.set_yscale("log")
        batch_ax.set_ylim(bottom=1)
    batch_ax.set_title("maximum batch (sequences; hatched: at the search's cap)", fontsize=9)
    speed_ax.set_title("thousand tokens/s at the maximum batch", fontsize=9)
    for ax in (batch_ax, speed_ax):
        ax.set_xticks(range(len(common)), common, rotation=30, ha="right", fontsize=8)
    fig.legend(loc="outside lower center", ncol=2, fontsize=8)
    fig.savefig(path, dpi=150)


def main(paths: list[str]) -> None:
    out = None
    if "--figure" in paths:
        i = paths.index("--figure")
        out, paths = Path(paths[i + 1]), paths[:i] + paths[i + 2 :]
    studies = [load(Path(p)) for p in paths]
    for s in studies:
        print(f"{s['name']} ({s['gpu']}; {s['job_s']:,.0f} s of jobs):\n")
        print("\n".join(headline(s)) + "\n")
    if len(studies) == 2:
        print("\n".join(side_by_side(*studies)))
        if out is not None:
            figure(*studies, out)


if __name__ == "__main__":
    main(sys.argv[1:])
