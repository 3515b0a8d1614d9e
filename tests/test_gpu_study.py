"""tools/gpu_study.sh: a study split over two machines resumes where it stopped (CPU, tiny study)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import DATASET
from smoke_workflow import ROOT, snakemake, workdir

pytestmark = pytest.mark.slow


def gpu_study(wd: Path, *args: str, **env: str) -> str:
    env = (
        dict(
            os.environ,
            PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            OUT=str(wd / "out"),
            STUDY_CONFIG="study.yaml",
            STUDY_DATASET=DATASET,
            MEMOPT_GIT_COMMIT="c0ffee",
        )
        | env
    )
    script = env.pop("SCRIPT", "gpu_study.sh")  # or another of tools/
    proc = subprocess.run(
        ["bash", f"tools/{script}", *args], cwd=wd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_study_resumes_on_another_machine(mirror, tmp_path):  # noqa: F811
    machines = []
    for name in ("a", "b"):
        wd = workdir(
            tmp_path / name,
            {"source": "mirror", "mirror": ".corpus", "dataset": DATASET},
            techniques=["baseline", "flash"],
        )
        shutil.copytree(ROOT / "tools", wd / "tools")
        shutil.copytree(mirror.path, wd / ".corpus")
        machines.append(wd)
    a, b = machines
    # Machine a runs the first target only: the searches.
    gpu_study(a, "start", "1000", STUDY_MAX_TARGETS="1")
    assert "== piece finished" in gpu_study(a, "wait", "300")
    assert sorted(p.name for p in (a / "results/search").glob("*.json")) == [
        "baseline.json",
        "flash.json",
    ]
    assert not (a / "results/cells").exists()
    gpu_study(a, "save")
    searched = {p.name: p.read_bytes() for p in (a / "results/search").glob("*.json")}
    # Machine b: a fresh checkout with the saved state; its data is rebuilt and must match.
    (b / ".study").mkdir()
    shutil.copy(a / "out/state.tar.gz", b / ".study/state.tar.gz")
    # ... and runs the rest in one Snakemake call: the searches are not redone.
    gpu_study(b, "start", "100000", STUDY_ONE_CALL="1")
    log = gpu_study(b, "wait", "300")
    assert "== all targets in one Snakemake call" in log and "FAILED" not in log
    assert {p.name: p.read_bytes() for p in (b / "results/search").glob("*.json")} == searched
    assert len(list((b / "results/cells").glob("*/*.json"))) == 4
    assert (b / "paper/paper.md").exists()
    corpus = "corpus={'source': 'mirror', 'mirror': '.corpus', 'dataset': '%s'}" % DATASET
    assert "Nothing to be done" in snakemake(b, "-n", "--config", corpus).stdout
    # Another piece on machine b (warm): b's own results and pieces log stay, not the state's.
    gpu_study(b, "start", "100000", STUDY_ONE_CALL="1")
    assert "== piece finished" in gpu_study(b, "wait", "300")
    assert (b / "logs/study-pieces.log").read_text().count("piece start") == 3  # a, b, b
    assert len(list((b / "results/cells").glob("*/*.json"))) == 4


def test_a_map_on_two_gpus_runs_each_point_on_one(mirror, tmp_path):  # noqa: F811
    """STUDY_GPUS=2: one Snakemake per GPU (CUDA_VISIBLE_DEVICES), each point claimed by one."""
    wd = workdir(
        tmp_path, {"source": "mirror", "mirror": ".corpus", "dataset": DATASET}, ["baseline"]
    )
    study = yaml.safe_load((wd / "study.yaml").read_text())
    study["map"] = {"models": {"a": {}, "b": {"arch": "llama", "n_kv_heads": 2}}, "seq_lens": [32]}
    study["batch_sizes"] = ["max"]
    (wd / "study.yaml").write_text(yaml.safe_dump(study))
    shutil.copytree(ROOT / "tools", wd / "tools")
    shutil.copytree(mirror.path, wd / ".corpus")
    gpu_study(wd, "start", "1000", STUDY_GPUS="2")
    log = gpu_study(wd, "wait", "600")
    assert "== piece finished" in log and "FAILED" not in log, log
    assert "logs/study-run-gpu1.log: 1 techniques done; 0 errors" in log, log
    runs = re.findall(r"== gpu (\d): point:(\S+) \(", log)
    assert sorted(point for _, point in runs) == ["a_32", "b_32"], log  # each point once
    for gpu, point in runs:  # its searches and cell in that GPU's Snakemake
        own = (wd / f"logs/study-run-gpu{gpu}.log").read_text()
        assert f"results/map/{point}/cells/baseline/max.json" in own
        # without locks: a Snakemake that ends deletes .snakemake/locks, another GPU's included
        commands = re.findall(r"Command: (.*)", own)
        assert commands and all("--nolock" in c for c in commands), commands
        assert (wd / f"results/map/{point}/cells/baseline/max.json").exists()
    # `wait` counts each GPU's errors: a Python exception's last line, as a failed Snakemake
    # start printed it on 4 H100s (2026-11-28), and Snakemake's own
    with open(wd / "logs/study-run-gpu0.log", "a") as f:
        f.write(
            "FileNotFoundError: [Errno 2] No such file or directory: '.snakemake/locks/0.input.lock'\n"
        )
        f.write("Error in rule map_cell:\n")
    assert "logs/study-run-gpu0.log: 1 techniques done; 2 errors" in gpu_study(wd, "wait", "5")
    # A machine lost mid-cell: `save` (STUDY_CONFIG unset: the config `start` recorded) leaves
    # out the point that is not whole, so it runs again, whole, on one GPU.
    (wd / "results/map/a_32/cells/baseline/max.json").unlink()
    assert "map point a_32 has 0/1 techniques done" in gpu_study(wd, "save", STUDY_CONFIG="")
    names = subprocess.run(
        ["tar", "tzf", "out/state.tar.gz"], cwd=wd, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "results/map/b_32/search/baseline.json" in names
    assert not [n for n in names if "/a_32" in n]  # its search, logs and benchmarks too
    # The next machine resumes from that state: a_32 (left out) runs again, and STUDY_REDO makes
    # b_32, saved whole, run again too (a point measured on several GPUs before whole-point saves)
    fresh = workdir(
        tmp_path / "fresh", {"source": "mirror", "mirror": ".corpus", "dataset": DATASET}, []
    )
    shutil.copy(wd / "study.yaml", fresh / "study.yaml")
    shutil.copytree(ROOT / "tools", fresh / "tools")
    shutil.copytree(mirror.path, fresh / ".corpus")
    (fresh / ".study").mkdir()
    shutil.copy(wd / "out/state.tar.gz", fresh / ".study/state.tar.gz")
    # ... on two GPUs, and the first GPU done once b_32 is whole (STUDY_REDO runs it again in
    # this piece) repeats b_32's cell twice (STUDY_REPEATS) in a copy of the folder
    assert "STUDY_REDO: map point b_32 runs again" in gpu_study(
        fresh,
        "start",
        "1000",
        STUDY_REDO="^b_32$",
        STUDY_GPUS="2",
        STUDY_REPEATS="b_32:baseline:2",
    )
    log = gpu_study(fresh, "wait", "600")
    assert "== piece finished" in log and "FAILED" not in log, log
    assert sorted(re.findall(r"point:(\S+) \(estimate", log)) == ["a_32", "b_32"], log
    runlog = (fresh / "logs/study-run.log").read_text()
    assert len(re.findall(r"== gpu \d: repeat [12] of b_32 baseline at batch \d+: ", runlog)) == 2
    own = json.loads((fresh / "results/map/b_32/cells/baseline/max.json").read_text())
    for r in (1, 2):  # the study's own cell stays; each repeat is a run of its own, after it
        again = json.loads((fresh / f"repeats/b_32/r{r}/baseline.json").read_text())
        assert again["batch_size"] == own["batch_size"]
        assert again["provenance"]["started"] > own["provenance"]["finished"]
    # the copy's warm workers were asked to exit (they would hold a GPU's memory)
    assert not [
        pid
        for pid in filter(str.isdigit, os.listdir("/proc"))
        if os.path.exists(f"/proc/{pid}/cwd")
        and os.path.realpath(f"/proc/{pid}/cwd").startswith("/tmp/memopt-repeats-")
        and "memopt.run.worker" in open(f"/proc/{pid}/cmdline", "rb").read().decode()
    ]
    # a later piece's repeats follow on after the highest round (r3, not a count of rounds)
    shutil.rmtree(fresh / "repeats/b_32/r1")
    gpu_study(fresh, "start", "1000", STUDY_GPUS="2", STUDY_REPEATS="b_32:baseline:1")
    assert "== piece finished" in gpu_study(fresh, "wait", "600")
    assert sorted(p.name for p in (fresh / "repeats/b_32").iterdir()) == ["r2", "r3"]
    gpu_study(fresh, "save")
    names = subprocess.run(
        ["tar", "tzf", "out/state.tar.gz"], cwd=fresh, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "repeats/b_32/r3/baseline.json" in names
    assert "results/map/b_32/cells/baseline/max.json" in names


def test_a_study_on_two_gpus_runs_in_one_snakemake_call(mirror, tmp_path):  # noqa: F811
    """STUDY_GPUS=2, not a map: the targets two GPUs finish before the deadline, in one call
    (gpu=2: on a GPU host the lease gives each job its own GPU; tests/test_lease.py)."""
    wd = workdir(
        tmp_path,
        {"source": "mirror", "mirror": ".corpus", "dataset": DATASET},
        ["baseline"],
    )
    shutil.copytree(ROOT / "tools", wd / "tools")
    shutil.copytree(mirror.path, wd / ".corpus")
    gpu_study(wd, "start", "1000", STUDY_GPUS="2", STUDY_ONLY="^results/cells/")  # (no paper)
    log = gpu_study(wd, "wait", "600")
    assert re.search(r"== 2 targets on 2 GPUs in one Snakemake call", log), log
    assert "FAILED" not in log and "== piece finished" in log, log
    assert len(list((wd / "results/cells").glob("*/*.json"))) == 2  # same and max
