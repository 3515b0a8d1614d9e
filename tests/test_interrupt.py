"""Issue 14: a study killed with SIGKILL (its whole process group: Snakemake, its jobs' scripts)
at several points resumes as the README says (`snakemake --unlock`, then the same command) and
ends where an uninterrupted run ends; a job killed mid-run leaves no result file and is redone."""

from __future__ import annotations

import csv
import glob
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import DATASET
from smoke_workflow import planned, snakemake, study_command, workdir

pytestmark = pytest.mark.slow

# Where the study is killed, in this order, one run each (a rule with no job left to run is
# skipped: Snakemake chooses the order of independent jobs): the first job of the rule whose log
# was written by this run while its output does not exist yet (that job is running). A training
# job's log gets the warm worker's line when the worker starts it, so those are killed
# mid-training (every one of them trains for 0.3 s or more after that line on this CPU).
KILL_POINTS = [
    ("tokenizer", "logs/tokenizer.log", "data/tokenizer/spm.model", ""),
    ("search", "logs/search/*.log", "results/search/{stem}.json", "[memopt worker"),
    ("quality", "logs/quality/*/*.log", "results/quality/{parent}/{stem}.json", "[memopt worker"),
    ("cell", "logs/cell/*/*.log", "results/cells/{parent}/{stem}.json", "[memopt worker"),
    ("figures", "logs/figures.log", "paper/figures/memory.png", ""),
]


def running_job(wd: Path, since: float, log_glob: str, output: str, marker: str) -> Path | None:
    """The output of a job of this kind that this run started and has not finished, if any."""
    for log in sorted(glob.glob(str(wd / log_glob))):
        log = Path(log)
        try:
            if log.stat().st_mtime < since or marker not in log.read_text(errors="replace"):
                continue
        except FileNotFoundError:
            continue
        out = wd / output.format(stem=log.stem, parent=log.parent.name)
        if not out.exists():
            return out
    return None


def run_until_killed(wd: Path, point: tuple) -> Path:
    """Start the study in its own process group; SIGKILL the group once a job of `point` runs."""
    name, log_glob, output, marker = point
    since = time.time() - 1  # file times may be coarser than time.time()
    cmd, env = study_command()
    proc = subprocess.Popen(
        cmd, cwd=wd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        while (out := running_job(wd, since, log_glob, output, marker)) is None:
            assert proc.poll() is None, f"the study ended before a {name} job ran"
            assert time.monotonic() < deadline, f"no {name} job started in 600 s"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return out


def results(wd: Path) -> set[str]:
    """Every file the study makes (not the templates it was given, not speakleash's download
    cache, whose names carry a time, nor atomic writes' hidden temporary files)."""
    skip = {"templates", ".speakleash"}
    return {
        str(p.relative_to(wd))
        for top in ("data", "results", "paper")
        for p in (wd / top).rglob("*")
        if p.is_file() and not p.name.endswith(".tmp") and not skip & set(p.parts)
    }


def search_outcome(path: Path) -> tuple:
    s = json.loads(path.read_text())
    return s["max_batch"], [(t["batch"], t["fits"], t["peak_mib"]) for t in s["trials"]]


def test_a_study_killed_at_several_points_resumes_to_the_uninterrupted_result(
    smoke, mirror, tmp_path
):
    wd = workdir(tmp_path, {"source": "mirror", "mirror": str(mirror.path), "dataset": DATASET})
    kills = []
    for point in KILL_POINTS:
        if not planned(wd).get(point[0]):
            continue
        killed = run_until_killed(wd, point)
        kills.append(point[0])
        # Locked, as after any kill -9: the README's section "When a run is interrupted".
        proc = snakemake(wd, check=False)
        assert proc.returncode != 0 and "cannot be locked" in proc.stdout + proc.stderr, point
        # The job killed mid-run wrote nothing (a warm worker whose client died exits unwritten).
        time.sleep(1)
        assert not killed.exists(), (point, killed)
        snakemake(wd, "--unlock")
    # The tokenizer and the searches always have jobs left when their turn comes; quality runs
    # (which need only the tokens) may all have run before the first search, and the cells, in
    # principle, before the first quality run; the figures come last.
    assert kills[:2] == ["tokenizer", "search"] and kills[-1] == "figures", kills
    assert len(kills) >= 4, kills
    snakemake(wd)
    reference = smoke[0]
    assert results(wd) == results(reference)
    for path in sorted((reference / "results" / "search").glob("*.json")):
        assert search_outcome(wd / "results" / "search" / path.name) == search_outcome(path)
    with open(wd / "results" / "summary.csv") as f:
        assert {row["status"] for row in csv.DictReader(f)} == {"ok"}
