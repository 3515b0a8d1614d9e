"""The paper of a study whose question is quality (`paper.focus: quality`, config/quality.yaml):
led by the paired verdicts, the functions and what they change, without the timing cells; its
numbers those of the quality runs (tests/synthetic_study.py)."""

from __future__ import annotations

import shutil
import statistics
import subprocess

import pytest
from synthetic_study import CONFIG, QUALITY_LOSS, TEMPLATES, md_table

from memopt.config import validate_config
from memopt.errors import ConfigError
from memopt.report.paper import render_paper
from memopt.report.paper_format import make_environment


def render_quality(study, tmp_path):
    out_md, out_tex = tmp_path / "quality.md", tmp_path / "quality.tex"
    shutil.copytree(study["figures"], tmp_path / "figures")
    render_paper(study["summary"], study["searches"], study["stats"], study["meta"],
                 {**CONFIG, "paper": {"focus": "quality"}}, tmp_path / "figures", TEMPLATES,
                 out_md, out_tex, quality_csv=study["quality_csv"],
                 exactness_paths=study["exactness"])  # fmt: skip
    return out_md.read_text(), out_tex


def test_the_quality_paper_leads_with_the_verdicts_and_leaves_out_the_timing(paper_study, tmp_path):
    text, _ = render_quality(paper_study, tmp_path)
    title = text.splitlines()[0]
    assert title.startswith("# What 2 training functions cost in quality against `fp32`")
    assert "on NVIDIA H100 80GB HBM3" in title
    assert "median step" not in text and "max batch" not in text  # no timing cell, no search
    functions = {r["function"]: r for r in md_table(text, "what it changes")}
    assert list(functions) == ["`fp32`", "`bf16`", "`bf16_w128`"]
    assert functions["`fp32`"]["what it changes"] == "the reference"
    assert functions["`bf16_w128`"]["what it changes"] == (
        "BF16 autocast, FP32 master weights; a sliding window of 128 tokens"
    )
    assert functions["`bf16_w128`"]["techniques"] == "`local128`"
    verdicts = {r["function"]: r["verdict"] for r in md_table(text, "verdict")}
    assert verdicts == {"fp32": "", "bf16": "inconclusive", "bf16_w128": "worse"}
    # the window's paired differences 0.20 and 0.21: mean 0.205
    assert "`bf16_w128` is worse by 0.205 nats" in text
    assert "`bf16` cannot be told from `fp32` with 2 paired seeds" in text
    assert "No function is shown equivalent" in text
    assert "cannot be told from `fp32`: their 95% intervals hold 0 and reach up to " in text
    assert (
        "so a cost that large is not ruled out, nor is none" in text
        and "include no cost" not in text
    )


def test_what_the_runs_took_and_where_they_ran(paper_study, tmp_path):
    text, _ = render_quality(paper_study, tmp_path)
    rows = {r["function"]: r for r in md_table(text, "train s per run")}
    assert list(rows) == list(QUALITY_LOSS)
    # each function: seeds of 2.5 and 3.5 training seconds, 40,960 tokens, 3.0 s wall each
    assert rows["fp32"]["train s per run"] == "3"
    rate = statistics.fmean([40_960 / 2.5, 40_960 / 3.5])
    assert rows["fp32"]["tokens/s"] == f"{rate:,.0f}"
    assert rows["fp32"]["GPU-hours"] == "0.00" and rows["fp32"]["runs"] == "2"
    assert "H100, UUID `GPU-1`: 6 quality runs." in text
    assert "Code: git commit `abc123`." in text
    assert "![Figure 1:" in text and "figures/loss.png" in text
    assert "positions.png" not in text  # these runs recorded no loss by position


def test_the_quality_paper_in_latex(paper_study, tmp_path):
    _, out_tex = render_quality(paper_study, tmp_path)
    tex = out_tex.read_text()
    assert r"\includegraphics[width=\linewidth]{figures/loss.pdf}" in tex
    assert (
        r"\VAR{" not in tex
        and r"\BLOCK{" not in tex
        and "bf16_w128" not in tex.replace(r"bf16\_w128", "")
    )
    if shutil.which("pdflatex"):
        done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error",
                               out_tex.name], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:]


def test_the_focus_is_checked():
    assert validate_config({"techniques": {"baseline": {}}})["paper"]["focus"] == "timing"
    with pytest.raises(ConfigError, match="paper.focus"):
        validate_config({"techniques": {"baseline": {}}, "paper": {"focus": "speed"}})


