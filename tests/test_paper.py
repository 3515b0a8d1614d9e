"""Paper rendering: numbers in the tables equal summary.csv, strict templates, escaping, params."""

import math
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from test_results import CONFIG, TECHNIQUES, make_cell, write_study

from memopt.errors import MemoptError
from memopt.figures import make_figures
from memopt.paper import md, num, param_count, render_paper, tex
from memopt.results import aggregate, write_json

TEMPLATES = Path(__file__).resolve().parents[1] / "paper" / "templates"
# Main-table column -> (summary.csv column, decimals shown in the paper).
TABLE_NUMBERS = {
    "batch": ("batch_size", 0),
    "peak allocated (MiB)": ("peak_allocated_mib", 0),
    "peak reserved (MiB)": ("peak_reserved_mib", 0),
    "tokens/s": ("tokens_per_s", 0),
    "val ppl": ("val_ppl", 2),
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    paths = write_study(root)
    aggregate(paths["cells"], paths["summary"])
    make_figures(
        paths["summary"], paths["cells"], root / "paper" / "figures", search_paths=paths["searches"]
    )
    return paths | {"root": root, "figures": root / "paper" / "figures"}


def render(study, templates=TEMPLATES, name="paper", searches=None):
    out_md, out_tex = (
        study["root"] / "paper" / f"{name}.md",
        study["root"] / "paper" / f"{name}.tex",
    )
    render_paper(
        study["summary"],
        study["searches"] if searches is None else searches,
        study["stats"],
        study["meta"],
        CONFIG,
        study["figures"],
        templates,
        out_md,
        out_tex,
    )
    return out_md, out_tex


def md_table(text: str, column: str) -> list[dict]:
    """Parse the Markdown table whose header row has this column into one dict per row."""
    lines = text.splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.startswith("|") and f"| {column} |" in line
    )
    header = [h.strip() for h in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")))))
    return rows


def test_results_table_matches_summary(study):
    out_md, _ = render(study)
    summary = pd.read_csv(study["summary"], dtype={"batch_entry": str})
    rows = md_table(out_md.read_text(), "peak allocated (MiB)")
    assert [(r["technique"], r["entry"]) for r in rows] == list(
        zip(summary["technique"], summary["batch_entry"])
    )
    for row, expected in zip(rows, summary.to_dict(orient="records")):
        assert row["batch"] == f"{expected['batch_size']:,.0f}"
        if expected["status"] == "oom":
            assert row["status"] == "**OOM**"
            assert row["val ppl"] == row["tokens/s"] == "OOM"
            continue
        for header, (column, decimals) in TABLE_NUMBERS.items():
            assert row[header] == f"{expected[column]:,.{decimals}f}", (header, row)
        mean, sd = (expected[f"step_time_ms_{s}"] for s in ("mean", "std"))
        assert row["step time (ms)"] == f"{mean:,.1f} ± {sd:,.1f}"


def test_search_table_and_abstract(study):
    out_md, _ = render(study, searches=study["searches"][::-1])
    text = out_md.read_text()
    search = {r["technique"]: r for r in md_table(text, "max batch")}
    assert list(search) == list(TECHNIQUES)  # the cells' order, not the paths' order
    assert search["flash_gradcp"]["max batch"] == "64"
    assert search["flash_gradcp"]["first failing batch"] == "128"
    prose = " ".join(text.split())  # line breaks in the templates do not matter
    # Lowest peak memory at `same`: local128 (23456.789 / 3) vs the baseline's 23456.789.
    assert "**local128** has the lowest peak allocated memory, 7,819 MiB, 66.7% below" in prose
    # The fastest at `same` is the baseline itself: no "1.00x the baseline" self-comparison.
    assert "**baseline** has the highest throughput, 12,346 tokens/s." in prose
    assert "with **flash_gradcp** (8.0x the baseline's 8)" in prose
    assert "![Peak allocated memory" in text and "](figures/memory.png)" in text
    assert "10.5281/zenodo.4662725" in text  # the corpus is cited
    assert "{{" not in text and "{%" not in text


def test_tex_is_a_complete_escaped_document(study):
    _, out_tex = render(study)
    text = out_tex.read_text()
    for needle in (
        r"\documentclass",
        r"\usepackage{booktabs}",
        r"\usepackage{graphicx}",
        r"\includegraphics[width=\linewidth]{figures/memory.pdf}",
        r"\end{document}",
        r"flash\_gradcp",
        r"100\% Polish \& more",
    ):
        assert needle in text, needle
    typeset = text.split(r"\begin{verbatim}")[0]  # verbatim (the config appendix) needs no escaping
    assert "flash_gradcp" not in typeset.replace(r"flash\_gradcp", "")
    assert r"\VAR{" not in text and r"\BLOCK{" not in text


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed")
def test_tex_compiles(study):
    _, out_tex = render(study)
    result = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", out_tex.name],
        cwd=out_tex.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert out_tex.with_suffix(".pdf").stat().st_size > 10_000


def test_render_when_every_cell_is_oom(study, tmp_path):
    cells = []
    for technique in TECHNIQUES:
        path = tmp_path / "cells" / technique / "same.json"
        write_json(path, make_cell(technique, "same", 8, status="oom"))
        cells.append(path)
    aggregate(cells, tmp_path / "summary.csv")
    make_figures(tmp_path / "summary.csv", cells, tmp_path / "paper" / "figures")
    out_md, out_tex = tmp_path / "paper" / "paper.md", tmp_path / "paper" / "paper.tex"
    render_paper(
        tmp_path / "summary.csv",
        study["searches"],
        study["stats"],
        study["meta"],
        CONFIG,
        tmp_path / "paper" / "figures",
        TEMPLATES,
        out_md,
        out_tex,
    )
    text = out_md.read_text()
    assert "No technique completed a training cell at the same batch." in text
    assert text.count("| **OOM** |") == len(TECHNIQUES)
    assert "None" not in text and "None" not in out_tex.read_text()


def test_missing_variable_fails_render(study, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    (templates / "paper.md.j2").write_text("Peak: {{ no_such_value | num(1) }}\n")
    with pytest.raises(MemoptError, match="no_such_value"):
        render(study, templates, name="broken")
    # Neither format is written when one fails.
    assert not (study["root"] / "paper" / "broken.md").exists()
    assert not (study["root"] / "paper" / "broken.tex").exists()


def test_missing_figure_is_an_error(study, tmp_path):
    with pytest.raises(MemoptError, match="figure not found"):
        render_paper(
            study["summary"],
            study["searches"],
            study["stats"],
            study["meta"],
            CONFIG,
            tmp_path,
            TEMPLATES,
            tmp_path / "p.md",
            tmp_path / "p.tex",
        )


def test_filters():
    assert tex("a_b 50% R&D") == r"a\_b 50\% R\&D"
    assert tex(r"\x{#$~^}") == (
        r"\textbackslash{}x\{\#\$\textasciitilde{}"
        r"\textasciicircum{}\}"
    )
    assert num(1234567.891, 2) == "1,234,567.89"
    assert num(8) == "8"
    assert num(None) == "n/a" and num(math.nan, 1) == "n/a"
    assert md("a|b\nc") == r"a\|b c"


def test_param_count_by_hand():
    tiny = {"n_layers": 2, "d_model": 4, "n_heads": 2, "d_ff": 16, "seq_len": 8}
    embeddings = 10 * 4 + 8 * 4  # tied token embedding (vocab 10) + positions
    attention = (3 * 16 + 3 * 4) + (16 + 4)  # qkv + output projection, with biases
    mlp = (4 * 16 + 16) + (16 * 4 + 4)
    layer_norms = 2 * 2 * 4
    per_layer = attention + mlp + layer_norms
    assert per_layer == 80 + 148 + 16
    assert param_count(tiny, vocab_size=10) == embeddings + 2 * per_layer + 2 * 4 == 568
    # GPT-2 small with tied embeddings is the well-known 124,439,808.
    gpt2 = {"n_layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072, "seq_len": 1024}
    assert param_count(gpt2, vocab_size=50257) == 124_439_808


def test_pdf_without_a_tex_engine_says_so(monkeypatch, tmp_path):
    from memopt import paper

    monkeypatch.setattr(paper.shutil, "which", lambda name: None)
    with pytest.raises(MemoptError, match="no TeX engine found .* paper.md and paper.tex"):
        paper.build_pdf(tmp_path / "paper.tex", tmp_path / "paper.pdf")
    assert not (tmp_path / "paper.pdf").exists()


@pytest.mark.skipif(not shutil.which("pdflatex"), reason="no pdflatex here")
def test_build_pdf_leaves_only_the_pdf(study):
    from memopt.paper import build_pdf

    _, out_tex = render(study)
    out_tex.with_suffix(".pdf").unlink(missing_ok=True)  # another test may have compiled here
    before = set(out_tex.parent.iterdir())
    build_pdf(out_tex, out_tex.with_suffix(".pdf"))
    assert set(out_tex.parent.iterdir()) - before == {out_tex.with_suffix(".pdf")}
    assert out_tex.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"
