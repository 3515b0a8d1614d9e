"""Figures: every one written as PDF and PNG, non-empty, byte-identical on a rebuild."""

import pytest
from synthetic_study import TECHNIQUES, make_cell, write_study

from memopt.report.figures import FIGURE_NAMES, label_groups, make_figures, pareto
from memopt.report.results import aggregate, write_json


@pytest.mark.slow  # draws every figure twice (serial and forked) to compare the bytes; the other figure tests draw them once
def test_figures_exist_as_pdf_and_png(tmp_path):
    study = write_study(tmp_path)
    aggregate(study["cells"], study["summary"])
    paths = make_figures(
        study["summary"],
        tmp_path / "paper" / "figures",
        search_paths=study["searches"],
    )
    names = sorted(p.name for p in paths)
    expected = sorted(f"{n}.{e}" for n in FIGURE_NAMES for e in ("pdf", "png"))
    assert len(expected) == 2 * 10
    assert names == expected
    for path in paths:
        head = path.read_bytes()[:8]
        assert path.stat().st_size > 5000
        assert head.startswith(b"%PDF") if path.suffix == ".pdf" else head == b"\x89PNG\r\n\x1a\n"

    again = make_figures(
        study["summary"], tmp_path / "again", search_paths=study["searches"], processes=2
    )
    for first, second in zip(paths, again):  # reproducible (no dates or versions), forked too
        assert first.read_bytes() == second.read_bytes(), first.name


def test_figures_when_every_cell_is_oom(tmp_path):
    cells = []
    for technique in TECHNIQUES:
        path = tmp_path / "cells" / technique / "same.json"
        write_json(path, make_cell(technique, "same", 8, status="oom"))
        cells.append(path)
    aggregate(cells, tmp_path / "summary.csv")
    paths = make_figures(tmp_path / "summary.csv", tmp_path / "figures", processes=2)
    assert len(paths) == 2 * len(FIGURE_NAMES)
    assert all(p.stat().st_size > 0 for p in paths)


def test_figures_with_one_entry_and_a_renamed_baseline(tmp_path):
    """Only `max` cells (no `same`), and a baseline name that is not in the study: still written."""
    cells = []
    for technique in TECHNIQUES:
        path = tmp_path / "cells" / technique / "max.json"
        write_json(path, make_cell(technique, "max", 16))
        cells.append(path)
    aggregate(cells, tmp_path / "summary.csv")
    paths = make_figures(
        tmp_path / "summary.csv", tmp_path / "figures", baseline="ref", processes=2
    )
    assert sorted(p.stem for p in paths) == sorted(FIGURE_NAMES * 2)
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.parametrize(
    ("points", "frontier"),
    [
        ([], []),
        ([(10.0, 5.0)], [(10.0, 5.0)]),
        # (20, 4) uses more memory than (10, 5) and is slower: dominated
        ([(20.0, 4.0), (10.0, 5.0), (30.0, 9.0)], [(10.0, 5.0), (30.0, 9.0)]),
        # same memory, slower: dominated; same speed, more memory: dominated
        ([(10.0, 5.0), (10.0, 3.0), (12.0, 5.0)], [(10.0, 5.0)]),
        # an identical pair beats neither: both stay
        ([(10.0, 5.0), (10.0, 5.0), (5.0, 1.0)], [(5.0, 1.0), (10.0, 5.0), (10.0, 5.0)]),
    ],
)
def test_pareto(points, frontier):
    assert pareto(points) == frontier


def test_label_groups():
    points = [
        (79.0, 45.0),
        (79.0, 45.0),
        (79.5, 37.0),
        (79.0, 424.0),
        (79.0, 417.0),
        (79.0, 403.0),
        (35.0, 407.0),
        (19.0, 316.0),
        (22.0, 36.0),
    ]  # (memory, speed) of a study like the H100's
    cells = [
        ("baseline", "same"),
        ("baseline", "max"),
        ("gradcp", "max"),
        ("local128", "max"),
        ("local256", "max"),
        ("flash", "max"),
        ("local128", "same"),
        ("flash_gradcp", "same"),
        ("gradcp", "same"),
    ]
    labels = dict((text, xy) for xy, text in label_groups(points, cells))
    assert labels == {
        "local128 (max)\nlocal256 (max)\nflash (max)": (79.0, 424.0),  # 403 joins through 417
        "local128 (same)": (35.0, 407.0),
        "flash_gradcp (same)": (19.0, 316.0),
        "baseline (same, max)\ngradcp (max)": (79.5, 45.0),
        "gradcp (same)": (22.0, 36.0),
    }
    # Two groups that a later point links become one; one entry: no "(entry)".
    points = [(0.0, 50.0), (6.0, 49.0), (3.0, 48.0), (100.0, 0.0)]
    cells = [("a", None), ("b", None), ("c", None), ("d", None)]
    assert label_groups(points, cells) == [((6.0, 50.0), "a\nb\nc"), ((100.0, 0.0), "d")]
    assert label_groups(points[:2] + points[3:], cells[:2] + cells[3:])[:2] == [
        ((0.0, 50.0), "a"),
        ((6.0, 49.0), "b"),
    ]
    assert label_groups([], []) == []


