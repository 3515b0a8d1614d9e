"""Paper figures from summary.csv (and the loss curves in the cell JSONs).

Uses matplotlib's object API (Figure, no pyplot) so nothing depends on a display or global state.
An oom cell is drawn as a hatched "OOM" column, never as a zero bar: zero would read as "free".
"""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import StrMethodFormatter

from memopt.results import entry_sort_key, loss_curves, read_summary

FIGURE_NAMES = ("memory", "throughput", "loss")
ENTRY_COLORS = {"same": "#4C72B0", "max": "#DD8452"}
OTHER_COLORS = ["#55A868", "#8172B3", "#937860", "#DA8BC3"]
# PDFs carry no creation date and PNGs no software stamp, so a rebuild gives identical bytes.
SAVE_METADATA = {
    "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
    "png": {"Software": None},
}
STYLE = {"font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "pdf.fonttype": 42}


def _entry_label(entry: str) -> str:
    return {"same": "same batch (baseline's max)", "max": "own max batch"}.get(
        entry, f"batch {entry}"
    )


def _short(value: float) -> str:
    """Compact bar label (150k, 2.3k, 850): full numbers overlap once seven techniques share a row;
    the exact values are in the paper's table."""
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.3g}"


def _save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    paths = []
    for ext in ("pdf", "png"):
        path = out_dir / f"{name}.{ext}"
        fig.savefig(path, dpi=150, metadata=SAVE_METADATA[ext], bbox_inches="tight")
        paths.append(path)
    return paths


def _bar_figure(summary, column: str, ylabel: str, title: str) -> Figure:
    """Grouped bars: one group per technique, one bar per batch entry, oom as a hatched column."""
    techniques = list(dict.fromkeys(summary["technique"]))
    entries = sorted(dict.fromkeys(summary["batch_entry"]), key=entry_sort_key)
    others = itertools.cycle(OTHER_COLORS)
    colors = {e: ENTRY_COLORS.get(e) or next(others) for e in entries}
    width = 0.8 / len(entries)
    fig = Figure(figsize=(max(6.0, 1.1 * len(techniques) * max(1, len(entries) / 2)), 3.4))
    ax = fig.subplots()
    ymax = summary.loc[summary["status"] == "ok", column].max()
    ymax = 1.0 if ymax != ymax else float(ymax)  # NaN when every cell is oom
    for j, entry in enumerate(entries):
        for i, technique in enumerate(techniques):
            rows = summary[(summary["technique"] == technique) & (summary["batch_entry"] == entry)]
            if rows.empty:
                continue
            row = rows.iloc[0]
            x = i + (j - (len(entries) - 1) / 2) * width
            batch = "" if row["batch_size"] != row["batch_size"] else f"b={int(row['batch_size'])}"
            if row["status"] == "oom":
                # Full-height hatched band in axes coordinates: it has no value to be misread.
                ax.axvspan(
                    x - width / 2,
                    x + width / 2,
                    facecolor="none",
                    edgecolor=colors[entry],
                    hatch="///",
                    linewidth=0.8,
                )
                ax.text(
                    x,
                    0.5,
                    f"OOM {batch}".strip(),
                    rotation=90,
                    ha="center",
                    va="center",
                    transform=ax.get_xaxis_transform(),
                    fontsize=8,
                    color="#B00020",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
                )
                continue
            value = float(row[column])
            ax.bar(x, value, width, color=colors[entry])
            ax.text(
                x,
                value + 0.01 * ymax,
                f"{_short(value)}\n{batch}",
                ha="center",
                va="bottom",
                fontsize=6.5,
            )
    handles = [Patch(color=colors[e], label=_entry_label(e)) for e in entries]
    if (summary["status"] == "oom").any():
        handles.append(
            Patch(facecolor="none", edgecolor="grey", hatch="///", label="out of memory")
        )
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_xticks(range(len(techniques)), techniques, rotation=20, ha="right")
    ax.set_xlim(-0.6, len(techniques) - 0.4)
    ax.set_ylim(0, ymax * 1.18)
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return fig


def _loss_figure(summary, curves: dict) -> Figure:
    """Training loss per step for every technique at the `same` batch (the fair comparison)."""
    entries = sorted(dict.fromkeys(summary["batch_entry"]), key=entry_sort_key)
    entry = "same" if "same" in entries else entries[0]  # a study without `same` shows its first
    fig = Figure(figsize=(6.0, 3.4))
    ax = fig.subplots()
    oom = []
    for technique in dict.fromkeys(summary["technique"]):
        curve = curves.get((technique, entry), [])
        if curve:
            ax.plot(range(1, len(curve) + 1), curve, linewidth=1.0, label=technique)
        else:
            oom.append(technique)
    if oom:  # say in the plot which techniques have no curve, rather than omit them silently
        ax.text(
            0.99,
            0.97,
            "OOM: " + ", ".join(oom),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            color="#B00020",
        )
    if ax.lines:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title(f"Training loss, {_entry_label(entry)}")
    return fig


def make_figures(summary_csv: Path, cell_paths: list[Path], out_dir: Path) -> list[Path]:
    """Write memory, throughput and loss figures as .pdf and .png into out_dir; return the paths."""
    summary = read_summary(summary_csv)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with matplotlib.rc_context(STYLE):
        memory = _bar_figure(
            summary,
            "peak_allocated_mib",
            "peak allocated memory (MiB)",
            "Peak allocated memory per step (incl. optimizer)",
        )
        paths += _save(memory, out_dir, "memory")
        throughput = _bar_figure(
            summary, "tokens_per_s", "throughput (tokens/s)", "Training throughput"
        )
        paths += _save(throughput, out_dir, "throughput")
        paths += _save(_loss_figure(summary, loss_curves(cell_paths)), out_dir, "loss")
    return paths
