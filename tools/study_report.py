"""The tables of docs/results.md from published studies (tools/publish_study.sh): for one study, its headline
table; for two (the same config on two GPUs), the two side by side, what differs and each study's
job time.

    python tools/study_report.py studies/h100-default
    python tools/study_report.py studies/h100-default studies/h200-default [--figure F.png]

With two studies and --figure, it also draws the comparison: per technique, the maximum batch and
the tokens/s at it on each GPU.

A study's baseline batch is its GPU's (50 sequences on 80 GB, 90 on 141 GB), so its `same` cells
do not compare two GPUs at one batch. A study may hold extra cells for that, measured after it by
`tools/gpu_study.sh cells BATCH` on the same GPU model: STUDY/same-batch/cells/TECHNIQUE/BATCH.json.
When the second study has them at the first one's baseline batch, the comparison adds the tokens/s
of both GPUs at that one batch, and the speed ranks there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from memopt.report.results import capped_techniques


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
    extra = [json.loads(p.read_text()) for p in study.glob("same-batch/cells/*/*.json")]
    return {
        "name": study.name,
        "cells": cells.set_index(["technique", "batch_entry"]),
        "order": list(dict.fromkeys(cells["technique"])),
        "ppl": ppl.agg(["mean", "min", "max"]),
        "gpu": gpu,
        "job_s": job_s,
        # a maximum found at the search's cap is a lower bound
        "capped": capped_techniques(searches),
        # tokens/s of the extra cells at a fixed batch: {batch: {technique: tokens/s}}
        "at_batch": {
            b: {c["technique"]: c["tokens_per_s"] for c in extra if c["batch_size"] == b}
            for b in {c["batch_size"] for c in extra if c["status"] == "ok"}
        },
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
    """Per technique both ran: maximum batch, tokens/s at it and the speed rank there, the
    cudaMalloc retries over its timed steps (the allocator's slow path), and the tokens/s at each
    study's baseline batch; at one batch on both GPUs when the second study has cells for it."""
    ca, cb = a["cells"], b["cells"]
    common = [t for t in a["order"] if t in b["order"]]
    ra, rb = (
        _ranks({t: s["cells"].loc[(t, "max"), "tokens_per_s"] for t in common}) for s in (a, b)
    )
    batch, one = same_batch(a, b, common)
    r1a, r1b = (_ranks(one[0]), _ranks(one[1])) if one else ({}, {})
    rows = [
        f"| technique | max batch ({a['name']} / {b['name']}) | tokens/s at max (ratio) | speed "
        "rank at max | cudaMalloc retries at max (timed steps) | tokens/s at each baseline's batch "
        f"({batch} / {cb.loc[('baseline', 'same'), 'batch_size']}) |"
        + (f" tokens/s at {batch} on both (ratio) | speed rank at {batch} |" if one else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if one else ""),
    ]
    for t in common:
        ma, mb = ca.loc[(t, "max")], cb.loc[(t, "max")]
        sa, sb = ca.loc[(t, "same")], cb.loc[(t, "same")]
        rows.append(
            f"| `{t}` | {_batch(a, t)} / {_batch(b, t)} | {ma['tokens_per_s']:,.0f} / "
            f"{mb['tokens_per_s']:,.0f} ({mb['tokens_per_s'] / ma['tokens_per_s']:.2f}x) | "
            f"{ra[t]} / {rb[t]} | {_retries(ma)} / {_retries(mb)} | "
            f"{sa['tokens_per_s']:,.0f} / {sb['tokens_per_s']:,.0f} |"
            + (
                f" {one[0][t]:,.0f} / {one[1][t]:,.0f} ({one[1][t] / one[0][t]:.2f}x) | "
                f"{r1a[t]} / {r1b[t]} |"
                if one
                else ""
            )
        )
    return rows


def same_batch(a: dict, b: dict, common: list[str]) -> tuple[int, tuple[dict, dict] | None]:
    """The first study's baseline batch, and the tokens/s of both GPUs at it (first, second),
    where the second study has same-batch cells for every technique both ran (else None)."""
    batch = int(a["cells"].loc[("baseline", "same"), "batch_size"])
    at_b = b["at_batch"].get(batch, {})
    if batch == b["cells"].loc[("baseline", "same"), "batch_size"]:
        at_b = {t: b["cells"].loc[(t, "same"), "tokens_per_s"] for t in common}
    if not all(t in at_b for t in common):
        return batch, None
    return batch, ({t: a["cells"].loc[(t, "same"), "tokens_per_s"] for t in common}, at_b)


def _retries(cell: pd.Series) -> str:
    return f"{cell['allocator_alloc_retries']:.0f} ({cell['timed_steps']:.0f})"


def _batch(s: dict, technique: str) -> str:
    size = s["cells"].loc[(technique, "max"), "batch_size"]
    return f"≥ {size}" if technique in s["capped"] else f"{size}"


def _ranks(speed: dict) -> dict:
    """Rank by tokens/s (1 = fastest)."""
    order = sorted(speed, key=lambda t: -speed[t])
    return {t: order.index(t) + 1 for t in speed}


def figure(a: dict, b: dict, path: Path) -> None:
    """One bar per GPU for each technique both studies ran: the maximum batch (points on a log
    scale where the maxima span decades, open or hatched where the search stopped at its cap),
    the tokens/s at it and, where the second study has same-batch cells, the tokens/s of both
    GPUs at the first one's baseline batch."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    common = [t for t in a["order"] if t in b["order"]]
    batch, one = same_batch(a, b, common)
    fig = Figure(figsize=(13.0 if one else 9.0, 3.6), layout="constrained")
    axes = fig.subplots(1, 3 if one else 2)
    batch_ax, speed_ax = axes[:2]
    every = [s["cells"].loc[(t, "max"), "batch_size"] for s in (a, b) for t in common]
    log = max(every) > 10 * min(every)  # the maxima span decades: points on a log axis, no bars
    for k, (s, color) in enumerate(((a, "#4C72B0"), (b, "#DD8452"))):
        x = [i + (k - 0.5) * 0.4 for i in range(len(common))]
        batches = [s["cells"].loc[(t, "max"), "batch_size"] for t in common]
        label = f"{s['name']} ({s['gpu']})"
        if log:
            capped = [t in s["capped"] for t in common]
            batch_ax.scatter(x, batches, color=color, label=label, zorder=3,
                             facecolors=["none" if c else color for c in capped])  # fmt: skip
            for xi, v, c in zip(x, batches, capped):
                batch_ax.annotate(f"{'≥ ' if c else ''}{v}", (xi, v), xytext=(0, 4),
                                  textcoords="offset points", ha="center", fontsize=6)  # fmt: skip
        else:
            bars = batch_ax.bar(x, batches, 0.4, color=color, label=label)
            for bar, t in zip(bars, common):
                if t in s["capped"]:
                    bar.set_hatch("//")
            batch_ax.bar_label(bars, fontsize=6)
        speeds = [s["cells"].loc[(t, "max"), "tokens_per_s"] / 1000 for t in common]
        speed_ax.bar_label(speed_ax.bar(x, speeds, 0.4, color=color), fmt="%.0f", fontsize=6)
        if one:
            at = [one[k][t] / 1000 for t in common]
            axes[2].bar_label(axes[2].bar(x, at, 0.4, color=color), fmt="%.0f", fontsize=6)
    if log:
        batch_ax.set_yscale("log")
        batch_ax.set_ylim(min(every) / 2, max(every) * 3)
        batch_ax.grid(axis="y", which="major", alpha=0.3)
    capped = "open: at the search's cap" if log else "hatched: at the search's cap"
    batch_ax.set_title(f"maximum batch (sequences; {capped})", fontsize=9)
    speed_ax.set_title("thousand tokens/s at the maximum batch", fontsize=9)
    if one:
        extra = batch != b["cells"].loc[("baseline", "same"), "batch_size"]  # another run's
        note = f"\n({b['name']}: its same-batch cells, another run)" if extra else ""
        axes[2].set_title(f"thousand tokens/s at {batch} sequences on both{note}", fontsize=9)
    for ax in axes:
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