def test_forked_rendering_keeps_order_and_fails_instead_of_hanging(tmp_path):
    import os
    from concurrent.futures.process import BrokenProcessPool

    from matplotlib.figure import Figure

    from memopt.report.figures_style import render_all

    def ok():
        fig = Figure()
        fig.add_subplot().plot([1, 2])
        return fig

    def crash():
        os._exit(3)

    paths = render_all({"b": ok, "a": ok}, tmp_path, processes=2)
    assert [p.name for p in paths] == ["b.pdf", "b.png", "a.pdf", "a.png"]
    with pytest.raises(BrokenProcessPool):  # a child that dies: an error, not a hang
        render_all({"a": ok, "dies": crash}, tmp_path, processes=2)


def test_placed_labels_never_overlap():
    """The trade-off figure's labels (issue 32: they overlapped in the smoke paper): crowded
    points, multi-line labels, one column of points at one memory value."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from memopt.report.figures_style import place_labels

    fig = Figure(figsize=(6.0, 3.8))
    ax = fig.subplots()
    points = [(8, 14_000), (8, 13_500), (8, 10_500), (8, 9_200), (8, 5_800), (8, 2_000),
              (7, 9_300), (7, 8_600), (6, 10_800), (3, 10_000)]  # fmt: skip
    ax.scatter(*zip(*points))
    ax.margins(x=0.2, y=0.15)
    labels = [(xy, f"technique{i} (max)" + ("\nother (same)" if i % 3 == 0 else ""))
              for i, xy in enumerate(points)]  # fmt: skip
    texts = place_labels(ax, labels)
    renderer = fig.canvas.get_renderer()
    for t in texts:
        t.update_positions(renderer)
    boxes = [Text.get_window_extent(t, renderer) for t in texts]  # the text, not its leader
    assert len(texts) == len(points)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    # Without placement the same labels overlap: the test can fail
    naive = [ax.annotate(t, xy, xytext=(5, 4), textcoords="offset points", fontsize=7, va="top")
             for xy, t in labels]  # fmt: skip
    boxes = [t.get_window_extent(renderer) for t in naive]
    assert any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_throughput_bars_carry_their_interval_and_memory_bars_none():
    """Issue 37: error bars where there are intervals: tokens/s has its mean step time's 95%
    interval (step_time_ms_rel_ci95); peak memory is one number, with none."""
    import pandas as pd
    from matplotlib.container import ErrorbarContainer

    from memopt.report.figures import _bar_figure

    summary = pd.DataFrame(
        [
            {
                "technique": t,
                "batch_entry": "same",
                "batch_size": 8,
                "status": "ok",
                "tokens_per_s": 1000.0 * (i + 1),
                "peak_allocated_mib": 100.0 * (i + 1),
                "step_time_ms_rel_ci95": 0.05,
            }
            for i, t in enumerate(("a", "b", "c"))
        ]  # fmt: skip
    )
    speed = _bar_figure(summary, "tokens_per_s", "tokens/s", "t", rel_err="step_time_ms_rel_ci95")
    bars = [c for c in speed.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 3
    low, high = bars[2].lines[2][0].get_segments()[0][:, 1]
    assert (low, high) == pytest.approx((2850.0, 3150.0))  # 3,000 ± 5%
    memory = _bar_figure(summary, "peak_allocated_mib", "MiB", "m")
    assert not [c for c in memory.axes[0].containers if isinstance(c, ErrorbarContainer)]
    # issue 37, no repeats: a max entry that is the same run as `same` (measured_as) is not a
    # second bar, only marked
    copy = {**summary.iloc[0].to_dict(), "batch_entry": "max", "measured_as": "same"}
    both = pd.concat([summary.assign(measured_as=None), pd.DataFrame([copy])], ignore_index=True)
    twice = _bar_figure(both, "peak_allocated_mib", "MiB", "m")
    assert len(twice.axes[0].patches) == len(memory.axes[0].patches) == 3
    assert "= same" in [t.get_text() for t in twice.axes[0].texts]


def _max_rows(batches: dict):
    import pandas as pd

    return pd.DataFrame([{"technique": t, "batch_entry": "max", "batch_size": b, "status": "ok"}
                         for t, b in batches.items()])  # fmt: skip


def test_maxima_spanning_decades_are_dots_on_a_log_axis_never_bars():
    """Issue 37: a bar's length on a log axis means nothing; within a decade, bars on a linear one."""
    from matplotlib.patches import Rectangle

    from memopt.report.figures import _max_batch_figure

    wide = _max_batch_figure(_max_rows({"a": 8, "b": 64, "c": 1068})).axes[0]
    assert wide.get_xscale() == "log"
    assert not [p for p in wide.patches if isinstance(p, Rectangle)]
    assert sorted(line.get_xdata()[0] for line in wide.lines) == [8, 64, 1068]
    narrow = _max_batch_figure(_max_rows({"a": 8, "b": 30, "c": 50})).axes[0]
    assert narrow.get_xscale() == "linear"
    assert sorted(p.get_width() for p in narrow.patches if isinstance(p, Rectangle)) == [8, 30, 50]


