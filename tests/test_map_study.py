"""The published map study (issue 34), once studies/ holds it: from one commit, each point's
searches and cells on one GPU of one model, every point and technique measured, every search
proven in at most 8 trials (but a stated deviation, STATED) or out of memory at batch 1, its
paper what this code renders from its results, and the map tables of docs/results.md and the
README what tools/map_report.py prints from them.

MAP_STUDY may name another folder (a draft published elsewhere) to run these checks on it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from memopt.config import load_config_file
from memopt.map_points import map_points
from memopt.run.cli import main

ROOT = Path(__file__).resolve().parents[1]
# On H200s (studies/h200-map: no H100 kind was lent after 8 of the map's 12 points there)
STUDY = Path(os.environ.get("MAP_STUDY") or ROOT / "studies" / "h200-map")
pytestmark = pytest.mark.skipif(
    not (STUDY / "results" / "map.csv").exists(), reason=f"{STUDY} is not published yet"
)


# Issue 34's bar is 8 trials a search. One search may pass it at the H100 map's commit (f0247d6):
# llama_1b_1024's ckpt_offload took 9 twice (studies/h100-map-pieces/README.md, "A search in 9
# trials"); the search code after that commit walks the same curve in 6 (tests/test_bracket.py
# replays it). Where a search does pass 8, the study's README must state it as a deviation.
STATED = {("f0247d6", "llama_1b_1024", "ckpt_offload"): 9}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return pd.read_csv(STUDY / "results" / "map.csv")


def test_one_commit_and_each_point_on_one_gpu(table):
    commits = set(table["git_commit"]) | set(table["search_git_commit"])
    assert len(commits) == 1, commits
    assert len(set(table["gpu"].dropna())) == 1  # one GPU model
    assert table["search_gpu_uuid"].notna().all()  # every search says where it ran
    timed = table[table["cell_status"] == "ok"]
    assert timed["gpu_uuid"].notna().all()
    for point, rows in table.groupby("point"):
        uuids = set(rows["search_gpu_uuid"]) | set(
            rows.loc[rows["cell_status"] == "ok", "gpu_uuid"]
        )
        assert len(uuids) == 1, (point, uuids)


def test_every_point_and_technique_is_measured_and_every_search_proven(table):
    config = load_config_file(STUDY / "config.yaml")
    assert set(table["point"]) == set(map_points(config))
    assert len(table) == len(map_points(config)) * len(config["techniques"])
    for r in table.itertuples():
        search = json.loads(
            (STUDY / f"results/map/{r.point}/search/{r.technique}.json").read_text()
        )
        if r.search_status == "none_fits":  # out of memory at batch 1 (compile starts at 2)
            assert not any(t["fits"] for t in search["trials"]) and r.trials <= 2
            assert 1 in {t["batch"] for t in search["trials"]}
            assert r.cell_status != "ok"
            continue
        bar = STATED.get((r.search_git_commit[:7], r.point, r.technique), 8)
        assert r.search_status == "ok" and r.trials <= bar, (r.point, r.technique, r.trials)
        if r.trials > 8:  # a stated deviation: the README names it
            readme = (STUDY / "README.md").read_text()
            assert f"{r.point}" in readme and f"{r.trials} trials" in readme, (r.point, r.technique)
        batches = {t["batch"]: t["fits"] for t in search["trials"]}
        assert batches[r.max_batch] and not batches[r.max_batch + 1]  # proven: B fits, B + 1 not
        if r.limit == "host":  # the budget's limit (search.host_pinned_gib), not a host that
            # could not pin that much
            miss = next(t for t in search["trials"] if t["batch"] == r.max_batch + 1)
            assert "would hold more than" in miss["error"], (r.point, r.technique)
        assert r.cell_status == "ok" and r.tokens_per_s > 0


@pytest.mark.slow
def test_the_paper_is_what_this_code_renders(tmp_path):
    copy = tmp_path / "study"
    shutil.copytree(STUDY, copy, ignore=shutil.ignore_patterns("paper"))
    args = ["paper", "--config", copy / "config.yaml", "--results", copy / "results"]
    main([*map(str, args), "--data", str(copy / "data"), "--out", str(copy / "paper")])
    for name in ("paper.md", "paper.tex"):
        assert (copy / "paper" / name).read_bytes() == (STUDY / "paper" / name).read_bytes(), name


@pytest.mark.parametrize("doc", ["docs/results.md", "README.md"])
def test_the_docs_map_tables_are_map_report(doc):
    """docs/results.md and the README: `<!-- map: ... python tools/map_report.py STUDY [--tokens]
    -->` then the tool's output, here printed again from the study."""
    text = (ROOT / doc).read_text()
    found = re.search(r"<!-- map: [^`]*`python tools/map_report.py (\S+)( --tokens)?` -->\n(.+?)"
                      r"\n<!-- /map -->", text, re.S)  # fmt: skip
    assert found and (ROOT / found.group(1)).resolve() == STUDY.resolve()
    args = [str(STUDY)] + ["--tokens"] * bool(found.group(2))
    out = subprocess.run([sys.executable, "tools/map_report.py", *args], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert found.group(3).strip() == out.strip()


def test_every_figure_and_table_of_the_map_paper_is_referred_to():
    md = (STUDY / "paper" / "paper.md").read_text()
    text = "\n".join(line for line in md.splitlines() if not line.startswith(("![", "Table ")))
    for n in re.findall(r"^!\[Figure (\d+):", md, flags=re.M):
        assert f"(Figure {n})" in text, n
    for n in re.findall(r"^Table (\d+):", md, flags=re.M):
        assert f"Table {n}" in text, n
