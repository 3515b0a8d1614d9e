"""Issue 14: a study killed with SIGKILL (its whole process group: Snakemake, its jobs' scripts)
at several points resumes as docs/running.md says (`memopt unlock`, then the same command) and
ends where an uninterrupted run ends; a job killed mid-run leaves no result file and is redone."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
from conftest import DATASET
from smoke_workflow import planned, results, run_until_killed, snakemake, unlock, workdir

pytestmark = pytest.mark.slow

# Where the study is killed: each run is killed at the first job it starts of the next kind on
# this list, or of a later kind if it finished that one too fast to be caught (the tokenizer
# trains for a quarter of a second) or ran all of them before (Snakemake chooses the order of
# independent jobs). A job counts as running when this run wrote its log and its output does not
# exist; a training job's log gets the warm worker's line when the worker starts it, so those are
# killed mid-training (every one trains for 0.3 s or more after that line on this CPU).
KILL_POINTS = [
    ("tokenizer", "logs/tokenizer.log", "data/tokenizer/spm.model", ""),
    ("search", "logs/search/*.log", "results/search/{stem}.json", "[memopt worker"),
    ("quality", "logs/quality/*/*.log", "results/quality/{parent}/{stem}.json", "[memopt worker"),
    ("cell", "logs/cell/*/*.log", "results/cells/{parent}/{stem}.json", "[memopt worker"),
    ("figures", "logs/figures.log", "paper/figures/memory.png", ""),
]


def search_outcome(path: Path) -> tuple:
    s = json.loads(path.read_text())
    return s["max_batch"], [(t["batch"], t["fits"], t["peak_mib"]) for t in s["trials"]]


def test_a_study_killed_at_several_points_resumes_to_the_uninterrupted_result(
    smoke, mirror, tmp_path
):
    wd = workdir(tmp_path, {"source": "mirror", "mirror": str(mirror.path), "dataset": DATASET})
    kills, names = [], [p[0] for p in KILL_POINTS]
    while kills[-1:] != ["figures"]:
        after = names.index(kills[-1]) + 1 if kills else 0
        pending = planned(wd)
        points = [p for p in KILL_POINTS[after:] if pending.get(p[0])]
        if not points:
            break
        name, killed = run_until_killed(wd, points)
        kills.append(name)
        # Locked, as after any kill -9: docs/running.md, "When a run is interrupted".
        proc = snakemake(wd, check=False)
        assert proc.returncode != 0 and "cannot be locked" in proc.stdout + proc.stderr, name
        # The job killed mid-run wrote nothing (a warm worker whose client died exits unwritten).
        # A job with no training marker can end between being seen and the kill (the tokenizer
        # trains for a quarter of a second): its output, written atomically, is then whole, and
        # the run's end checks it against the uninterrupted one.
        time.sleep(1)
        marker = dict((p[0], p[3]) for p in KILL_POINTS)[name]
        assert not killed.exists() or not marker, (name, killed)
        unlock(wd)
    # At least a training job (a search at the latest: they train for seconds) and two more.
    assert len(kills) >= 3 and {"search", "quality", "cell"} & set(kills), kills
    snakemake(wd)
    reference = smoke[0]
    assert results(wd) == results(reference)
    for path in sorted((reference / "results" / "search").glob("*.json")):
        assert search_outcome(wd / "results" / "search" / path.name) == search_outcome(path)
    with open(wd / "results" / "summary.csv") as f:
        assert {row["status"] for row in csv.DictReader(f)} == {"ok"}