def test_the_windows_figure_draws_paired_differences_with_their_interval_and_the_margin():
    """Issue 37: no perplexities on a zoomed axis (noise on a 622-630 scale): each function's
    paired difference from the baseline's function with its 95% interval, the margin a band."""
    import pandas as pd
    from matplotlib.container import ErrorbarContainer

    from memopt.report.figures_batch import add_paired_quality, windows_figure
    from memopt.report.paired import paired_verdict

    summary = pd.DataFrame([
        {"technique": t, "batch_entry": "same", "batch_size": 8, "status": "ok", "function": f,
         "window": w, "kernel": k, "attention": k, "tokens_per_s": 1000.0, "quality_status": "ok",
         "peak_allocated_mib": 100.0}
        for t, f, w, k in (("base", "bf16", float("nan"), "flash"), ("w128", "bf16_w128", 128, "flex"))
    ])  # fmt: skip
    losses = {"bf16": (5.40, 5.44, 5.50), "bf16_w128": (5.42, 5.47, 5.55)}
    runs = [{"function": f, "seed": s, "status": "ok", "val_loss": v}
            for f, vs in losses.items() for s, v in zip((1, 2, 3), vs)]  # fmt: skip
    paired = add_paired_quality(summary, runs, "base")
    expected = paired_verdict([0.02, 0.03, 0.05], 1.0)
    row = paired.set_index("technique").loc["w128"]
    assert (row["dval"], row["dval_lo"], row["dval_hi"]) == pytest.approx(
        (expected["mean"], expected["lo"], expected["hi"])
    )
    assert paired.set_index("technique").loc["base", "dval"] == 0.0
    ax = windows_figure(paired, margin=0.02).axes[2]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    whiskers = [c.lines[2][0] for c in bars if c.lines[2]]  # the reference's point has none
    assert len(bars) == 2 and len(whiskers) == 1
    low, high = whiskers[0].get_segments()[0][:, 1]
    assert (low, high) == pytest.approx((expected["lo"], expected["hi"]))
    band = [p for p in ax.patches if p.get_y() == pytest.approx(-0.02)]
    assert band and band[0].get_height() == pytest.approx(0.04)
    assert not [p for p in ax.patches if p.get_width() == pytest.approx(0.7)]  # no bars
    # tokens/s has its mean step time's interval: whiskers on its bars; peak memory none
    paired["step_time_ms_rel_ci95"] = 0.05
    speed, memory = windows_figure(paired, margin=0.02).axes[:2]
    bars = [c for c in speed.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2
    assert bars[0].lines[2][0].get_segments()[0][:, 1] == pytest.approx((950.0, 1050.0))
    assert not [c for c in memory.containers if isinstance(c, ErrorbarContainer)]


def test_speed_against_memory_and_batch_carries_the_speed_interval():
    """Issue 37: error bars wherever a number has an interval: the trade-off and speed-by-batch
    points get their mean step time's 95% interval."""
    import pandas as pd
    from matplotlib.container import ErrorbarContainer

    from memopt.report.figures import _tradeoff_figure
    from memopt.report.figures_batch import speed_batch_figure

    summary = pd.DataFrame([
        {"technique": t, "batch_entry": e, "batch_size": b, "status": "ok",
         "tokens_per_s": 1000.0 * (i + 1) * (1 + (e == "max")), "peak_allocated_mib": 100.0 * b,
         "step_time_ms_rel_ci95": 0.05}
        for i, t in enumerate(("a", "b")) for e, b in (("same", 8), ("max", 16 * (i + 1)))
    ])  # fmt: skip
    trade = [c for c in _tradeoff_figure(summary).axes[0].containers
             if isinstance(c, ErrorbarContainer)]  # fmt: skip
    assert len(trade) == 4
    speed = [c for c in speed_batch_figure(summary).axes[0].containers
             if isinstance(c, ErrorbarContainer)]  # fmt: skip
    low, high = speed[0].lines[2][0].get_segments()[1][:, 1]  # technique a at batch 16
    assert (low, high) == pytest.approx((1900.0, 2100.0))
