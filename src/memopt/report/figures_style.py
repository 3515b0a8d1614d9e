"""What every paper figure shares: colours, style, byte-reproducible saving, and how an empty
plot or an out-of-memory cell is drawn (as a hatched "OOM" mark, never as a zero bar)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text

from memopt.fileio import atomic_path
from memopt.report.results import entry_sort_key

# Batch entries share their technique's colour: the first entry solid, later ones hatched.
ENTRY_HATCHES = ["", "////", "....", "xxxx"]


def technique_colors(summary, extra=()) -> dict:
    """One colour per technique, by its place in the study (the config's order; `extra` names
    techniques without a cell after them), the same in every figure: tab10, then tab20's lighter
    shades for an eleventh technique onwards."""
    palette = list(matplotlib.colormaps["tab10"].colors)
    palette += list(matplotlib.colormaps["tab20"].colors[1::2])
    names = dict.fromkeys([*summary["technique"], *extra])
    return {t: palette[i % len(palette)] for i, t in enumerate(names)}


def function_colors(summary) -> dict:
    """A function's colour is its first technique's (the baseline's for the baseline's)."""
    colors = technique_colors(summary)
    out: dict = {}
    for technique, function in zip(summary["technique"], summary["function"]):
        out.setdefault(function, colors[technique])
    return out


def spans_decades(values) -> bool:
    """Whether the positive values span more than a decade (a linear axis would squash the
    small ones onto the floor)."""
    values = [float(v) for v in values if v == v and v > 0]
    return bool(values) and max(values) > 10 * min(values)


def log_if_decades(ax, values, axis: str = "y") -> None:
    """A log scale where the plotted values span more than a decade (spans_decades)."""
    values = [float(v) for v in values if v == v and v > 0]
    if spans_decades(values):
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        (ax.set_ylim if axis == "y" else ax.set_xlim)(min(values) / 1.5, max(values) * 1.5)
        label = ax.get_ylabel() if axis == "y" else ax.get_xlabel()
        (ax.set_ylabel if axis == "y" else ax.set_xlabel)(f"{label}, log scale")


def place_labels(ax, labelled, fontsize: float = 7, step: float = 3.0, max_moves: int = 60):
    """Annotate each ((x, y), text) beside its point without one label covering another.

    Labels are placed from the highest point down, right of their point; one that would overlap
    a label already placed moves `step` points down or up, then to the left of its point, then
    further away until it is clear; a moved label gets a thin leader line to its point.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(ax.figure.canvas, FigureCanvasAgg):
        FigureCanvasAgg(ax.figure)
    renderer = ax.figure.canvas.get_renderer()
    ax.get_xlim(), ax.get_ylim()  # the final limits, before any extent is measured
    placed, texts = [], []
    for xy, text in sorted(labelled, key=lambda item: -item[0][1]):
        shifts = [0.0] + [sign * step * k for k in range(1, max_moves) for sign in (-1, 1)]
        options = [(5.0, 4.0 + d, "left") for d in shifts[:8]]  # close to the point first
        options += [(-5.0, 4.0 + d, "right") for d in shifts[:8]]
        options += [(5.0, 4.0 + d, "left") for d in shifts[8:]]
        for dx, dy, ha in options:
            t = ax.annotate(
                text, xy, xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                va="top", ha=ha,
            )  # fmt: skip
            box = t.get_window_extent(renderer).expanded(1.02, 1.05)
            if not any(box.overlaps(other) for other in placed):
                break
            t.remove()
        if (dx, dy) != (5.0, 4.0):  # moved away from its point: draw the way back
            t.remove()
            t = ax.annotate(
                text, xy, xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                va="top", ha=ha, arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "grey"},
            )  # fmt: skip
        t.update_positions(renderer)
        placed.append(Text.get_window_extent(t, renderer))  # the text's box, not its leader
        texts.append(t)
    return texts


def legend_below(ax, handles: list, ncol: int | None = None) -> None:
    """The legend in a row under the axes (beside them it would shrink the plot at print size)."""
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.22),
        ncol=ncol or max(1, len(handles)),
        frameon=False,
        fontsize=7.5,
    )


def entry_hatches(entries) -> dict:
    return {e: ENTRY_HATCHES[i % len(ENTRY_HATCHES)] for i, e in enumerate(entries)}


# PDFs carry no creation date and PNGs no software stamp, so a rebuild gives identical bytes.
SAVE_METADATA = {
    "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
    "png": {"Software": None},
}

STYLE = {"font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "pdf.fonttype": 42}


def entry_label(entry: str) -> str:
    return {"same": "same batch (baseline's max)", "max": "own max batch"}.get(
        entry, f"batch {entry}"
    )


def short_label(value: float) -> str:
    """Compact bar label (150k, 2.3k, 850): full numbers overlap once seven techniques share a row;
    the exact values are in the paper's table."""
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.3g}"


