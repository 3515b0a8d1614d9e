"""A table is defined once (memopt.report.tables) and rendered to Markdown and LaTeX by two format
functions: the same cells, caption and notes in both, values escaped for each."""

import pytest

from memopt.report.tables import Span, Table, latex, markdown


def table(**kw) -> Table:
    args = dict(
        columns=["technique", "batch", "peak (MiB)"],
        align="lrr",
        rows=[["flash_gradcp", "1,024", "70,000"], ["a|b", "**OOM**", Span("out of memory", 1)]],
        caption="the cells, *peak* at 95% of `max`.",
        number=3,
        label="cells",
        notes=["Δ loss: a note with a ± sign."],
        footer=[["total", "2", "–"]],
    )
    return Table(**{**args, **kw})


def test_markdown_numbers_the_caption_and_escapes_cells():
    text = markdown(table())
    lines = text.splitlines()
    assert lines[0] == "Table 3: the cells, *peak* at 95% of `max`."
    assert lines[2:4] == ["| technique | batch | peak (MiB) |", "|---|---:|---:|"]
    assert r"| a\|b | **OOM** | out of memory |" in lines  # a pipe cannot open a column
    assert lines[-3] == "| total | 2 | – |" and lines[-1] == "Δ loss: a note with a ± sign."


def test_latex_escapes_text_and_converts_the_markup():
    text = latex(table())
    assert r"\caption{the cells, \emph{peak} at 95\% of \texttt{max}.}" in text
    assert r"\label{tab:cells}" in text and r"\begin{tabular}{lrr}" in text
    assert r"flash\_gradcp & 1,024 & 70,000 \\" in text
    assert r"a|b & \textbf{OOM} & \multicolumn{1}{c}{out of memory} \\" in text
    # the footer sits under its own rule; the note, converted as the prose, sits under the
    # table inside the float (a float moves; a paragraph after it would stay behind)
    assert text.index(r"\midrule" + "\ntotal & 2 & -- \\\\") > text.index("flash")
    note = text.index(r"$\Delta$ loss: a note with a $\pm$ sign.")
    assert text.index(r"\end{tabular}") < note < text.index(r"\end{table}")
    assert text.endswith(r"\end{table}")


def test_an_unnumbered_table_and_the_layouts():
    plain = table(number=None, layout="shrink")
    assert markdown(plain).startswith("the cells,")  # no "Table N:"
    assert r"\caption*{" in latex(plain) and r"\ifdim\width>\linewidth" in latex(plain)
    assert r"\label{" not in latex(plain)  # it would name the last numbered float
    assert r"\label{tab:cells}" in latex(table())
    wide = latex(table(layout="sideways"))
    assert wide.startswith(r"\begin{sidewaystable}") and r"\end{sidewaystable}" in wide
    narrow = latex(table(colspec="p{3cm}p{2cm}p{2cm}"))
    assert r"flash\_\allowbreak{}gradcp" in narrow  # names may break in paragraph columns
    assert markdown(None) == latex(None) == ""


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="column counts"):
        table(rows=[["flash", "8"]])


def test_a_capped_searchs_predicted_batch_is_its_fit_at_the_budget():
    """Table 2's caption: *predicted* is the batch the fit puts at the budget; a capped search's
    own predicted_batch is its first guess (h200-default's flash_gradcp_chunked: 2,244)."""
    from memopt.report.paper_tables import _fit_at_budget

    capped = {"status": "capped", "predicted_batch": 2244, "fixed_mib": 1441.48,
              "per_sample_mib": 72.07, "budget_mib": 141355.125}  # fmt: skip
    assert _fit_at_budget(capped) == 1941  # (141,355 - 1,441) // 72.07
    assert _fit_at_budget({**capped, "fit_limit_mib": 141099.125}) == 1937  # the slack's limit
    assert _fit_at_budget({**capped, "status": "ok"}) == 2244  # the search's own, from its fit
    assert _fit_at_budget({**capped, "per_sample_mib": None}) is None


def test_the_references_retry_cost_is_named_beside_the_ratios():
    """Issue 37: a reference that retried cudaMalloc in its timed steps: its search trial at the
    same batch (a fresh allocator) prices the retries next to every ratio, or says it sees none."""
    from memopt.report.paper_tables_effects import _retry_sentence, retry_cost

    def ctx(cell_ms, retries=13):
        cell = {"technique": "baseline", "status": "ok", "batch_size": 50, "timed_steps": 13,
                "allocator_alloc_retries": retries, "step_time_ms_mean": cell_ms}  # fmt: skip
        trials = [{"batch": 12, "fits": True, "last_step_ms": 285.0},
                  {"batch": 50, "fits": True, "last_step_ms": 1144.0},
                  {"batch": 51, "fits": False, "last_step_ms": None}]  # fmt: skip
        return {"findings": {"batch_size": 50}, "cells": [cell],
                "searches": [{"technique": "baseline", "trials": trials}]}  # fmt: skip

    slow = retry_cost(ctx(1201.0), "baseline")
    assert slow["cost"] == pytest.approx(1201 / 1144 - 1)
    text = _retry_sentence(ctx(1201.0), "baseline", "speed-up")
    assert "retried cudaMalloc 13 times in its 13 timed steps" in text
    assert "took 1,144 ms against the cell's mean of 1,201" in text
    assert text.endswith(f"every speed-up would be {100 * (1 - 1144 / 1201):.1f}% smaller.")
    assert "no slower" in _retry_sentence(ctx(1100.0), "baseline", "speed-up")
    assert _retry_sentence(ctx(1201.0, retries=0), "baseline", "speed-up") == ""


def test_tables_may_share_a_page_of_floats_only_when_it_is_nearly_full():
    """Room on the 12-page budget: a table may float to a page of floats ([htbp]), and in the
    main text LaTeX makes such a page only when floats fill 80% of it (the default, 0.5, left a
    third of a page empty before a section's barrier); in the appendix the default again, so a
    lone figure is not flushed onto a page of its own by the barrier."""
    from pathlib import Path

    assert latex(table()).startswith(r"\begin{table}[htbp]")
    templates = Path(__file__).resolve().parents[1] / "paper" / "templates"
    for name in ("paper", "map", "quality"):
        main, appendix = (templates / f"{name}.tex.j2").read_text().split("\\appendix\n")
        assert r"\renewcommand{\floatpagefraction}{0.8}" in main, name
        assert r"\newcommand{\restorefloatpages}{\renewcommand{\floatpagefraction}{0.5}}" in main
        assert appendix.startswith("\\restorefloatpages\n"), name
