"""The smoke study through Snakemake, for the workflow tests (tests/test_workflow.py,
tests/test_interrupt.py): a copy of the workflow in a temporary folder with a tiny study config, a
fixture corpus served as a mirror, and the whole study run once per test session (`smoke`)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import DATASET, _prose, write_speakleash_mirror
from plan_runner import parse_plan

from memopt.report.paper_format import tex_engine

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PDF = {"pdf": 1} if tex_engine() else {}  # paper.pdf is part of `all` where TeX is installed

# The smoke study, smaller still, so the whole DAG runs twice in a few minutes on 2 cores.
TINY = {
    "tokenizer": {"vocab_size": 400, "train_chars": 200_000},
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 32},
    "train": {"warmup_steps": 2, "eval_sequences": 8, "eval_batch_size": 4},
    "measure": {"warmup_steps": 3, "min_timed_steps": 3, "max_timed_steps": 5},
    "quality": {"tokens": 4096, "batch": 8, "seeds": 2},
    "exactness": {"steps": 4, "batch": 2},
    "search": {"cpu_memory_budget_gib": 0.008, "max_batch": 128},
}


def deep_update(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        base[k] = deep_update(base.get(k, {}), v) if isinstance(v, dict) else v
    return base


def workdir(tmp: Path, corpus: dict, techniques: list[str] | None = None) -> Path:
    """A copy of the workflow (so edits stay local) with a study config for the fixture corpus."""
    for part in (
        "Snakefile",
        "config.yaml",
        "config",
        "workflow",
        "src",
        "paper/templates",
        "paper/reference.yaml",
        "paper/literature.yaml",
        "envs",
        "profiles",
    ):
        src, dst = ROOT / part, tmp / part
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    study = deep_update(yaml.safe_load((ROOT / "config/smoke.yaml").read_text()), TINY)
    study["device"] = "cpu"
    study["corpus"].update(corpus)
    if techniques:
        study["techniques"] = {k: v for k, v in study["techniques"].items() if k in techniques}
    (tmp / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp


def study_command(*args) -> tuple[list[str], dict]:
    """The study's Snakemake command line (targets first: --resources would take a target
    written after it as one more resource) and its environment."""
    cmd = SNAKEMAKE + [*args, "--cores", "2", "--resources", "gpu=1", "--configfile", "study.yaml"]
    return cmd, dict(os.environ, PYTHONUNBUFFERED="1")


def snakemake(wd: Path, *args, check=True) -> subprocess.CompletedProcess:
    cmd, env = study_command(*args)
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, env=env, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc


def unlock(wd: Path) -> str:
    """The README's step after a kill -9: `memopt unlock` (refuses while a job still runs)."""
    proc = subprocess.run(
        [sys.executable, "-m", "memopt.run.cli", "unlock"], cwd=wd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def planned(wd: Path, *args) -> dict[str, int]:
    """Jobs a dry run would run, per rule (empty when there is nothing to do)."""
    proc = snakemake(wd, "-n", *args)
    return parse_plan(proc.stdout + proc.stderr)


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


def start_study(wd: Path, *args) -> subprocess.Popen:
    """The study's Snakemake run in the background, in a process group of its own; what it
    prints goes to wd/snakemake-run.log."""
    cmd, env = study_command(*args)
    with open(wd / "snakemake-run.log", "w") as out:
        return subprocess.Popen(
            cmd, cwd=wd, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )


def wait_for_job(proc: subprocess.Popen, wd: Path, since: float, points: list[tuple]):
    """(kind, output) of the first job of one of `points` (name, log glob, output pattern, a
    marker its log holds once it trains) that runs, checked every 20 ms."""
    deadline = time.monotonic() + 600
    while True:
        for name, log_glob, output, marker in points:
            if (out := running_job(wd, since, log_glob, output, marker)) is not None:
                return name, out
        assert proc.poll() is None, f"the study ended before any of {points} ran"
        assert time.monotonic() < deadline, f"none of {points} started in 600 s"
        time.sleep(0.02)


def run_until_killed(wd: Path, points: list[tuple], *args):
    """Start the study (with `args`); SIGKILL its process group once a job of one of `points`
    runs (the earliest in the list, if several); that job's kind and output."""
    since = time.time() - 1  # file times may be coarser than time.time()
    proc = start_study(wd, *args)
    try:
        return wait_for_job(proc, wd, since, points)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


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


def copy_study(wd: Path, dst: Path) -> Path:
    """A copy of a finished study (modification times and Snakemake's records kept), to break."""
    shutil.copytree(wd, dst, symlinks=True, ignore=shutil.ignore_patterns("locks"))
    return dst


@pytest.fixture(scope="session")
def mirror(tmp_path_factory):
    """Ten long documents (the tiny study needs ~200,000 characters for its tokenizer)."""
    docs = [
        (_prose(i, n_paragraphs=25), {"name": f"doc{i:02d}", "quality": "HIGH"}) for i in range(10)
    ]
    return write_speakleash_mirror(tmp_path_factory.mktemp("mirror"), docs)


@pytest.fixture(scope="session")
def smoke(mirror, tmp_path_factory):
    """The whole tiny study, run once: (working directory, seconds it took). Tests read it or
    dry-run it; one that edits a file restores it."""
    wd = workdir(
        tmp_path_factory.mktemp("smoke"),
        {"source": "mirror", "mirror": str(mirror.path), "dataset": DATASET},
    )
    t0 = time.time()
    snakemake(wd)
    return wd, time.time() - t0
