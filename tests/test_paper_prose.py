"""The paper's prose (memopt.report.paper_prose): written once in Markdown, converted to LaTeX; its
numbers are derived from the results, and no template hard-codes a measured number."""

import json
import re
from pathlib import Path

import pytest
import yaml

from memopt.config import load_config_file, validate_config
from memopt.report.paper import build_context
from memopt.report.paper_prose import md_to_tex, story

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "h100-protocol-v2"


def test_markdown_becomes_escaped_latex():
    assert md_to_tex("**`flash_gradcp`** is *more*") == (
        r"\textbf{\texttt{flash\_gradcp}} is \emph{more}"
    )
    assert md_to_tex("50% & 4.4× ± 1 → 2² #$_{}") == (
        r"50\% \& 4.4$\times$ $\pm$ 1 $\rightarrow$ 2$^2$ \#\$\_\{\}"
    )
    # A value cannot inject TeX: a backslash in it is printed, not run.
    assert md_to_tex(r"`\input{x}` \input{y}") == (
        r"\texttt{\textbackslash{}input\{x\}} \textbackslash{}input\{y\}"
    )
    long = md_to_tex("`f9672ea3fa2c6e6671d617367cbbd575`")  # may break at the margin
    assert long.count(r"\allowbreak{}") == 4 and long.replace(r"\allowbreak{}", "") == (
        r"\texttt{f9672ea3fa2c6e6671d617367cbbd575}"
    )
    assert md_to_tex("a * b * c") == "a * b * c"  # lone asterisks are not emphasis
    assert md_to_tex('a "no cost" claim, `x"y`') == "a ``no cost'' claim, \\texttt{x\"y}"


# What a template may write as a literal number: table and section numbers, the interval,
# threshold and search conventions (B + 1, batch 1), bit widths, the FLOP formula's constants, names, LaTeX layout.
_ALLOWED = [
    r"(Table|Section|Figure)[~ ]\d+", r"^#+ \d ", r"\d+ bits", r"95\\?%", r"\b1\\?% of",
    r"6·N", r"12·L", r"\$6", r"12\\cdot", r"12 L d", r"\(T \+ 1\)/2", r"1\)/2", r"gpu=1",
    r"B \+ 1", r"batch 1\b", r"80\\?% power", r"holds? 0\b", r"excludes 0\b", r"below 0\b", r"\[\d+pt\]", r"width=0\.\d+\\linewidth", r"margin=[\d.]+cm", r"\{\d\}\{c\}", r"p\{0\.\d+\\linewidth\}", r"floatpagefraction\}\{0\.\d+\}",
]  # fmt: skip


def _literal_text(template: str) -> str:
    text = re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", "", template, flags=re.S)
    nested = r"(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*"
    text = re.sub(rf"\\(?:VAR|BLOCK)\{{{nested}\}}|\\#\{{.*?\}}", "", text, flags=re.S)
    return text


@pytest.mark.parametrize(
    "path", sorted((ROOT / "paper" / "templates").rglob("*.j2")), ids=lambda p: p.name
)
def test_templates_hard_code_no_measured_number(path):
    text = _literal_text(path.read_text())
    for pattern in _ALLOWED:
        text = re.sub(pattern, "", text, flags=re.M)
    # A number standing alone: not part of a name (FP32, bf16, SHA-256, GPT-2, d_model).
    found = [
        text[max(0, m.start() - 20) : m.end() + 10]
        for m in re.finditer(r"(?<![\w\-/.])\d+(?:[.,]\d+)*(?![\w\-])", text)
    ]
    assert found == [], f"{path.name}: literal numbers in {found}"


@pytest.fixture(scope="module")
def context():
    results = STUDY / "results"
    return build_context(
        results / "summary.csv",
        sorted((results / "search").glob("*.json")),
        STUDY / "data" / "corpus" / "stats.json",
        STUDY / "data" / "tokens" / "meta.json",
        validate_config(load_config_file(STUDY / "config.yaml")),
        reference_path=ROOT / "paper" / "reference.yaml",
        quality_csv=results / "quality.csv",
        exactness_paths=sorted((results / "exactness").glob("*.json")),
    )


def _cell(context, technique, entry="same"):
    return next(
        c for c in context["cells"] if c["technique"] == technique and c["batch_entry"] == entry
    )


