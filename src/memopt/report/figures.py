"""Paper figures from summary.csv, the search trials and the quality runs.

Every name in FIGURE_NAMES is always written (as .pdf and .png), so the workflow's declared
outputs exist even for a study where every cell is oom: an empty figure says so in its plot.

Uses matplotlib's object API (Figure, no pyplot) so nothing depends on a display or global state.
An oom cell is drawn as a hatched "OOM" column, never as a zero bar: zero would read as "free".
Shared style and marks: figures_style; figures against the batch size: figures_batch.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import StrMethodFormatter

from memopt.report.figures_batch import (
    add_paired_quality,
    memory_batch_figure,
    speed_batch_figure,
    windows_figure,
)
from memopt.report.figures_quality import loss_figure, positions_figure
from memopt.report.figures_style import (
    bar_whisker,
    entry_hatches,
    entry_label,
    function_colors,
    legend_below,
    main_entry,
    mark_unmeasured,
    ok_rows,
    oom_hband,
    place_labels,
    placeholder,
    render_all,
    short_label,
    spans_decades,
    technique_colors,
    unmeasured,
    unmeasured_handles,
    unmeasured_note,
)
from memopt.report.paper_mechanisms import peak_parts
from memopt.report.results import (
    FIGURE_NAMES,
    capped_techniques,
    entry_sort_key,
    pareto,
    read_json,
    read_summary,
)


def _bar_figure(
    summary, column: str, ylabel: str, title: str, rel_err: str | None = None
) -> Figure:
    """Grouped bars: one group per technique, one bar per batch entry, oom as a hatched column,
    an entry measured as another ("= same": the same batch, one run) not drawn again; with
    `rel_err` (a relative 95% interval column), its error bar on each measured bar."""
    techniques = list(dict.fromkeys(summary["technique"]))
    entries = sorted(dict.fromkeys(summary["batch_entry"]), key=entry_sort_key)
    colors, hatches = technique_colors(summary), entry_hatches(entries)
    width = 0.8 / len(entries)
    fig = Figure(figsize=(max(6.0, 1.1 * len(techniques) * max(1, len(entries) / 2)), 3.6))
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
            copy = row.get("measured_as")
            if isinstance(copy, str) and copy:  # the same run as another entry's: drawn once
                ax.text(x, 0.01 * ymax, f"= {copy}", ha="center", va="bottom", fontsize=6.5,
                        rotation=90)  # fmt: skip
                continue
            if row["status"] != "ok":
                label = f"{unmeasured(row['status'])} {batch}".strip()
                mark_unmeasured(ax, x, width, label, colors[technique])
                continue
            value = float(row[column])
            ax.bar(
                x, value, width, color=colors[technique], hatch=hatches[entry], edgecolor="white"
            )
            top = bar_whisker(ax, x, value, row.get(rel_err) if rel_err else None)
            ax.text(
                x,
                top + 0.01 * ymax,
                f"{short_label(value)}\n{batch}",
                ha="center",
                va="bottom",
                fontsize=6.5,
            )
    handles = [
        Patch(facecolor="grey", hatch=hatches[e], edgecolor="white", label=entry_label(e))
        for e in entries
    ]
    handles += unmeasured_handles(summary)
    legend_below(ax, handles)
    ax.set_xticks(range(len(techniques)), techniques, rotation=20, ha="right")
    ax.set_xlim(-0.6, len(techniques) - 0.4)
    ax.set_ylim(0, ymax * 1.18)
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return fig


def label_groups(points, cells, near=0.04):
    """One label per group of nearby points, so close cells do not print over each other.

    points: (x, y); cells: (technique, entry or None), one per point. Points join a group when
    they lie within `near` of the data's span of some member on both axes. A group's label has one
    line per technique, highest point first, its entries together ("baseline (same, max)"), and
    is anchored at the group's rightmost x and highest y. Returns [((x, y), label)].
    """
    if not points:
        return []
    xs, ys = zip(*points)
    span_x, span_y = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    groups: list[list[int]] = []
    for i in sorted(range(len(points)), key=lambda i: -points[i][1]):
        close = [
            g
            for g in groups
            if any(
                abs(points[i][0] - points[j][0]) <= near * span_x
                and abs(points[i][1] - points[j][1]) <= near * span_y
                for j in g
            )
        ]
        for g in close[1:]:  # a point that links groups merges them
            close[0].extend(g)
            groups.remove(g)
        close[0].append(i) if close else groups.append([i])
    labelled = []
    for g in groups:
        entries: dict[str, list[str]] = {}
        for i in sorted(g, key=lambda i: -points[i][1]):
            technique, entry = cells[i]
            entries.setdefault(technique, [])
            if entry is not None:
                entries[technique].append(entry)
        lines = [t + (f" ({', '.join(e)})" if e else "") for t, e in entries.items()]
        anchor = (max(points[i][0] for i in g), max(points[i][1] for i in g))
        labelled.append((anchor, "\n".join(lines)))
    return labelled


def _tradeoff_figure(summary) -> Figure:
    """Peak memory against throughput for every ok cell (whiskers: the 95% interval of its mean
    step time), Pareto frontier as a step line."""
    fig = Figure(figsize=(6.0, 3.8))
    ax = fig.subplots()
    ok = ok_rows(summary).dropna(subset=["peak_allocated_mib", "tokens_per_s"])
    if ok.empty:
        placeholder(ax, "no cell fitted in memory")
        ax.set_title("Memory vs throughput")
        return fig
    one_entry = summary["batch_entry"].nunique() == 1
    # Memory in whole MiB, as the tables print it (memopt.report.effects.analysis does the same).
    points = list(zip(ok["peak_allocated_mib"].round(), ok["tokens_per_s"].astype(float)))
    front = pareto(points)
    on_front = set(front)
    fx, fy = zip(*front)
    # Staircase: between two frontier points the best reachable speed is the cheaper one's.
    ax.step(fx, fy, where="post", color="grey", linewidth=1.0, zorder=1)
    colors = technique_colors(summary)
    rel = ok["step_time_ms_rel_ci95"] if "step_time_ms_rel_ci95" in ok else [float("nan")] * len(ok)
    for (x, y), technique, r in zip(points, ok["technique"], rel):
        if r == r:  # the mean step time's 95% interval, as a speed interval
            ax.errorbar(x, y, yerr=r * y, fmt="none", ecolor="#555555", elinewidth=0.8, capsize=2,
                        zorder=1.5)  # fmt: skip
        best = (x, y) in on_front
        ax.scatter(
            x,
            y,
            s=46 if best else 22,
            zorder=2,
            color=colors[technique],
            edgecolor="black" if best else "none",
        )
    cells = [(r["technique"], None if one_entry else r["batch_entry"]) for _, r in ok.iterrows()]
    unmeasured_note(ax, summary)
    ax.legend(
        handles=[Patch(facecolor="white", edgecolor="black", label="Pareto-optimal (outlined)")],
        loc="upper left",  # up-left beats the frontier, so that corner is empty
        frameon=False,
    )
    ax.margins(x=0.2, y=0.15)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_xlabel("peak allocated memory (MiB)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("Memory vs throughput (up and left is better)")
    place_labels(ax, label_groups(points, cells))  # last: it measures the labels in the final axes
    return fig


# The parts of the peak (memopt.report.paper_mechanisms): what exists when the peak is reached. The
# gradients are not among them: at the peak, early in the backward pass, they do not exist yet.
PEAK_PARTS = [
    ("weights", "weights", "#4C72B0"),
    ("optimizer", "optimizer state", "#55A868"),
    ("activations", "activations kept (logits aside)", "#8172B3"),
    ("logits", "logits kept", "#CCB974"),
    ("working", "backward working memory (logits' gradient)", "#C44E52"),
]


def _phases_figure(summary) -> Figure:
    """The peak at the `same` batch split into its parts, stacked: they add up to the peak."""
    entry = main_entry(summary)
    rows = summary[summary["batch_entry"] == entry]
    techniques = list(rows["technique"])
    fig = Figure(figsize=(max(6.0, 0.8 * len(techniques)), 3.8))
    ax = fig.subplots()
    for i, row in enumerate(rows.itertuples()):
        parts = peak_parts(row._asdict()) if row.status == "ok" else {}
        if not parts:  # oom or diverged, or no breakdown measured
            mark_unmeasured(ax, i, 0.7, unmeasured(row.status), "#B00020")
            continue
        bottom = 0.0
        for key, _, color in PEAK_PARTS:
            ax.bar(i, parts[key] or 0.0, 0.7, bottom=bottom, color=color)
            bottom += parts[key] or 0.0
        ax.text(i, bottom, f"{bottom:,.0f}", ha="center", va="bottom", fontsize=7.5)
    legend_below(ax, [Patch(color=c, label=label) for _, label, c in PEAK_PARTS], ncol=3)
    ax.set_xticks(range(len(techniques)), techniques, rotation=20, ha="right")
    ax.set_xlim(-0.6, len(techniques) - 0.4)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_ylabel("peak allocated memory (MiB)")
    ax.set_title(f"What the peak is made of, {entry_label(entry)}")
    return fig


def _max_batch_figure(summary, capped: frozenset = frozenset()) -> Figure:
    """Each technique's `max` batch; one whose full run then ran out of memory (or diverged) is
    drawn open, in red; one whose search stopped at its cap (`capped`) is labelled as a lower
    bound. Maxima that span decades go on a log axis as dots: a bar's length means nothing there."""
    rows = summary[summary["batch_entry"] == "max"]
    fig = Figure(figsize=(6.0, 0.8 + 0.4 * max(1, len(rows))))
    ax = fig.subplots()
    ax.set_title("Largest batch that fits, per technique")
    if rows.empty:
        placeholder(ax, "no max entries in this study")
        return fig
    batches = rows["batch_size"].dropna()
    log = spans_decades(batches)
    for i, row in enumerate(rows.itertuples()):
        if row.batch_size != row.batch_size:  # no batch found at all
            oom_hband(ax, i, 0.7)
            continue
        batch = int(row.batch_size)
        ok = row.status == "ok"
        color = technique_colors(summary)[row.technique] if ok else "#B00020"
        if log:
            ax.plot(
                batch, i, "o", markersize=7, color=color, markerfacecolor=color if ok else "none"
            )
        elif ok:
            ax.barh(i, batch, 0.7, color=color)
        else:  # the search's batch, which then failed the full run: outline, never a solid bar
            ax.barh(i, batch, 0.7, facecolor="none", edgecolor=color, hatch="///")
        label = (f" ≥{batch} (the search's cap)" if row.technique in capped else f" {batch}") if ok \
            else f" {batch} ({unmeasured(row.status)} in full run)"  # fmt: skip
        ax.text(
            batch * (1.15 if log else 1),
            i,
            label,
            va="center",
            fontsize=7,
            color=color if not ok else "black",
        )
    ax.set_yticks(range(len(rows)), rows["technique"])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(max(batches.min(), 1) / 2, batches.max() * 4)
        ax.grid(axis="y", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.set_xlabel("batch size (sequences, log scale)")
    else:
        ax.set_xlim(0, ax.get_xlim()[1] * 1.3)
        ax.set_xlabel("batch size (sequences)")
    return fig


def make_figures(
    summary_csv: Path,
    out_dir: Path,
    *,
    search_paths: list[Path] = (),
    quality_paths: list[Path] = (),
    baseline: str = "baseline",
    margin: float = 0.02,
    processes: int = 1,
) -> list[Path]:
    """Write every figure in FIGURE_NAMES as .pdf and .png into out_dir; return the paths.
    `processes` > 1 renders them in that many forked processes (memopt.report.figures_style.render_all).

    search_paths give memory_batch its trials and fits; quality_paths the quality runs (loss
    against tokens, loss by position, each technique's function's quality in `windows`);
    baseline names the technique whose function the windows figure compares quality with (the
    paired difference of validation loss, seed by seed, against `margin`, quality.margin).
    """
    summary = read_summary(summary_csv)
    searches = [read_json(Path(p)) for p in search_paths]
    runs = [read_json(Path(p)) for p in quality_paths]
    # A function with a diverged seed has no quality to draw (no flattering mean over the rest).
    diverged = {run["function"] for run in runs if run["status"] == "diverged"}
    runs_ok = [run for run in runs if run["function"] not in diverged]
    summary["quality_status"] = summary["function"].map(
        lambda f: "diverged" if f in diverged else "ok"
    )
    base = summary[summary["technique"] == baseline]["function"]
    reference_function = base.iloc[0] if len(base) else None  # drawn above the others
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    builders = {
        "memory": lambda: _bar_figure(
            summary,
            "peak_allocated_mib",
            "peak allocated memory (MiB)",
            "Peak allocated memory per step (incl. optimizer)",
        ),
        "throughput": lambda: _bar_figure(
            summary,
            "tokens_per_s",
            "throughput (tokens/s)",
            "Training throughput (whiskers: 95% interval of the mean step time)",
            rel_err="step_time_ms_rel_ci95",
        ),
        "loss": lambda: loss_figure(runs, function_colors(summary), on_top=reference_function),
        "positions": lambda: positions_figure(
            runs, function_colors(summary), on_top=reference_function
        ),
        "tradeoff": lambda: _tradeoff_figure(summary),
        "phases": lambda: _phases_figure(summary),
        "max_batch": lambda: _max_batch_figure(summary, capped_techniques(searches)),
        "memory_batch": lambda: memory_batch_figure(summary, searches),
        "speed_batch": lambda: speed_batch_figure(summary),
        "windows": lambda: windows_figure(add_paired_quality(summary, runs_ok, baseline), margin),
    }
    return render_all({name: builders[name] for name in FIGURE_NAMES}, out_dir, processes)