def test_the_positive_control_is_also_paired_with_its_one_knob_twin():
    """Against the reference a control may differ in more than its learning rate (bf16 against
    tf32): its twin at the configured rate isolates the one knob."""
    from memopt.report.paired import paired_verdict
    from memopt.report.quality_paper import _control_twins

    specs = validate_config({"techniques": {
        "tf32": {"precision": "tf32"}, "bf16": {"precision": "bf16"},
        "lr_half": {"precision": "bf16", "lr_scale": 0.5}}, "baseline": "tf32"})["techniques"]  # fmt: skip
    losses = {
        "tf32": (5.20, 5.18, 5.19),
        "bf16": (5.21, 5.17, 5.19),
        "bf16_lr0.5": (5.29, 5.26, 5.28),
    }
    runs = [{"function": f, "seed": s, "status": "ok", "val_loss": v}
            for f, vs in losses.items() for s, v in zip((1, 2, 3), vs)]  # fmt: skip
    rows = [{"function": "bf16_lr0.5", "techniques": ["lr_half"], "control": True},
            {"function": "bf16", "techniques": ["bf16"], "control": False}]  # fmt: skip
    ctx = {"config": {"techniques": specs}, "quality_runs": runs,
           "quality": {"rows": rows, "margin": 0.02}}  # fmt: skip
    [twin] = _control_twins(ctx)
    expected = paired_verdict([0.08, 0.09, 0.09], 0.02)
    assert twin["twin"] == "bf16" and twin["verdict"] == "worse"
    assert (twin["mean"], twin["lo"], twin["hi"]) == pytest.approx(
        (expected["mean"], expected["lo"], expected["hi"]))  # fmt: skip


def test_table_numbers_follow_the_tables_a_study_has_and_a_diverged_control_renders(
    paper_study, tmp_path
):
    """No loss by position here: the exactness table is Table 3 in both formats and the Method
    cites that number; a positive control whose seed diverged is said to have diverged (a harm
    no paired difference sizes), and the paper still renders."""
    from synthetic_study import make_quality

    from memopt.report.results import write_json
    from memopt.report.verdicts import aggregate_quality

    text, out_tex = render_quality(paper_study, tmp_path / "plain")
    assert "Table 3: exactness check" in text and "(Table 3)." in text.split("**Exactness.**")[1]
    assert "Table 4: what the quality runs took" in text and "Table 5" not in text
    runs = list(paper_study["quality"])
    for seed, status in ((1234, "ok"), (1235, "diverged")):
        run = {**make_quality("bf16", seed), "function": "bf16_lr0.5", "status": status,
               "diverged_step": 7 if status == "diverged" else None}  # fmt: skip
        runs.append(tmp_path / f"lr/{seed}.json")
        write_json(runs[-1], run)
    csv = tmp_path / "quality.csv"
    aggregate_quality(runs, csv)
    config = {**CONFIG, "paper": {"focus": "quality"}, "techniques": {
        **CONFIG["techniques"], "lr_half": {**CONFIG["techniques"]["flash_gradcp"], "lr_scale": 0.5}}}  # fmt: skip
    out = tmp_path / "control"
    shutil.copytree(paper_study["figures"], out / "figures")
    render_paper(paper_study["summary"], paper_study["searches"], paper_study["stats"],
                 paper_study["meta"], config, out / "figures", TEMPLATES, out / "q.md",
                 out / "q.tex", quality_csv=csv, exactness_paths=paper_study["exactness"])  # fmt: skip
    text = (out / "q.md").read_text()
    assert "(with a positive control)" in text.splitlines()[0]
    assert "`bf16_lr0.5` diverged (seed 1235): its harm is plain" in text
    assert "`bf16_lr0.5`: diverged (seed 1235);" not in text  # a control: not among the answers


def _says(rows):
    env = make_environment(TEMPLATES, False)
    quality = {"rows": rows, "reference_function": "fp32", "margin": 0.02}
    return env.get_template("_quality_says.md.j2").render(
        story={"bitwise_identical": []}, quality=quality, exactness={"rows": []}, exactness_table=1
    )


def _inconclusive(function, n, lo, hi, mdd):
    paired = {"n": n, "lo": lo, "hi": hi, "mdd": mdd}
    return {"function": function, "verdict": "inconclusive", "control": False,
            "val_loss": {"n": n}, "paired": paired}  # fmt: skip


def test_inconclusive_functions_with_the_same_seeds_share_one_sentence():
    """Several functions the seeds cannot tell from the reference: one sentence, each function's
    interval and minimum detectable difference in it, in order; seeds that differ keep theirs."""
    text = _says([_inconclusive("tf32", 2, -0.095, 0.096, 0.106),
                  _inconclusive("bf16", 2, -0.054, 0.046, 0.055)])  # fmt: skip
    assert text.count("cannot be told from `fp32`") == 1
    assert (
        "`tf32` and `bf16` cannot be told from `fp32` with 2 paired seeds each: every 95% interval"
        " of the difference holds 0 and reaches past ±0.020 nats (`tf32` -0.095 to 0.096, `bf16`"
        " -0.054 to 0.046), and differences smaller than roughly 0.106 and 0.055 nats in that order"
    ) in text
    text = _says([_inconclusive("tf32", 2, -0.095, 0.096, 0.106),
                  _inconclusive("bf16", 3, -0.054, 0.046, 0.055)])  # fmt: skip
    assert text.count("cannot be told from `fp32`") == 2 and "with 3 paired seeds:" in text