def _save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    paths = []
    for ext in ("pdf", "png"):
        path = out_dir / f"{name}.{ext}"
        with atomic_path(path) as tmp:  # a killed run leaves no half-drawn figure
            fig.savefig(tmp, format=ext, dpi=150, metadata=SAVE_METADATA[ext], bbox_inches="tight")
        paths.append(path)
    return paths


_PENDING: dict[str, Callable[[], Figure]] = {}  # what forked renderers build (render_all)


def _render(name: str, out_dir: Path) -> list[Path]:
    with matplotlib.rc_context(STYLE):
        return _save(_PENDING[name](), out_dir, name)


def render_all(
    builders: dict[str, Callable[[], Figure]], out_dir: Path, processes: int = 1
) -> list[Path]:
    """Build and save every figure (name -> a function that draws it), in order; the paths.
    Saving is most of the time (the PDFs' font subsetting above all), so with processes > 1 the
    figures are drawn and saved in forked processes, one figure each (the bytes are the same)."""
    _PENDING.clear()
    _PENDING.update(builders)
    try:
        n = min(processes, len(builders))
        if n > 1 and "fork" in multiprocessing.get_all_start_methods():
            # (an executor, not a Pool: a child that dies raises BrokenProcessPool, never hangs)
            fork = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(n, mp_context=fork) as pool:
                done = list(pool.map(_render, builders, [out_dir] * len(builders)))
        else:
            done = [_render(name, out_dir) for name in builders]
    finally:
        _PENDING.clear()
    return [path for paths in done for path in paths]


def bar_whisker(ax, x: float, value: float, rel) -> float:
    """A bar's 95% interval, `rel` of its `value` either side (None or NaN: none recorded, no
    whisker); the interval's top, where the bar's label goes."""
    rel = 0.0 if rel is None or rel != rel else float(rel)
    if rel:
        ax.errorbar(x, value, yerr=rel * value, fmt="none", ecolor="black", elinewidth=0.8,
                    capsize=2)  # fmt: skip
    return value * (1 + rel)


def mark_unmeasured(ax, x: float, width: float, label: str, edgecolor: str) -> None:
    """A full-height hatched band with a label, in axes coordinates: no value to be misread."""
    ax.axvspan(
        x - width / 2,
        x + width / 2,
        facecolor="none",
        edgecolor=edgecolor,
        hatch="///",
        linewidth=0.8,
    )
    ax.text(
        x,
        0.5,
        label,
        rotation=90,
        ha="center",
        va="center",
        transform=ax.get_xaxis_transform(),
        fontsize=8,
        color="#B00020",
        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
    )


def main_entry(summary) -> str:
    """`same` (the fair comparison); a study without it shows its first entry."""
    entries = sorted(dict.fromkeys(summary["batch_entry"]), key=entry_sort_key)
    return "same" if "same" in entries else entries[0]


# How a cell that has no measurement is marked, by its status: (mark, legend); else "n/a".
UNMEASURED = {"oom": ("OOM", "out of memory"), "diverged": ("diverged", "diverged")}


def unmeasured(status) -> str:
    return UNMEASURED.get(status, ("n/a",))[0]


def unmeasured_handles(summary) -> list:
    """The legend entry of hatched columns, naming what they mean in this figure."""
    failed = sorted(set(summary["status"]) - {"ok"})
    label = " / ".join(UNMEASURED.get(status, (0, status))[1] for status in failed)
    return [Patch(facecolor="none", edgecolor="grey", hatch="///", label=label)] if failed else []


def ok_rows(summary):
    return summary[summary["status"] == "ok"]


def placeholder(ax, text: str) -> None:
    """A figure with nothing to plot still gets written, saying why it is empty."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def oom_hband(ax, y: float, height: float, text: str = "OOM") -> None:
    """Hatched full-width row for an oom cell in a horizontal bar chart: no value to misread."""
    ax.axhspan(y - height / 2, y + height / 2, facecolor="none", edgecolor="#B00020", hatch="///")
    ax.text(
        0.5,
        y,
        text,
        transform=ax.get_yaxis_transform(),
        ha="center",
        va="center",
        fontsize=8,
        color="#B00020",
        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
    )


def unmeasured_note(ax, summary) -> None:
    """Name the cells that ran out of memory or diverged in the plot, rather than leave them out
    silently."""
    failed = summary[summary["status"] != "ok"]
    if not failed.empty:
        names = ", ".join(
            f"{r.technique} ({r.batch_entry}"
            + ("" if r.batch_size != r.batch_size else f", b={int(r.batch_size)}")
            + f", {unmeasured(r.status)})"
            for r in failed.itertuples()
        )
        ax.text(
            0.99,
            0.02,
            f"not shown: {names}",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7,
            color="#B00020",
            wrap=True,
        )
