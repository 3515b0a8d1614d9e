"""The default paper's sections on other published studies (config `paper.map`, `paper.quality`):
the map's abstract, findings and figures, and the quality study's verdicts, each from that study's
own files when the paper renders (tests/test_map_paper.py's map, tests/synthetic_study.py's study)."""

from __future__ import annotations

import shutil

import pytest
import yaml
from synthetic_study import CONFIG, TECHNIQUES, TEMPLATES, md_table
from test_map_paper import write_results

from memopt.config import validate_config
from memopt.errors import MemoptError
from memopt.report.paper import render_paper
from memopt.report.paper_links import _bridge
from memopt.run.cli import main


@pytest.fixture(scope="module")
def linked(tmp_path_factory, paper_study):
    root = tmp_path_factory.mktemp("linked")
    write_results(root / "map")
    main(["paper", "--config", str(root / "map/config.yaml"), "--results", str(root / "map/results"),
          "--data", str(root / "map/data"), "--out", str(root / "map/paper")])  # fmt: skip
    quality = root / "quality"
    (quality / "results").mkdir(parents=True)
    shutil.copy(paper_study["quality_csv"], quality / "results/quality.csv")
    config = {**CONFIG, "model": {**CONFIG["model"], "seq_len": 256}}  # room for the window
    (quality / "config.yaml").write_text(yaml.safe_dump(validate_config(config)))
    return root


def render_linked(study, root, out, links):
    shutil.copytree(study["figures"], out / "figures")
    render_paper(study["summary"], study["searches"], study["stats"], study["meta"],
                 {**CONFIG, "paper": {"focus": "timing", **links}}, out / "figures", TEMPLATES,
                 out / "paper.md", out / "paper.tex", quality_csv=study["quality_csv"],
                 exactness_paths=study["exactness"])  # fmt: skip
    return (out / "paper.md").read_text(), (out / "paper.tex").read_text()


def test_the_linked_studies_get_sections_of_their_own(paper_study, linked, tmp_path):
    md, tex = render_linked(paper_study, linked, tmp_path,
                            {"map": str(linked / "map"), "quality": str(linked / "quality")})  # fmt: skip
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    assert heads[3:9] == ["## 3 Results at the default point", "## 4 Results across the map",
                          "## 5 Quality: paired verdicts and what they can detect", "## 6 Discussion",
                          "## 7 Limitations", "## 8 Conclusion"]  # fmt: skip
    map_md = (linked / "map/paper/paper.md").read_text()
    findings = map_md.split("## 4 Findings")[1].split("## 5 Limitations")[0].strip()
    assert findings.splitlines()[0] in md  # the map's own findings, from its results
    section = md.split("## 4 Results across the map")[1].split("## 5 ")[0]
    for own in ("**What fills the memory.**", "**Throughput.**", "a search proves the largest"):
        assert own in map_md and own not in section  # the map's paper keeps them, linked: not
    assert "The proven maximum tokens per step on NVIDIA H100 80GB HBM3 against the sequence" in md
    for name in ("map_tokens_by_length",):  # copied beside its own figures (by size: not linked)
        assert f"](figures/{name}.png)" in md and f"{{figures/{name}.pdf}}" in tex
        for ext in ("png", "pdf"):
            copied, theirs = (
                tmp_path / f"figures/{name}.{ext}",
                linked / f"map/paper/figures/{name}.{ext}",
            )
            assert copied.read_bytes() == theirs.read_bytes()
    rows = {r["function"]: r for r in md_table(md, "Δ val loss")}
    limits = md.split("## 7 Limitations")[1].split("## 8 ")[0]  # no guess the map measures
    assert "hold at this point only (others: Results across the map)" in limits
    assert "not measured here" not in limits and "quadratically" not in md
    # the map ran on this study's GPU model: not excepted (the synthetic quality runs name
    # theirs "H100", another name, so that section is)
    assert "Every measurement but those of Quality: paired verdicts and what they can detect (H100) comes from one GPU " \
           "model, NVIDIA H100 80GB HBM3:" in limits  # fmt: skip
    conclusion = md.split("## 8 Conclusion")[1]  # its answer scoped to this point
    assert (
        "for this model at 64 tokens (other sizes and lengths: Results across the map):"
        in conclusion
    )
    # one noise rule, said once in Method and used by the map's excerpt too (memopt.report.noise)
    rule = "Two cells are *within noise* of each other, everywhere in this paper, when their " \
           "throughputs differ by no more than their noises added"  # fmt: skip
    assert rule in md and rule.replace("*within noise*", "\\emph{within noise}") in tex
    assert "plus 14% where cudaMalloc retried in its timed steps" in md
    assert "we call it faster or slower only beyond the two cells' noise (Method: each cell's " \
           "95% interval, plus 14% for a cell that retried)." in section  # fmt: skip
    assert "its own rule" not in md and "thresholds" not in section
    assert "(the map study's Limitations)" in section and "(Limitations)" not in section
    # the excerpt keeps to the answers (12 pages of main text): the map paper's own details
    # (FLOPs and MFU per point, kept scores, repeats) stay in that paper
    assert "Where faster, its model FLOPs" not in section and "grows with the length" not in section
    assert "This map's repeats" not in section
    assert rows["`bf16_w128`"]["verdict"] == "worse" and rows["`fp32`"]["Δ val loss"] == "reference"
    assert rows["`bf16`"]["Δ val loss"] == "0.015 [-0.049, 0.079]"  # 0.01 and 0.02 over 2 seeds
    assert "`bf16_w128` is worse by 0.205 nats" in md.split("## 5 Quality")[1]
    assert (
        r"\section{Results across the map}" in tex
        and r"\section{Quality: paired verdicts and what they can detect}" in tex
    )
    # the main text's room (12 pages): with the map linked, the throughput and maximum-batch
    # figures (Tables 1 and 2 have their numbers) and, with the quality study, this study's own
    # loss curves move to the appendix, in both formats
    main_md, appendix_md = md.split("## Reproducibility")
    main_tex, appendix_tex = tex.split("\\appendix")
    for name in ("throughput", "max_batch", "loss"):
        assert f"figures/{name}.png)" in appendix_md and f"figures/{name}.png)" not in main_md
        assert f"/{name}.pdf}}" in appendix_tex and f"/{name}.pdf}}" not in main_tex