def test_the_story_derives_its_numbers_from_the_results(context):
    s = story(context)
    base = _cell(context, "baseline")
    fixed = base["weights_mib"] + base["gradients_mib"] + base["optimizer_state_mib"]
    assert s["memory"]["fixed_mib"] == pytest.approx(fixed)
    assert s["memory"]["bytes_per_param"] == pytest.approx(16, abs=0.5)  # AdamW in FP32
    assert s["memory"]["activations_share"] == pytest.approx(
        base["activations_mib"] / base["peak_allocated_mib"]
    )
    flash = _cell(context, "flash")
    share = s["fused_share"]
    # the v2 study has bf16 with the explicit kernel: the one-knob pair, the fused kernel's part
    bf16 = _cell(context, "bf16")
    assert share["share"] == pytest.approx(1 - flash["activations_mib"] / bf16["activations_mib"])
    assert (share["technique"], share["over"], share["with_precision"]) == ("flash", "bf16", None)
    # In gradcp the backward pass's working memory (the logits' gradient) exceeds all that is
    # kept; in flash_gradcp it does not: only gradcp is logits-bound.
    assert [t["technique"] for t in s["logits_bound"]] == ["gradcp"]
    gradcp = _cell(context, "gradcp")
    working = gradcp["peak_allocated_mib"] - fixed + gradcp["gradients_mib"]
    working -= gradcp["activations_mib"]
    assert s["logits_bound"][0]["working"] == pytest.approx(working)
    assert s["explicit_16bit"]["technique"] == "bf16"
    assert s["explicit_16bit"]["activations_mib"] > s["explicit_16bit"]["baseline_activations_mib"]
    assert s["bitwise_identical"] == ["gradcp"]
    ratios, means = [], []  # sequences a second at the max over those at the same batch
    for c in context["cells"]:
        same = _cell(context, c["technique"])
        if c["batch_entry"] == "max" and not c.get("measured_as") and c["batch_size"] > 50:
            per_s = c["batch_size"] / c["step_time_ms_median"]
            ratios.append(per_s / (same["batch_size"] / same["step_time_ms_median"]) - 1)
            means.append(c["tokens_per_s"] / same["tokens_per_s"] - 1)  # by the mean step
    speed = s["batch_speed"]
    assert {k: speed[k] for k in ("lo_median", "hi_median", "lo_mean", "hi_mean", "n")} == {
        "lo_median": min(ratios),
        "hi_median": max(ratios),
        "lo_mean": min(means),
        "hi_mean": max(means),
        "n": len(ratios),
    }
    # a gainer gains 5% at least by both the mean and the median step, beyond noise
    assert all(min(g["mean"], g["median"]) >= 0.05 for g in speed["gainers"])
    assert len(speed["gainers"]) <= sum(min(r, m) >= 0.05 for r, m in zip(ratios, means))


def _flash_at_max(context, mean: float, median: float, rel_ci: float) -> dict:
    """memopt.report.effects.batch_speed with `flash`'s max cell that many times its same
    cell's throughput by the mean and by the median step, both cells' intervals `rel_ci`."""
    from memopt.report.effects import batch_speed

    cells = [dict(c) for c in context["cells"]]
    same = next(c for c in cells if c["technique"] == "flash" and c["batch_entry"] == "same")
    top = next(c for c in cells if c["technique"] == "flash" and c["batch_entry"] == "max")
    top["tokens_per_s"] = mean * same["tokens_per_s"]
    top["step_time_ms_median"] = (
        same["step_time_ms_median"] * top["batch_size"] / same["batch_size"] / median
    )
    same["step_time_ms_rel_ci95"] = top["step_time_ms_rel_ci95"] = rel_ci
    return batch_speed(cells)


def test_a_technique_faster_at_its_maximum_beyond_noise_is_named(context):
    """+20% at the larger batch (by the mean and the median step) is a gain when the two cells'
    intervals are narrow, not when they are wide enough to hold it."""

    def gains(rel_ci):
        speed = _flash_at_max(context, 1.2, 1.2, rel_ci)
        return [g for g in speed["gainers"] if g["technique"] == "flash"]

    (gain,) = gains(0.01)
    assert gain["mean"] == pytest.approx(0.2) and gain["median"] == pytest.approx(0.2)
    assert gains(0.1) == []
    # the others' changes are given as they are (their range), not as "none gains more than"
    speed = _flash_at_max(context, 1.2, 1.2, 0.01)
    others = speed["others"]
    assert others["n"] == speed["n"] - len(speed["gainers"])
    assert others["hi_mean"] < 0.2 and others["lo_mean"] >= speed["lo_mean"]


