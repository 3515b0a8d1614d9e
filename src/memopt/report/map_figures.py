"""A map study's figures and findings, from its table (results/map.csv, memopt.report.map_results).

Figures: the maximum tokens per step against model size (one panel per length) and against
length (one panel per model), one line per technique, out of memory at batch 1 drawn as a cross
on the x axis, never as a value; and the share of memory by kind at each point (weights, gradients,
optimizer state, activations, logits, the logits' gradient) of one technique at its maximum.

The findings those figures show are computed in memopt.report.map_results (starts_to_pay).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.transforms import ScaledTranslation

from memopt.report.figures_style import technique_colors
from memopt.report.map_results import BREAKDOWN

KINDS = BREAKDOWN  # the step's memory by kind, as results/map.csv has it
LABELS = {
    "optimizer_state": "optimizer state",
    "logits_grad": "logits' gradient",
    "activations": "other activations",
}  # the logits counted apart


def _panels(n: int, width: float = 3.4) -> tuple[Figure, list]:
    fig = Figure(figsize=(max(width * n, 6.4), 3.6), layout="constrained")
    return fig, list(fig.subplots(1, n, sharey=True, squeeze=False)[0])


# Lines of techniques that train the same maximum lie on each other: each technique gets its
# own dash pattern and marker, and techniques whose maxima come within CLOSE of each other at
# some value of a panel are drawn DODGE points apart sideways, so every one of them stays visible.
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
CLOSE = 1.05  # maxima within 5% of each other: their markers would cover each other
DODGE = 4.0  # points between the lines of one such group
FLOOR = 3.0  # the y axis starts this factor below the smallest maximum


def dodged(table, x: str, techniques) -> dict[str, float]:
    """Per technique, its line's sideways offset in points: techniques whose maxima lie within
    CLOSE of each other (or both fit nothing) at some value of `x`, directly or through another,
    form a group, spread evenly about 0 in the order given; a technique alone is not moved."""
    group = {t: {t} for t in techniques}
    for _, at in table.groupby(x):  # (two that fit nothing there: both 0, one cross on the other)
        values = dict(zip(at["technique"], at["max_tokens"]))
        for a in values:
            for b in values:
                if a != b and max(values[a], values[b]) <= min(values[a], values[b]) * CLOSE:
                    merged = group[a] | group[b]
                    for t in merged:
                        group[t] = merged
    out = {}
    for t in techniques:
        members = [m for m in techniques if m in group[t]]
        out[t] = (members.index(t) - (len(members) - 1) / 2) * DODGE
    return out


def _lines(ax, table, x: str, techniques, colors) -> None:
    """One line per technique over `x`; a point whose batch 1 does not fit as a cross on the x
    axis (below every value, never at a made-up one on the log scale)."""
    fig = ax.get_figure()
    offsets = dodged(table, x, techniques)
    for i, t in enumerate(techniques):
        rows = table[table["technique"] == t].sort_values(x)
        fits = rows[rows["max_tokens"] > 0]
        shift = ScaledTranslation(offsets[t] / 72, 0, fig.dpi_scale_trans)
        ax.plot(fits[x], fits["max_tokens"], marker=MARKERS[i % len(MARKERS)], ms=4, lw=1.2,
                ls=STYLES[i % len(STYLES)], color=colors[t], label=t, mfc="none",
                transform=ax.transData + shift)  # fmt: skip
        # a shifted line's transform is not the data's, so its values set the limits here
        ax.update_datalim(list(zip(fits[x], fits["max_tokens"])))
        none = rows[rows["max_tokens"] == 0]
        if len(none):  # (an empty unclipped line would count the figure's corner in the layout)
            ax.plot(none[x], [0.0] * len(none), "x", color=colors[t], ms=7, mew=1.5, clip_on=False,
                    transform=ax.get_xaxis_transform() + shift, zorder=5)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.autoscale_view()
    values = sorted(table[x].unique())  # the measured values, labelled as such
    if len(values) == 1:  # one value: centred, a factor of 2 either side
        ax.set_xlim(values[0] / 2, values[0] * 2)
    ax.set_xticks(values, [_short(v) if x == "params" else f"{int(v):,}" for v in values])
    ax.minorticks_off()
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(alpha=0.3, which="both")


def _floor(ax, table) -> None:
    """The panels' shared y axis starts a factor FLOOR below the smallest maximum drawn, so a
    cross on the x axis is not read as a value just under the lowest line (and a figure where
    nothing fits gets an axis of its own)."""
    fits = table.loc[table["max_tokens"] > 0, "max_tokens"]
    if len(fits):
        ax.set_ylim(bottom=fits.min() / FLOOR)
    else:
        ax.set_ylim(1, 10)


def _short(params: float) -> str:
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def _legend_below(fig: Figure, ax) -> None:
    """The techniques' legend under the panels, outside every axis (it hides no line)."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize=7)


