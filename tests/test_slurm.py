"""Issue 13: the smoke study on a real single-node SLURM cluster (tools/slurm_local.sh: munge,
slurmdbd, slurmctld, slurmd on this machine) through profiles/slurm and Snakemake's SLURM executor
plugin, and sacct's record of its jobs. Needs root (the daemons) and SLURM installed: .ci/run
installs it; elsewhere the test says what is missing and skips."""

import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import DATASET
from smoke_workflow import SNAKEMAKE, workdir

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
TRAINING = ("search", "cell", "quality")


def _missing() -> str | None:
    if shutil.which("slurmctld") is None or shutil.which("sacct") is None:
        return (
            "SLURM is not installed here (as root: tools/slurm_local.sh install; .ci/run does it)"
        )
    if os.geteuid() != 0:
        return "starting SLURM's daemons (tools/slurm_local.sh start) needs root"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return 'the SLURM executor plugin is not installed (pip install -e ".[slurm]")'
    return None


@pytest.fixture(scope="module")
def slurm():
    if reason := _missing():
        pytest.skip(reason)
    running = subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0
    start = subprocess.run(
        ["bash", str(ROOT / "tools" / "slurm_local.sh"), "start"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert start.returncode == 0, start.stdout + start.stderr
    yield
    if not running:  # leave the machine as it was
        subprocess.run(["bash", str(ROOT / "tools" / "slurm_local.sh"), "stop"], timeout=120)


def test_smoke_study_runs_on_slurm_through_the_profile(slurm, mirror, tmp_path):  # noqa: F811
    wd = workdir(
        tmp_path,
        {"source": "mirror", "mirror": str(mirror.path), "dataset": DATASET},
        techniques=["baseline", "lean"],
    )
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    # The README's command, with this small node's sizes: 2 CPUs, ~22 GiB, two fake GPUs of type
    # `fake`, partition main, account memopt.
    cmd = SNAKEMAKE + [
        "--profile", "profiles/slurm", "--configfile", "study.yaml", "--config", "gpu_model=fake",
        "--max-threads", "2",
        "--default-resources", "slurm_account=memopt", "slurm_partition=main", "mem_mb=1000",
        "runtime=10",
        "--set-resources", *(f"{rule}:mem_mb=2000" for rule in TRAINING),
        "--slurm-init-seconds-before-status-checks", "1",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = pd.read_csv(wd / "results" / "summary.csv")
    assert set(summary["status"]) == {"ok"} and len(summary) == 4
    assert (wd / "paper" / "paper.md").exists()
    # What SLURM's accounting recorded: one job per rule run, all completed in the partition and
    # account given, a GPU (gres gpu:fake) for each training job and none for the others.
    fields = "JobID,JobName,Comment,Account,Partition,State,AllocTRES"
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", since, "-o", fields],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = [dict(zip(fields.split(","), line.split("|"))) for line in out.splitlines()]
    run = {r["JobName"] for r in rows if r["Comment"] == "rule_corpus"}
    assert len(run) == 1, rows  # this run's jobs share its name (Snakemake's run id)
    jobs = {r["Comment"]: r for r in rows if r["JobName"] in run}
    expected = {"rule_corpus", "rule_tokenizer", "rule_tokens", "rule_aggregate", "rule_figures"}
    expected |= {"rule_render"} | ({"rule_pdf"} if (wd / "paper" / "paper.pdf").exists() else set())
    for path in (wd / "results").glob("*/**/*.json"):
        kind, *parts = path.relative_to(wd / "results").with_suffix("").parts
        rule = {"search": "search", "cells": "cell", "quality": "quality"}.get(kind)
        if rule:
            expected.add(f"rule_{rule}_wildcards_{'_'.join(parts)}")
    assert set(jobs) == expected, (sorted(jobs), sorted(expected))
    for comment, job in jobs.items():
        assert (job["State"], job["Account"], job["Partition"]) == ("COMPLETED", "memopt", "main")
        training = comment.startswith(tuple(f"rule_{r}_" for r in TRAINING))
        assert ("gres/gpu:fake=1" in job["AllocTRES"]) == training, (comment, job["AllocTRES"])