def test_a_gain_by_the_median_alone_is_not_named(context):
    """The H100 study's `adamw8bit`: +5% by the median step at its maximum but -5% by the mean
    (its steps there are unsteady): not a technique that a larger batch makes faster."""
    speed = _flash_at_max(context, 0.95, 1.05, 0.001)
    assert "flash" not in [g["technique"] for g in speed["gainers"]]
    assert speed["lo_mean"] <= -0.05 + 1e-9 and speed["hi_median"] >= 0.05 - 1e-9


def test_the_story_leaves_out_what_the_data_does_not_show(context):
    """Without the baseline's breakdown there is no memory paragraph, and a study whose
    checkpointed cells keep more than the logits' gradient is not called logits-bound."""
    cells = [dict(c) for c in context["cells"]]
    for c in cells:
        if c["technique"] == "gradcp":
            c["activations_mib"] = c["peak_allocated_mib"]  # nothing left for working memory
        if c["technique"] == "baseline":
            c["gradients_mib"] = None
    s = story({**context, "cells": cells})
    assert s["memory"] is None and s["logits_bound"] == []


def test_the_references_are_what_the_prose_cites(tmp_path):
    """cite() in the prose (paper/literature.yaml): the in-text form, the References in the
    order first cited, each once; a key the file lacks is an error naming the key and file."""
    from memopt.errors import MemoptError
    from memopt.report.paper_literature import citations

    cite, cited = citations(ROOT / "paper" / "literature.yaml")
    assert cite("dao2022", "dao2023") == "(Dao et al., 2022; Dao, 2023)"
    assert cite("chen2016") == "(Chen et al., 2016)" and cite("dao2023")
    assert [c["id"] for c in cited] == ["dao2022", "dao2023", "chen2016"]
    assert cited[2]["text"].startswith("T. Chen, B. Xu")
    with pytest.raises(MemoptError, match="no entry 'nobody'.*it has: ansel2024"):
        cite("nobody")
    with pytest.raises(MemoptError, match="the file is missing"):
        citations(tmp_path / "literature.yaml")[0]("dao2022")
    paper = (ROOT / "studies" / "h100-default" / "paper" / "paper.md").read_text()
    body, refs = paper.split("## References", 1)
    for key, entry in yaml.safe_load((ROOT / "paper" / "literature.yaml").read_text()).items():
        assert (entry["cite"] in body) == (entry["text"] in refs), key


def test_the_per_layer_bytes_against_korthikanti():
    """memopt.report.paper_mechanisms.per_layer_bytes on h100-protocol-v2's searches: its
    fused BF16 search (flash) first, then the explicit kernel's (bf16): measured, counted, and
    34h (+ 5as for the explicit kernel's scores)."""
    from memopt.report.paper_mechanisms import per_layer_bytes

    folder = ROOT / "studies" / "h100-protocol-v2"
    model = validate_config(load_config_file(folder / "config.yaml"))["model"]
    searches = []
    for path in sorted((folder / "results" / "search").glob("*.json")):
        s = json.loads(path.read_text())
        searches.append({**s, "per_sample_mib": (s.get("fit") or {}).get("per_sample_mib")})
    h, a, seq = model["d_model"], model["n_heads"], model["seq_len"]
    k = per_layer_bytes(searches, model, 32000)
    assert (k["technique"], k["fused"], k["korthikanti"]) == ("flash", True, 34 * h)
    assert k["measured"] == pytest.approx(k["counted"], rel=0.002) and k["counted"] == 29232
    math = per_layer_bytes([s for s in searches if s["technique"] == "bf16"], model, 32000)
    assert (math["fused"], math["korthikanti"]) == (False, 34 * h + 5 * a * seq)
    assert math["measured"] == pytest.approx(math["counted"], rel=0.002)
    assert (
        per_layer_bytes([s for s in searches if s["technique"] == "baseline"], model, 32000) is None
    )
