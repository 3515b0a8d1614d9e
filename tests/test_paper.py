"""Paper rendering: numbers in the tables equal summary.csv, strict templates, escaping, params."""

import math
import re
import shutil
import subprocess

import pandas as pd
import pytest
from synthetic_study import (
    CONFIG,
    TECHNIQUES,
    TEMPLATES,
    make_cell,
    md_table,
    render,
    render_cells,
)

from memopt.errors import MemoptError
from memopt.fileio import read_json
from memopt.report.paper import render_paper
from memopt.report.paper_format import build_pdf, md, md_to_tex, mib, mparams, num, sig, tex
from memopt.report.results import write_json
from memopt.runtime.flops import param_count

# Main-table column -> (summary.csv column, decimals shown in the paper).
TABLE_NUMBERS = {
    "batch": ("batch_size", 0),
    "peak allocated (MiB)": ("peak_allocated_mib", 0),
    "peak reserved (MiB)": ("peak_reserved_mib", 0),
    "timed steps": ("timed_steps", 0),
}


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
            assert row["status"] == "**OOM**" and row["peak allocated (MiB)"] == "out of memory"
            assert row["retries"] == row["tokens/s"] == ""  # one cell across the measurements
            continue
        for header, (column, decimals) in TABLE_NUMBERS.items():
            assert row[header] == f"{expected[column]:,.{decimals}f}", (header, row)
        median, lo, hi = (
            expected[f"step_time_ms_{s}"] for s in ("median", "median_lo", "median_hi")
        )
        # tokens/s from the mean step, ± that mean's relative 95% interval (the noise rule's)
        rel = expected["step_time_ms_rel_ci95"]
        assert row["tokens/s"] == f"{expected['tokens_per_s']:,.0f} ±{100 * rel:.1f}%", row
        mark = " †" if isinstance(expected["unstable"], str) else ""
        assert row["median step (ms)"] == f"{median:,.1f} [{lo:,.1f}–{hi:,.1f}]{mark}"
        assert bool(mark) == ((row["technique"], row["entry"]) == ("local128", "max"))
        assert row["retries"] == str(
            int(expected["allocator_alloc_retries"] + expected["allocator_ooms"])
        )


def test_unstable_cells_are_flagged_with_the_reason(study):
    text = render(study)[0].read_text()
    assert (
        "† Unstable cells, whose mean step time misleads (the median is the steady state): " in text
    )
    # the slow path the unsteady steps come from, when the allocator took it (2 retries here)
    assert (
        "`local128` (max, batch 24): first 3 timed steps +40% off the rest; "
        "cudaMalloc retried 2 times in its 10 timed steps." in text
    )


def test_search_table_and_abstract(study):
    out_md, _ = render(study, searches=study["searches"][::-1])
    text = out_md.read_text()
    search = {r["technique"]: r for r in md_table(text, "max batch")}
    assert list(search) == list(TECHNIQUES)  # the cells' order, not the paths' order
    assert search["flash_gradcp"]["max batch"] == "64"
    assert search["flash_gradcp"]["first failing batch"] == "128"
    prose = " ".join(text.split())  # line breaks in the templates do not matter
    # Lowest peak memory at `same`: local128 (23456.789 / 3) vs the baseline's 23456.789.
    assert "**`local128`** needs the least memory, 7,819 MiB (66.7% below" in prose
    # The fastest at `same` is the baseline itself: no "1.00x the baseline" self-comparison.
    assert "**`baseline`** is the fastest, 12,346 tokens/s, and" in prose
    # flash_gradcp's search found 64, but its max cell ran out of memory: the largest batch that
    # trains is local128's 24.
    assert "**`local128`** trains the largest batch, 24 sequences, 3.0× the baseline's 8." in prose
    assert prose.startswith("# `local128` trains a 3.0× larger batch")  # the title says so
    assert (
        re.search(r"!\[Figure \d+: Peak allocated memory per cell", text)
        and "](figures/memory.png)" in text
    )
    assert "10.5281/zenodo.4662725" in text  # the corpus is cited
    assert "{{" not in text and "{%" not in text