def tokens_by_size(table) -> Figure:
    """Maximum tokens per step against parameters, one panel per length (the Llama-style
    models, one block style along the axis, where the map has them)."""
    llama = table[table["arch"] == "llama"]
    llama = llama if len(llama) else table  # a map without Llama-style models: every model
    lengths = sorted(llama["seq_len"].unique())
    techniques = list(dict.fromkeys(table["technique"]))
    colors = technique_colors(table)
    fig, axes = _panels(len(lengths))
    for ax, n in zip(axes, lengths):
        _lines(ax, llama[llama["seq_len"] == n], "params", techniques, colors)
        ax.set_title(f"{n:,} tokens", fontsize=9)
        ax.set_xlabel("parameters")
    axes[0].set_ylabel("max tokens per step\n(× on the axis: none fits)")
    _floor(axes[0], llama)
    _legend_below(fig, axes[0])
    return fig


def tokens_by_length(table) -> Figure:
    """Maximum tokens per step against the sequence length, one panel per model."""
    models = list(dict.fromkeys(table["model"]))
    techniques = list(dict.fromkeys(table["technique"]))
    colors = technique_colors(table)
    fig, axes = _panels(len(models), width=2.8)
    for ax, m in zip(axes, models):
        _lines(ax, table[table["model"] == m], "seq_len", techniques, colors)
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("sequence length")
    axes[0].set_ylabel("max tokens per step\n(× on the axis: none fits)")
    _floor(axes[0], table)
    _legend_below(fig, axes[0])
    return fig


def memory_shares(table, technique: str) -> Figure:
    """`technique`'s memory at its maximum by kind, as shares of the kinds' sum, at every point
    (a point it could not time is left empty and labelled)."""
    rows = table[table["technique"] == technique].reset_index(drop=True)
    fig = Figure(figsize=(max(6.0, 0.5 * len(rows)), 3.8), layout="constrained")
    ax = fig.subplots()
    kinds = [rows[f"{k}_mib"].fillna(0) for k in KINDS]
    total = sum(kinds)
    bottom = [0.0] * len(rows)
    palette = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
    for kind, values, color in zip(KINDS, kinds, palette):
        share = [v / s if s else 0.0 for v, s in zip(values, total)]
        ax.bar(range(len(rows)), share, bottom=bottom, color=color, label=LABELS.get(kind, kind))
        bottom = [b + s for b, s in zip(bottom, share)]
    for i, s in enumerate(total):
        if not s:
            ax.text(i, 0.5, "not timed", rotation=90, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(rows)), rows["point"], rotation=60, ha="right", fontsize=7)
    # two lines: the rotated point names leave the axis shorter than the label on one line
    ax.set_ylabel(f"share of memory\n({technique} at its maximum)")
    ax.set_ylim(0, 1)
    fig.legend(fontsize=7, ncols=(len(KINDS) + 1) // 2, loc="outside upper center")  # two rows
    return fig


def builders(table, reference: str) -> dict:
    """The map's figures by name, for memopt.report.figures_style.render_all."""
    return {
        "map_tokens_by_size": lambda: tokens_by_size(table),
        "map_tokens_by_length": lambda: tokens_by_length(table),
        "map_memory_shares": lambda: memory_shares(table, reference),
    }