def test_no_links_no_sections_and_a_wrong_folder_is_named(paper_study, tmp_path):
    md, tex = render_linked(paper_study, None, tmp_path / "plain", {})
    assert "## 3 Results\n" in md and "across the map" not in md and "## 4 Discussion" in md
    assert "of each other, everywhere in this paper, when" in md
    limits = md.split("## 5 Limitations")[1].split("## 6 ")[0]
    assert "size and the length is not measured here (memopt's map study" in limits
    assert "for this model at 64 tokens:" in md.split("## 6 Conclusion")[1]
    main_md, main_tex = md.split("## Reproducibility")[0], tex.split("\\appendix")[0]
    for name in ("throughput", "max_batch", "loss"):  # without links, in the main text
        assert f"figures/{name}.png)" in main_md and f"/{name}.pdf}}" in main_tex
    with pytest.raises(MemoptError, match=r"paper.quality: .*nowhere is not a published study"):
        render_linked(paper_study, None, tmp_path / "wrong", {"quality": str(tmp_path / "nowhere")})


def test_the_map_section_says_where_its_setting_meets_this_one(paper_study, linked, tmp_path):
    """The map's names and setting against this study's, computed from both configs: a
    technique with the same knobs under another name, one named alike with other knobs, and the
    model keys the map's points share that differ from this study's model."""
    md, tex = render_linked(paper_study, linked, tmp_path, {"map": str(linked / "map")})
    bridge = md.split("## 4 Results across the map")[1].split("\n\n")[2]
    assert bridge.startswith(f"Excerpts of the abstract and findings of the map study in `{linked / 'map'}` "
                             "follow; its tables are in that study's paper.")  # fmt: skip
    assert "Its reference is `flash`, not this study's `baseline`; its `fp32` is this study's " \
           "`baseline` (the same knobs); its `flash`, `window`, `offload` have no technique here " \
           "with the same knobs; its models differ from this study's in d_ff, 128 (here " \
           "256); dropout, 0.0 (here 0.1), so no point of the map repeats this study's " \
           "measurements; its searches and timing differ from this study's in search.max_batch, " \
           "unset (here 1024); measure.warmup_steps, 3 (here 2)." in bridge  # fmt: skip
    assert r"its \texttt{fp32} is this study's \texttt{baseline}" in tex
    assert "It ran on" not in bridge  # the map's GPU is this study's: nothing to say
    from memopt.report.paper import _render
    from memopt.report.paper_format import make_environment

    lm = {"path": "m", "techniques": ["a"], "reference": "a", "same": [], "differs": [],
          "model": [], "gpu": "NVIDIA H100 80GB HBM3"}  # fmt: skip
    other = _render(make_environment(TEMPLATES, False), "_linked_map.md.j2",
                    {"linked": {"map": lm}, "baseline": "b", "device": {"name": "NVIDIA H200"}})  # fmt: skip
    assert other.strip().endswith("It ran on NVIDIA H100 80GB HBM3, not this study's NVIDIA H200: "
                                  "its maxima and speeds are that GPU's.")  # fmt: skip
    # a setting this study leaves unset is named by what it then means
    lm["settings"] = [{"key": "search.host_pinned_gib", "map": 60, "here": None}]
    other = _render(make_environment(TEMPLATES, False), "_linked_map.md.j2",
                    {"linked": {"map": lm}, "baseline": "b", "device": {"name": "NVIDIA H200"},
                     "config": {"search": {"host_pinned_gib": None}}})  # fmt: skip
    assert "its searches and timing differ from this study's in search.host_pinned_gib, 60 (here " \
           "half the host's memory over its GPUs)." in other  # fmt: skip
    # one named as this study's with other knobs; one the same under another name
    theirs = validate_config({"techniques": {"local128": {**TECHNIQUES["local128"], "window": 16},
                                             "ckpt": TECHNIQUES["flash_gradcp"]},
                              "baseline": "ckpt", "model": CONFIG["model"]})  # fmt: skip
    found = _bridge(CONFIG, theirs)
    assert found == {"pairs": [{"map": "ckpt", "here": "flash_gradcp"}],
                     "same": [{"map": "ckpt", "here": "flash_gradcp"}],
                     "differs": [{"name": "local128", "knobs": ["window"]}], "model": [],
                     "settings": found["settings"]}  # fmt: skip
    assert found["settings"] == [
        {"key": "search.max_batch", "map": None, "here": 1024},
        {"key": "measure.warmup_steps", "map": 3, "here": 2},
    ]