def test_method_says_how_jobs_ran(study, monkeypatch):
    out_md, out_tex = render(study)
    for path in (out_md, out_tex):
        prose = " ".join(path.read_text().split())
        assert "in one warm process per GPU that runs the study's jobs one after another" in prose
    monkeypatch.setitem(CONFIG, "worker", {"enabled": False, "idle_s": 60})
    out_md, _ = render(study, name="fresh")
    prose = " ".join(out_md.read_text().split())
    assert "on the same batches, each in a fresh process." in prose and "warm process" not in prose


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
    assert "flash_gradcp" not in text.replace(r"flash\_gradcp", "")  # the config appendix too
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
    cells = [make_cell(technique, "same", 8, status="oom") for technique in TECHNIQUES]
    out_md, out_tex = render_cells(study, tmp_path, cells)
    text = out_md.read_text()
    assert "No technique completed a training cell at the same batch." in text
    assert text.count("| **OOM** |") == len(TECHNIQUES)
    assert "None" not in text and "None" not in out_tex.read_text()


def test_missing_variable_fails_render(study, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    shutil.copy(TEMPLATES.parent / "literature.yaml", tmp_path)  # the prose's citations
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
    # Sizes and counts of a tiny model never print as zero
    assert mib(78_940.4) == "78,940 MiB" and mib(0) == "0 MiB" and mib(None) == "n/a"
    assert mib(0.4727) == "484 KiB" and mib(0.5 / 1024) == "512 bytes" and mib(-0.25) == "-256 KiB"
    assert mparams(124_439_808, 1) == "124.4 M" and mparams(30_976, 2) == "30,976"
    assert sig(0.000187, 3) == "0.00019" and sig(0.85, 3) == "0.850" and sig(2415.4) == "2,415"
    assert sig(None) == "n/a"


def test_a_commands_double_dash_prints_as_typed_in_latex():
    """T1 typewriter fonts join -- into an en dash ("memopt paper –config"): code spans and the
    templates' own commands break the pair; a range's en dash in prose stays one."""
    assert md_to_tex("run `snakemake --configfile x.yaml` for 1–2 h") == (
        r"run \texttt{snakemake -{}-configfile x.yaml} for 1--2 h"
    )
    assert md_to_tex("`a---b`") == r"\texttt{a-{}-{}-b}"
    for template in TEMPLATES.glob("*.tex.j2"):
        for code in re.findall(r"\\texttt\{([^{}]*)\}", template.read_text()):
            assert "--" not in code, (template.name, code)


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
    from memopt.report import paper_format

    monkeypatch.setattr(paper_format.shutil, "which", lambda name: None)
    with pytest.raises(MemoptError, match="no TeX engine found .* paper.md and paper.tex"):
        paper_format.build_pdf(tmp_path / "paper.tex", tmp_path / "paper.pdf")
    assert not (tmp_path / "paper.pdf").exists()


@pytest.mark.skipif(not shutil.which("pdflatex"), reason="no pdflatex here")
def test_build_pdf_leaves_only_the_pdf(study):
    from memopt.report.paper_format import build_pdf

    _, out_tex = render(study)
    out_tex.with_suffix(".pdf").unlink(missing_ok=True)  # another test may have compiled here
    before = set(out_tex.parent.iterdir())
    build_pdf(out_tex, out_tex.with_suffix(".pdf"))
    assert set(out_tex.parent.iterdir()) - before == {out_tex.with_suffix(".pdf")}
    assert out_tex.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"


def test_paper_lists_the_gpus_and_warns_when_cells_ran_on_several(study, tmp_path):
    """Issue 13: a table of the GPUs each job ran on (model, UUID, host, jobs of each kind), and a
    warning in the method and there when the timing cells ran on more than one GPU (by UUID: two
    cards of one model differ too), with the GPU of each cell in Table 1 (issue 15)."""
    h100 = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_uuid": "u-h100", "host": "node1"}
    h200 = {"gpu": "NVIDIA H200", "gpu_uuid": "u-h200", "host": "node2"}
    cells = [make_cell(t, "same", 8) | {"provenance": h100} for t in TECHNIQUES]
    out_md, _ = render_cells(study, tmp_path / "one", cells)
    text = out_md.read_text()
    rows = md_table(text, "UUID")
    assert rows == [{"": "GPU 1", "GPU": h100["gpu"], "UUID": "u-h100", "host": "node1",
                     "timing cells": str(len(TECHNIQUES)), "searches": "0", "quality runs": "0"}]  # fmt: skip
    assert "Warning" not in text and "GPU column" not in text
    assert (
        f"All {len(TECHNIQUES)} timing cells ran on one GPU (NVIDIA H100 80GB HBM3, UUID `u-h100`)"
        in text
    )
    # Two cards of one model: still two GPUs, and each cell says which it ran on.
    cells[-1]["provenance"] = h100 | {"gpu_uuid": "u-other"}
    text = render_cells(study, tmp_path / "uuids", cells)[0].read_text()
    assert "**The timing cells ran on 2 GPUs** (NVIDIA H100 80GB HBM3;" in text
    assert "GPU models are not comparable" not in text
    assert [r["GPU"] for r in md_table(text, "median step (ms)")] == ["GPU 1"] * (
        len(TECHNIQUES) - 1
    ) + ["GPU 2"]
    cells[-1]["provenance"] = h200
    out_md, out_tex = render_cells(study, tmp_path / "two", cells)
    text = out_md.read_text()
    assert [(r["UUID"], r["timing cells"]) for r in md_table(text, "UUID")] == [
        ("u-h100", str(len(TECHNIQUES) - 1)),
        ("u-h200", "1"),
    ]
    assert "**The timing cells ran on 2 GPUs** (NVIDIA H100 80GB HBM3, NVIDIA H200;" in text
    assert "**Warning:** **The timing cells ran on 2 GPUs**" in text
    assert "cells of different GPU models are not comparable at all" in text
    tex_text = out_tex.read_text()
    assert "u-h200 & node2 & 1 & 0 & 0" in tex_text.replace("\\texttt{\\scriptsize ", "").replace(
        "}", ""
    )
    assert "\\textbf{Warning:} \\textbf{The timing cells ran on 2 GPUs}" in tex_text


@pytest.mark.skipif(
    shutil.which("pdflatex") is None or shutil.which("pdftotext") is None,
    reason="pdflatex and pdftotext needed",
)
def test_the_config_cannot_inject_latex_or_publish_a_password(study, tmp_path):
    """Issue 31, finding 6: the appendix printed the config inside `verbatim`, so a config string
    could end it and \\input any file the user can read into the PDF; a mirror URL's password went
    into the paper as it was."""
    secret = tmp_path / "secret.tex"
    secret.write_text("TOPSECRETMARKER\n")
    payload = f"\\end{{verbatim}}\\input{{{secret}}}\\begin{{verbatim}}"
    config = {
        **CONFIG,
        "corpus": {**CONFIG.get("corpus", {}), "mirror": "https://reader:hunter2@example.org/sl/"},
        "measure": {**CONFIG["measure"], "cuda_alloc_conf": payload},
    }
    out_md, out_tex = tmp_path / "p.md", tmp_path / "p.tex"
    render_paper(
        study["summary"], study["searches"], study["stats"], study["meta"], config,
        study["figures"], TEMPLATES, out_md, out_tex,
        quality_csv=study["quality_csv"], exactness_paths=study["exactness"],
    )  # fmt: skip
    build_pdf(out_tex, tmp_path / "p.pdf")
    text = subprocess.run(
        ["pdftotext", str(tmp_path / "p.pdf"), "-"], capture_output=True, text=True, check=True
    ).stdout
    assert "TOPSECRETMARKER" not in text
    assert "input{" + str(secret) in "".join(text.split())  # printed as text, all of it
    for path in (out_md, out_tex):
        assert "hunter2" not in path.read_text()
    assert "https://***@example.org/sl/" in out_md.read_text() and "hunter2" not in text
    # The Markdown fence is longer than any backtick run a config string holds.
    config["measure"]["cuda_alloc_conf"] = "```\n# injected heading"
    render_paper(
        study["summary"], study["searches"], study["stats"], study["meta"], config,
        study["figures"], TEMPLATES, out_md, out_tex,
        quality_csv=study["quality_csv"], exactness_paths=study["exactness"],
    )  # fmt: skip
    appendix = out_md.read_text().split("defaults filled:", 1)[1]
    assert appendix.lstrip().startswith("````yaml\n") and appendix.rstrip().endswith("````")


def test_a_cpu_run_reads_as_one(study, tmp_path):
    """A CPU run's paper (the smoke study's) uses no GPU words, compares with no TF32 reference
    (a CPU computes tf32 in FP32) and with no GPU report, and prints no size as 0 MiB."""

    def on_cpu(result: dict) -> dict:  # what a CPU run records: no GPU anywhere
        result = {k: v for k, v in result.items() if not k.startswith("gpu")}
        prov = {k: v for k, v in result.get("provenance", {}).items() if not k.startswith("gpu")}
        cpu = {"device": "cpu", "device_name": "CPU (x86_64, 2 threads)", "provenance": prov}
        cpu |= {"mfu": None, "hfu": None} if "mfu" in result else {}  # no known peak
        cpu |= {k: None for k in result if k.startswith("allocator_")}  # no caching allocator
        return result | cpu

    cells = [on_cpu(read_json(path)) for path in study["cells"]]
    searches = [tmp_path / "search" / path.name for path in study["searches"]]
    for path, out in zip(study["searches"], searches):
        write_json(out, on_cpu(read_json(path)))
    md, tex = render_cells(study | {"searches": searches}, tmp_path, cells)
    text = md.read_text()
    for word in ("GPU", "CUDA", "cudaMalloc", "card", "0 MiB per", "× TF32", "vs TF32"):
        assert word not in text, (word, [ln for ln in text.splitlines() if word in ln][:3])
    assert "We answer for a CPU (x86_64, 2 threads)" in text
    assert "GPU" not in tex.read_text().split("\\appendix")[0]


@pytest.mark.parametrize(
    "how, run, words",
    [("kernel", ("math", "flash"), "a second exact attention kernel"),
     ("compile", ("compiled", "eager"), "the model under torch.compile")],
)  # fmt: skip
def test_measured_noise_floors_set_the_exactness_tolerance_in_the_paper(
    study, tmp_path, how, run, words
):
    """exactness.floor kernel or compile: the method, the table and its notes say the tolerance is
    a multiple of each reference's measured floor and how it was measured, and name a reference
    without one (and why)."""
    paths = []
    for i, path in enumerate(study["exactness"]):
        record = read_json(path)
        if i == 0:  # no second kernel for this one
            record["floor"] = {"kernel": None, "reason": "no second exact kernel on cpu"}
        else:
            record["floor"] = {"kernel": run[0], "against": run[1],
                               "losses": [v + 0.0003 * (k % 2) for k, v in enumerate(record["losses"])]}  # fmt: skip
        paths.append(tmp_path / "exactness" / path.name)
        write_json(paths[-1], record)
    shutil.copytree(study["figures"], tmp_path / "paper" / "figures")
    config = {**CONFIG, "exactness": {**CONFIG["exactness"], "floor": how, "floor_factor": 2}}
    out_md, out_tex = tmp_path / "paper" / "paper.md", tmp_path / "paper" / "paper.tex"
    render_paper(study["summary"], study["searches"], study["stats"], study["meta"], config,
                 tmp_path / "paper" / "figures", TEMPLATES, out_md, out_tex,
                 quality_csv=study["quality_csv"], exactness_paths=paths)  # fmt: skip
    text = out_md.read_text()
    assert (
        f"within 2.0× their function's noise floor (its reference's run repeated with {words})"
        in text
    )
    assert "Noise floors: " in text and f"0.00030 ({run[0]} against {run[1]})" in text
    assert f"same run with {words}" in " ".join(text.split())  # the table's caption
    first = read_json(study["exactness"][0])["technique"]
    assert f"`{first}`: no second exact kernel on cpu" in text
    assert "noise floor" in out_tex.read_text()
