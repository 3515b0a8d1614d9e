"""Figures against the batch size (memory and speed per technique, search trials and fits) and
the window comparison."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import StrMethodFormatter

from memopt.knobs import KNOBS
from memopt.report.figures_style import (
    bar_whisker,
    entry_label,
    log_if_decades,
    main_entry,
    mark_unmeasured,
    ok_rows,
    placeholder,
    short_label,
    technique_colors,
    unmeasured,
    unmeasured_note,
)
from memopt.report.paired import paired_differences, paired_verdict


def _cell_lines(ax, summary, column: str, colors: dict) -> dict:
    """One line per technique through its trained cells: `column` against batch size.
    Techniques whose cells coincide (within 0.5%) share one line, in the first one's colour,
    labelled with all their names: a line drawn over another would hide it. Returns each
    technique's colour as drawn (the shared line's), for what the figure draws of it beside."""
    lines: dict[tuple, list[str]] = {}
    points = {}
    for technique in dict.fromkeys(summary["technique"]):
        ok = ok_rows(summary[summary["technique"] == technique]).sort_values("batch_size")
        if ok.empty:
            continue
        xs, ys = list(ok["batch_size"]), list(ok[column])
        key = next(
            (
                k
                for k in lines
                if len(k) == len(xs)
                and all(bx == x and abs(by - y) <= 0.005 * abs(by) for (bx, by), x, y
                        in zip(k, xs, ys))
            ),
            tuple(zip(xs, ys)),
        )  # fmt: skip
        lines.setdefault(key, []).append(technique)
        points[key] = (xs, ys)
    drawn = {}
    for key, names in lines.items():
        xs, ys = points[key]
        label = " = ".join(names) if len(names) < 4 else f"{names[0]} (= {len(names) - 1} more)"
        ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.2, color=colors[names[0]],
                label=label)  # fmt: skip
        if column == "tokens_per_s" and "step_time_ms_rel_ci95" in summary:  # a speed's interval
            ok = ok_rows(summary[summary["technique"] == names[0]]).sort_values("batch_size")
            err = [r * y for r, y in zip(ok["step_time_ms_rel_ci95"], ys)]
            ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=colors[names[0]], elinewidth=0.8,
                        capsize=2)  # fmt: skip
        drawn.update({name: colors[names[0]] for name in names})
    return drawn


def _batch_axes(ax, ylabel: str, handles: list) -> None:
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel(ylabel)


def memory_batch_figure(summary, searches: list[dict]) -> Figure:
    """Peak memory against batch: every search trial (x = out of memory), the search's linear fit,
    the trained cells, and the memory budget the search had."""
    colors = technique_colors(summary, [s["technique"] for s in searches])
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.subplots()
    ax.set_title("Peak allocated memory vs batch size")
    budgets = {s["budget_mib"] for s in searches if s.get("budget_mib")}
    budget = min(budgets) if budgets else None
    drawn = _cell_lines(ax, summary, "peak_allocated_mib", colors)
    for s in searches:  # in the colour of the technique's line (a shared line's colour)
        color = drawn.get(s["technique"], colors[s["technique"]])
        fits = [t for t in s["trials"] if t["fits"] and t.get("peak_mib") is not None]
        misses = [t["batch"] for t in s["trials"] if not t["fits"]]
        ax.scatter(
            [t["batch"] for t in fits],
            [t["peak_mib"] for t in fits],
            s=12,
            color=color,
            facecolor="none",
            linewidth=0.8,
        )
        if misses and budget:
            ax.scatter(misses, [budget] * len(misses), s=18, marker="x", color=color)
        fit = s.get("fit")
        if fit and fit.get("per_sample_mib") is not None:
            top = max([t["batch"] for t in s["trials"]] + [1])
            ax.plot(
                [0, top],
                [fit["fixed_mib"], fit["fixed_mib"] + fit["per_sample_mib"] * top],
                linestyle=":",
                linewidth=0.8,
                color=color,
            )
    if budget:
        ax.axhline(budget, color="#B00020", linewidth=0.8, linestyle="--")
        ax.text(
            0.01,
            budget,
            f" memory budget {budget:,.0f} MiB",
            transform=ax.get_yaxis_transform(),
            va="bottom",
            fontsize=7,
            color="#B00020",
        )
    if not ax.lines and not ax.collections:
        placeholder(ax, "no measured memory")
        return fig
    unmeasured_note(ax, summary)
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D(
            [],
            [],
            marker="o",
            linestyle="none",
            markerfacecolor="none",
            color="grey",
            label="search trial (fits)",
        ),
        Line2D([], [], marker="x", linestyle="none", color="grey", label="search trial (OOM)"),
        Line2D([], [], linestyle=":", color="grey", label="search fit"),
    ]
    _batch_axes(ax, "peak allocated memory (MiB)", handles)
    return fig


def speed_batch_figure(summary) -> Figure:
    """Throughput against batch size, one line per technique through its trained cells."""
    colors = technique_colors(summary)
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    ax.set_title("Training throughput vs batch size")
    _cell_lines(ax, summary, "tokens_per_s", colors)
    if not ax.lines:
        placeholder(ax, "no cell fitted in memory")
        return fig
    unmeasured_note(ax, summary)
    _batch_axes(ax, "throughput (tokens/s)", ax.get_legend_handles_labels()[0])
    log_if_decades(ax, ok_rows(summary)["tokens_per_s"])
    return fig


def window_group(summary) -> list:
    """The windowed techniques and their full-attention counterparts (every knob the same but
    the attention's: memopt.knobs), at the main entry, ordered by window (full last)."""
    rows = summary[summary["batch_entry"] == main_entry(summary)]
    windowed = rows[rows["window"].notna()]
    same_knobs = [k.name for k in KNOBS if k.group != "attention" and k.name in rows.columns]
    keys = {tuple(r) for r in windowed[same_knobs].astype(str).itertuples(index=False)}
    full = rows[rows["window"].isna()]
    full = full[[tuple(r) in keys for r in full[same_knobs].astype(str).itertuples(index=False)]]
    if windowed.empty:
        return []
    return list(windowed.sort_values("window").itertuples()) + list(full.itertuples())


def add_paired_quality(summary, runs: list[dict], baseline: str):
    """summary with each technique's function's paired difference of validation loss from the
    baseline's function (dval, dval_lo, dval_hi: mean and 95% interval over the paired seeds,
    memopt.report.paired; the baseline's own function: 0, no interval)."""
    summary = summary.copy()
    ref = summary.loc[summary["technique"] == baseline, "function"]
    ref = ref.iloc[0] if len(ref) else None
    stats = {}
    for function in summary["function"].dropna().unique():
        diffs = paired_differences(runs, function, ref) if ref else []
        v = paired_verdict(diffs, 1.0) if diffs else None
        stats[function] = (0.0, None, None) if function == ref and diffs else (
            (v["mean"], v["lo"], v["hi"]) if v else (None, None, None))  # fmt: skip
    for i, key in enumerate(("dval", "dval_lo", "dval_hi")):
        summary[key] = summary["function"].map({f: v[i] for f, v in stats.items()}).astype(float)
    summary.attrs["quality_reference"] = ref
    return summary


def windows_figure(summary, margin: float = 0.02) -> Figure:
    """Sliding windows against full attention: throughput, peak memory, and the quality of each
    technique's function: its paired difference of validation loss from the baseline's function
    with its 95% interval, against the equivalence margin (add_paired_quality)."""
    group = window_group(summary)
    ref = summary.attrs.get("quality_reference")
    panels = [
        ("tokens_per_s", "tokens/s (whiskers: 95% interval\nof the mean step time)"),
        ("peak_allocated_mib", "peak allocated (MiB)"),
        (
            "dval",
            f"Δ val. loss vs {ref or 'the baseline (none here)'} (nats;\nbars: 95% interval, band: ±margin)",
        ),
    ]
    fig = Figure(figsize=(7.2, 3.0))
    axes = fig.subplots(1, len(panels))
    fig.suptitle(f"Attention window, {entry_label(main_entry(summary))}")
    if not group:
        placeholder(axes[0], "no windowed technique in this study")
        for ax in axes[1:]:
            ax.set_axis_off()
        return fig
    labels = [
        f"{r.technique}\n{'W=' + str(int(r.window)) if r.window == r.window else 'full'}"
        f" ({r.kernel if isinstance(r.kernel, str) else r.attention})"
        for r in group
    ]
    colors = technique_colors(summary)
    for ax, (column, title) in zip(axes, panels):
        for i, row in enumerate(group):
            value = getattr(row, column, float("nan"))
            # The quality is the function's (quality runs), not the cell's.
            status = row.quality_status if column == "dval" else row.status
            if status != "ok" or value != value:
                mark_unmeasured(ax, i, 0.7, unmeasured(status), "#B00020")
                continue
            if column == "dval":  # an interval around a difference: a point, never a bar
                lo, hi = row.dval_lo, row.dval_hi
                err = [[value - lo], [hi - value]] if lo == lo and hi == hi else None
                ax.errorbar(i, value, yerr=err, fmt="o", capsize=3, color=colors[row.technique])
                ax.text(i + 0.12, value, f"{value:+.3f}", ha="left", va="center", fontsize=6.5)
                continue
            ax.bar(i, value, 0.7, color=colors[row.technique])
            rel = getattr(row, "step_time_ms_rel_ci95", None) if column == "tokens_per_s" else None
            top = bar_whisker(ax, i, value, rel)
            ax.text(i, top, short_label(value), ha="center", va="bottom", fontsize=6.5)
        ax.set_xticks(range(len(group)), labels, rotation=45, ha="right", fontsize=6.5)
        ax.set_xlim(-0.6, len(group) - 0.4)
        ax.set_title(title, fontsize=8)
        ax.yaxis.set_major_formatter(
            StrMethodFormatter("{x:+.2f}" if column == "dval" else "{x:,.0f}")
        )
    axes[-1].axhline(0, color="black", linewidth=0.8)
    axes[-1].axhspan(-margin, margin, color="#999999", alpha=0.2, linewidth=0)
    fig.tight_layout()
    return fig