def test_the_map_section_gives_this_studys_same_batch_ratios_and_a_reversed_order():
    """Beside the map's ratios at each technique's own maximum, this study's at its one batch;
    and where this study's maxima order two techniques otherwise than the map does at every
    point, it says so (with the numbers of both)."""
    from memopt.report.paper import _render
    from memopt.report.paper_format import make_environment

    lm = {"path": "m", "techniques": ["f", "c", "o"], "reference": "f", "same": [], "differs": [],
          "model": [], "gpu": "G", "above": [("c", "o"), ("c", "f")],
          "pairs": [{"map": "f", "here": "flash"}, {"map": "c", "here": "chunked"},
                    {"map": "o", "here": "offload"}]}  # fmt: skip
    cells = [{"technique": t, "batch_entry": "same", "status": "ok", "batch_size": 50,
              "tokens_per_s": v} for t, v in (("flash", 400.0), ("chunked", 300.0),
                                               ("offload", 200.0))]  # fmt: skip
    searches = [{"technique": t, "max_batch": b} for t, b in (("flash", 117), ("chunked", 1076),
                                                              ("offload", 1461))]  # fmt: skip
    context = {"linked": {"map": lm}, "baseline": "b", "device": {"name": "G"}, "cells": cells,
               "searches": searches, "tn": {"relative": 1, "search": 2}}  # fmt: skip
    text = _render(make_environment(TEMPLATES, False), "_linked_map.md.j2", context)
    assert "At this study's point, at one batch (50 sequences, Table 1), against `flash`'s " \
           "tokens/s: `chunked` 0.75× and `offload` 0.50×;" in text  # fmt: skip
    assert (
        "Here `offload` trains more sequences than `chunked` (1,461 against 1,076, Table 2), "
        "where the map's `c` trains more tokens per step than its `o` at every point." in text
    )
    assert "than `flash`" not in text  # chunked above flash here too: nothing to say
    searches[2]["max_batch"] = 900  # the same order as the map's: no sentence
    text = _render(make_environment(TEMPLATES, False), "_linked_map.md.j2", context)
    assert "Here `" not in text
    # the code each ran, where it differs
    lm["commits"], context["provenance"] = ["a" * 40], {"git_commit": ["b" * 40]}
    text = _render(make_environment(TEMPLATES, False), "_linked_map.md.j2", context)
    assert "It ran commit aaaaaaa (this study: bbbbbbb)." in text


def test_a_map_from_another_gpu_is_said_where_the_paper_speaks_of_one(paper_study, tmp_path):
    """A map measured on another GPU model than this study's (the H100 map in the H200 paper):
    Limitations' 'every number comes from one GPU model' excepts its section, and the Limitations
    and Conclusion name its GPU where they point to it."""
    root = tmp_path / "map"
    write_results(root)
    for cell in (root / "results/map").glob("*/cells/*/max.json"):
        cell.write_text(cell.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    main(["paper", "--config", str(root / "config.yaml"), "--results", str(root / "results"),
          "--data", str(root / "data"), "--out", str(root / "paper")])  # fmt: skip
    md, _ = render_linked(paper_study, None, tmp_path / "out", {"map": str(root)})
    limits = md.split("## 6 Limitations")[1].split("## 7 ")[0]
    assert "Every measurement but those of Results across the map (NVIDIA H200) comes from one GPU " \
           "model, NVIDIA H100 80GB HBM3:" in limits  # fmt: skip
    assert "hold at this point only (others: Results across the map)." in limits
    conclusion = md.split("## 7 Conclusion")[1]
    assert "(other sizes and lengths, on NVIDIA H200: Results across the map):" in conclusion
    bridge = md.split("## 4 Results across the map")[1].split("\n\n")[2]
    assert "It ran on NVIDIA H200, not this study's NVIDIA H100 80GB HBM3" in bridge
