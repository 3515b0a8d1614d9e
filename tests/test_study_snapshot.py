"""The published default studies (issue 16): each ran from one commit on one physical GPU with every
job `ok`, and the tables of docs/results.md are what tools/study_report.py prints from their results.
(tests/test_studies.py checks that their papers are what their results render to.)"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from memopt.config import load_config_file, validate_config
from memopt.report.verdicts import exactness

ROOT = Path(__file__).resolve().parents[1]
# The default study (config.yaml) as published, per GPU model.
DEFAULT_STUDIES = {"h100-default": "NVIDIA H100 80GB HBM3", "h200-default": "NVIDIA H200"}


def _report(*names: str) -> str:
    paths = [str(ROOT / "studies" / n) for n in names]
    return subprocess.run(
        [sys.executable, "tools/study_report.py", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.parametrize("name", DEFAULT_STUDIES)
def test_the_run_meets_its_bar(name):
    """One commit for every job; one GPU (UUID) for every search and cell, whose memory and speed
    the paper compares, and that GPU's model for the quality runs (losses: a machine lost between
    two device calls moves them to another card, as issue 34 allows a map point's); every job ok;
    the study's techniques are config.yaml's; flash trains at least twice the baseline's batch."""
    results = ROOT / "studies" / name / "results"
    summary = pd.read_csv(results / "summary.csv").set_index(["technique", "batch_entry"])
    quality = pd.read_csv(results / "quality.csv")
    searches = [json.loads(p.read_text()) for p in (results / "search").glob("*.json")]
    uuids = set(summary["provenance_gpu_uuid"]) | {s["provenance"]["gpu_uuid"] for s in searches}
    assert len(uuids) == 1, uuids
    assert set(quality["provenance_gpu"]) == {DEFAULT_STUDIES[name]}
    commits = set(summary["provenance_git_commit"]) | set(quality["provenance_git_commit"])
    assert len(commits | {s["provenance"]["git_commit"] for s in searches}) == 1
    assert set(summary["device_name"]) == {DEFAULT_STUDIES[name]}
    assert set(summary["status"]) | set(quality["status"]) == {"ok"}
    assert {s["status"] for s in searches} <= {"ok", "capped"}
    default = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert list(dict.fromkeys(summary.index.get_level_values(0))) == list(default["techniques"])
    assert (
        summary.loc[("flash", "max"), "batch_size"]
        >= 2 * summary.loc[("baseline", "max"), "batch_size"]
    )
    config = validate_config(load_config_file(ROOT / "studies" / name / "config.yaml"))
    runs = [json.loads(p.read_text()) for p in (results / "exactness").glob("*.json")]
    check = exactness(runs, config["techniques"], config["exactness"]["tolerance"])
    assert check["holds"] and len(check["rows"]) == len(config["techniques"])  # shared functions


def _readme_blocks() -> dict[str, str]:
    """The generated tables of docs/results.md: `<!-- KIND: ... study_report.py studies/A
    [studies/B] -->` then the table, keyed by the command's study names."""
    text = (ROOT / "docs" / "results.md").read_text()
    found = re.findall(
        r"<!-- \w+: [^`]*`python tools/study_report.py ([^`]+)` -->\n(.+?)\n\n", text, re.S
    )
    return {" ".join(Path(p).name for p in cmd.split()): table for cmd, table in found}


def test_readme_headline_tables_are_the_studies():
    blocks = _readme_blocks()
    for name in DEFAULT_STUDIES:
        assert blocks[name] == _report(name).split("\n\n")[1].strip()
    # and the tool reads the numbers it prints from the summary (one cell re-derived here)
    summary = pd.read_csv(ROOT / "studies/h100-default/results/summary.csv")
    flash = summary[(summary.technique == "flash") & (summary.batch_entry == "same")].iloc[0]
    base = summary[(summary.technique == "baseline") & (summary.batch_entry == "same")].iloc[0]
    row = next(r for r in blocks["h100-default"].splitlines() if r.startswith("| `flash` |"))
    assert f"| {flash.tokens_per_s:,.0f} | {flash.tokens_per_s / base.tokens_per_s:.2f}x |" in row


def test_readme_compares_the_two_gpus_as_the_tool_does():
    """The cross-GPU table is study_report's, and its same-batch column is the H200's extra cells
    at the H100's baseline batch (one re-derived here)."""
    pair = " ".join(DEFAULT_STUDIES)
    assert _readme_blocks()[pair] == _report(*DEFAULT_STUDIES).split("\n\n")[-1].strip()
    h200 = json.loads((ROOT / "studies/h200-default/same-batch/cells/flash/50.json").read_text())
    row = next(r for r in _readme_blocks()[pair].splitlines() if r.startswith("| `flash` |"))
    assert f" / {h200['tokens_per_s']:,.0f} (" in row.split("|")[-3]


@pytest.mark.parametrize(
    "name", [n for n in DEFAULT_STUDIES if (ROOT / "studies" / n / "same-batch").exists()]
)
def test_same_batch_cells_ran_every_technique_on_the_study_gpu_model(name):
    """A study's extra cells (tools/gpu_study.sh cells BATCH): every technique of the config at the
    other study's baseline batch, on one GPU of the study's model, from one commit, all ok."""
    cells = [
        json.loads(p.read_text())
        for p in (ROOT / "studies" / name).glob("same-batch/cells/*/*.json")
    ]
    default = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert sorted(c["technique"] for c in cells) == sorted(default["techniques"])
    assert {c["status"] for c in cells} == {"ok"}
    assert {c["device_name"] for c in cells} == {DEFAULT_STUDIES[name]}
    assert len({c["provenance"]["gpu_uuid"] for c in cells}) == 1
    assert len({c["provenance"]["git_commit"] for c in cells}) == 1
    others = [n for n in DEFAULT_STUDIES if n != name]
    batches = {
        int(
            pd.read_csv(ROOT / "studies" / n / "results/summary.csv")
            .query("technique == 'baseline'")["batch_size"]
            .iloc[0]
        )
        for n in others
    }
    assert {c["batch_size"] for c in cells} <= batches


def test_two_studies_side_by_side_with_a_figure(tmp_path):
    """The cross-GPU comparison (issue 16), shown here on the two committed H100 studies: one row
    per technique both ran, the ratio of the second to the first, and the figure."""
    png = tmp_path / "compare.png"
    paths = [str(ROOT / "studies" / n) for n in ("h100-default", "h100-protocol-v2")]
    out = subprocess.run(
        [sys.executable, "tools/study_report.py", *paths, "--figure", str(png)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = {r.split("|")[1].strip(" `"): r for r in out.split("\n\n")[-1].splitlines()[2:]}
    assert list(rows) == ["baseline", "flash", "local128"]  # the techniques both studies ran
    a = pd.read_csv(paths[0] + "/results/summary.csv").set_index(["technique", "batch_entry"])
    b = pd.read_csv(paths[1] + "/results/summary.csv").set_index(["technique", "batch_entry"])
    ratio = b.loc[("flash", "max"), "tokens_per_s"] / a.loc[("flash", "max"), "tokens_per_s"]
    assert f"({ratio:.2f}x)" in rows["flash"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_studies_index_lists_every_published_study():
    index = (ROOT / "studies" / "README.md").read_text()
    folders = {p.name for p in (ROOT / "studies").iterdir() if p.is_dir()}
    assert folders == set(re.findall(r"\[`([\w-]+)/`\]", index))
