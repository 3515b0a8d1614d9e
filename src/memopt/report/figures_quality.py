"""The quality runs' figure: training loss against training tokens, per function, with seed bands."""

from __future__ import annotations

from matplotlib.figure import Figure

from memopt.report.figures_style import placeholder


def _moving_average(values: list[float], k: int) -> list[float]:
    """The mean of each value and the k - 1 before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - k] if i >= k else 0.0)
        out.append(total / min(i + 1, k))
    return out


def loss_figure(runs: list[dict], colors: dict, on_top: str | None = None) -> Figure:
    """Training loss against training tokens for every function's quality runs: the mean over
    seeds, with the band between the lowest and the highest seed; the right panel zooms into the
    last quarter of the tokens, where the curves lie too close to tell apart at full scale.
    `on_top`: the function (the reference) drawn above the others, which would hide it."""
    fig = Figure(figsize=(7.2, 3.4))
    ax, zoom = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    by_function: dict[str, list[dict]] = {}
    for run in runs:
        by_function.setdefault(run["function"], []).append(run)
    failed, tail = [], []  # tail: the zoom's values, for its y range
    for function, group in by_function.items():
        curves = [r["loss_curve"] for r in group if r["status"] == "ok" and r["loss_curve"]]
        if any(r["status"] == "diverged" for r in group):
            failed.append(f"{function} (a seed diverged)")
            continue
        if not curves:
            failed.append(f"{function} (no run finished)")
            continue
        n = min(map(len, curves))
        tokens = [(i + 1) * group[0]["tokens_per_step"] for i in range(n)]
        cols = list(zip(*(c[:n] for c in curves)))
        lo, mean, hi = (
            [min(c) for c in cols],
            [sum(c) / len(c) for c in cols],
            [max(c) for c in cols],
        )
        color, z = colors.get(function), 3 if function == on_top else 2
        label = f"{function} ({len(curves)} seeds)"
        ax.plot(tokens, mean, linewidth=1.0, label=label, color=color, zorder=z)
        if len(curves) > 1:
            ax.fill_between(tokens, lo, hi, color=color, alpha=0.25, linewidth=0)
        # The zoom: the last quarter, each curve a moving average over a twentieth of the steps
        # (step-to-step noise is larger than the differences between functions).
        start, k = 3 * n // 4, max(1, n // 20)
        smooth = [_moving_average(c[:n], k)[start:] for c in curves]
        s_lo, s_hi = [min(v) for v in zip(*smooth)], [max(v) for v in zip(*smooth)]
        s_mean = [sum(v) / len(v) for v in zip(*smooth)]
        tail += s_lo + s_hi
        zoom.plot(tokens[start:], s_mean, linewidth=1.0, color=color, zorder=z)
        if len(curves) > 1:
            zoom.fill_between(tokens[start:], s_lo, s_hi, color=color, alpha=0.25, linewidth=0)
    if failed:
        ax.text(
            0.99,
            0.97,
            "not shown: " + ", ".join(failed),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            color="#B00020",
        )
    if not runs:
        placeholder(ax, "no quality runs in this study")
    if ax.lines:
        ax.legend(loc="upper right", frameon=False)
    if tail:
        pad = 0.05 * ((max(tail) - min(tail)) or 1.0)
        zoom.set_ylim(min(tail) - pad, max(tail) + pad)
        zoom.set_title("last quarter, zoomed (moving average)", fontsize=8)
        zoom.set_xlabel("training tokens")
    else:
        zoom.set_axis_off()
    ax.set_xlabel("training tokens")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title("Quality runs: training loss (mean of seeds, band: seed range)", fontsize=8)
    fig.tight_layout()
    return fig


def positions_figure(runs: list[dict], colors: dict, on_top: str | None = None) -> Figure:
    """Validation loss by position in the sequence, per function: each bucket's loss, the mean
    over seeds, with the mean standard error over sequences as a bar, at the bucket's middle
    position (log scale); whether the model uses long context, and what a window gives up there."""
    fig = Figure(figsize=(7.2, 3.4), layout="constrained")  # the legend right of the axes
    ax = fig.subplots()
    by_function: dict[str, list[list[dict]]] = {}
    for run in runs:
        if run["status"] == "ok" and run.get("val_positions"):
            by_function.setdefault(run["function"], []).append(run["val_positions"])
    if not by_function:
        placeholder(ax, "loss by position was not recorded in these quality runs")
        return fig
    for function, seeds in by_function.items():
        buckets = seeds[0]
        x = [(b["first"] + b["last"]) / 2 for b in buckets]
        loss = [sum(s[i]["loss"] for s in seeds) / len(seeds) for i in range(len(buckets))]
        err = [sum(s[i]["se"] or 0.0 for s in seeds) / len(seeds) for i in range(len(buckets))]
        label = f"{function} ({len(seeds)} seed{'s' if len(seeds) != 1 else ''})"
        ax.errorbar(x, loss, yerr=err, marker="o", ms=3, capsize=2, lw=1.2, label=label,
                    color=colors.get(function), zorder=3 if function == on_top else 2)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(x, [f"{b['first']:,}–{b['last']:,}" for b in buckets], fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("positions in the sequence (log scale)")
    ax.set_ylabel("validation loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig
