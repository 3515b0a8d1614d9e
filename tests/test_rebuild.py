"""Issue 31: the pipeline keeps its promises on the smoke study. What changed is rebuilt and nothing
else (every module's edit, an equivalent config); what an interruption or a user lost is rebuilt by
a plain rerun; a job does not outlive the Snakemake that started it; bad inputs stop a job by
name. Each test breaks its own copy of the finished study."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from smoke_workflow import (
    PDF,
    copy_study,
    planned,
    results,
    run_until_killed,
    snakemake,
    start_study,
    unlock,
    wait_for_job,
)

from memopt.closure import closure
from memopt.processes import study_processes

pytestmark = pytest.mark.slow

PAPER_JOBS = {"aggregate": 1, "figures": 1, "render": 1, **PDF, "all": 1}


def importing_rules(wd: Path, module: Path) -> list[str]:
    """The rules whose script's import closure holds `module` (a rule is named as its script)."""
    package = wd / "src" / "memopt"
    scripts = sorted((wd / "workflow" / "scripts").glob("*.py"))
    return [s.stem for s in scripts if module.resolve() in closure([s], package.resolve())]


def test_every_module_edit_reruns_exactly_the_rules_that_import_it(smoke, tmp_path):
    """Finding 1: for each module of src/memopt, editing it plans what forcing the rules whose
    closure holds it plans (those rules and what depends on them), and nothing when none does."""
    copies = [copy_study(smoke[0], tmp_path / f"copy{i}") for i in range(2)]
    modules = sorted(p.name for p in (copies[0] / "src" / "memopt").glob("*.py"))

    def check(wd: Path, names: list[str]) -> list[str]:
        forced: dict[tuple, dict] = {(): {}}
        wrong = []
        for name in names:
            module = wd / "src" / "memopt" / name
            rules = tuple(importing_rules(wd, module))
            if rules not in forced:
                forced[rules] = planned(wd, "--forcerun", *rules)
            saved = module.read_bytes()
            module.write_bytes(saved + b"\n# edited\n")
            try:
                got = planned(wd)
            finally:
                module.write_bytes(saved)
            if got != forced[rules]:
                wrong.append(f"{name}: planned {got}, expected {forced[rules]} (rules {rules})")
        return wrong

    with ThreadPoolExecutor(2) as pool:  # two copies: one dry run per core
        wrong = sum(pool.map(check, copies, [modules[0::2], modules[1::2]]), [])
    assert not wrong, "\n".join(wrong)
    assert planned(copies[0]) == {}  # restored: nothing to do


def reordered(value, keep_order: tuple = ()):
    """Every mapping with its keys in reverse order, except the mappings at the `keep_order`
    keys (their values are still reordered)."""
    if isinstance(value, dict):
        keys = list(value) if keep_order and keep_order[0] == "*" else list(reversed(value))
        return {k: reordered(value[k], keep_order[1:] if keep_order else ()) for k in keys}
    return value


def test_an_equivalent_config_reruns_nothing(smoke, tmp_path):
    """Finding 2: the same study with keys in another order, or 1 written for 1.0, is the same
    study; listing the techniques in another order changes only the tables' order."""
    wd = copy_study(smoke[0], tmp_path / "study")
    study = yaml.safe_load((wd / "study.yaml").read_text())
    same = reordered({k: v for k, v in study.items() if k != "techniques"})
    same["techniques"] = {t: reordered(spec) for t, spec in study["techniques"].items()}
    same["train"]["grad_clip"] = 1  # the default, 1.0
    (wd / "study.yaml").write_text(yaml.safe_dump(same, sort_keys=False))
    assert list(same["model"]) != list(study["model"])
    assert planned(wd) == {}
    names = list(study["techniques"])
    swapped = dict(
        same, techniques={t: same["techniques"][t] for t in [names[1], names[0], *names[2:]]}
    )
    (wd / "study.yaml").write_text(yaml.safe_dump(swapped, sort_keys=False))
    assert planned(wd) == PAPER_JOBS


FIGURES_RUNNING = ("figures", "logs/figures.log", "paper/figures/memory.png", "")
QUALITY = "results/quality/bf16/1234.json"
QUALITY_TRAINING = ("quality", "logs/quality/bf16/1234.log", QUALITY, "[memopt worker")
SEARCH = "results/search/flash.json"
SEARCH_TRAINING = ("search", "logs/search/flash.log", SEARCH, "[memopt worker")


def test_a_plain_rerun_rebuilds_what_an_interruption_or_a_user_lost(smoke, tmp_path):
    """Finding 3: forced jobs killed mid-run (their old outputs already deleted by Snakemake),
    then results deleted by hand: after `memopt unlock`, the plain command rebuilds every file,
    byte for byte where the job is deterministic."""
    wd = copy_study(smoke[0], tmp_path / "study")
    before = {p: (wd / p).read_bytes() for p in results(wd)}
    run_until_killed(wd, [FIGURES_RUNNING], "--forcerun", "paper/figures/memory.png")
    unlock(wd)
    run_until_killed(wd, [QUALITY_TRAINING], "--forcerun", QUALITY)
    unlock(wd)
    lost = set(before) - results(wd)
    assert QUALITY in lost and "paper/figures/memory.png" in lost
    assert planned(wd)["quality"] == 1 and planned(wd)["figures"] == 1
    snakemake(wd)
    assert results(wd) == set(before)
    changed = {p for p in before if (wd / p).read_bytes() != before[p]}
    # Timings differ between two runs of a job: the rerun quality run's, its row in quality.csv,
    # the benchmark files of the jobs that ran, the paper's stage table.
    timed = {QUALITY, "results/quality.csv"} | {p for p in changed if "/benchmarks/" in f"/{p}"}
    assert changed - timed <= {"paper/paper.md", "paper/paper.tex", "paper/paper.pdf"}, changed
    assert not any(p.startswith("paper/figures/") for p in changed)  # figures: byte for byte
    rerun, old = json.loads((wd / QUALITY).read_text()), json.loads(before[QUALITY])
    assert (rerun["loss_curve"], rerun["val_loss"]) == (old["loss_curve"], old["val_loss"])
    # A result damaged, then deleted by hand; the summary deleted: the jobs that make them rerun
    # (and the paper's after them), nothing else.
    cell = wd / "results/cells/flash/max.json"
    cell.write_text(cell.read_text()[:100])
    cell.unlink()
    (wd / "results/summary.csv").unlink()
    assert planned(wd, "technique_flash") == {"cell": 1, "technique_flash": 1}
    assert planned(wd) == {"cell": 1, **PAPER_JOBS}
    snakemake(wd)
    assert results(wd) == set(before) and json.loads(cell.read_text())["status"] == "ok"


def processes_in(wd: Path) -> list[int]:
    """Every process (a warm worker too) whose working directory is wd."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == wd.resolve():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_snakemake_killed_alone_leaves_no_job_running(smoke, tmp_path):
    """Finding 4: kill -9 of the Snakemake process alone. Its job and the warm worker serving it
    stop within seconds, write nothing, and the next run meets the lock as the README says."""
    wd = copy_study(smoke[0], tmp_path / "study")
    _, out = run_until_killed(wd, [SEARCH_TRAINING], "--forcerun", SEARCH, group=False)
    deadline = time.monotonic() + 10
    while processes_in(wd) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_in(wd) == [] and study_processes(wd) == []
    assert not out.exists()
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0 and "cannot be locked" in proc.stdout + proc.stderr
    assert "incomplete" not in (proc.stdout + proc.stderr).lower()
    assert "removed the Snakemake lock" in unlock(wd)
    snakemake(wd)
    search = json.loads(out.read_text())
    assert search["max_batch"] == json.loads((smoke[0] / SEARCH).read_text())["max_batch"]
    assert planned(wd) == {}


def test_sigterm_lets_the_running_job_finish_then_stops(smoke, tmp_path):
    """What the README says of `kill PID`: Snakemake starts nothing new, lets the running job
    finish (its result is kept), exits with an error; the same command then does the rest."""
    wd = copy_study(smoke[0], tmp_path / "study")
    since = time.time() - 1
    proc = start_study(wd, "--forcerun", QUALITY)
    _, out = wait_for_job(proc, wd, since, [QUALITY_TRAINING])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(300) != 0
    said = (wd / "snakemake-run.log").read_text()
    assert "Will exit after finishing currently running jobs" in said
    assert "At least one job did not complete successfully" in said
    assert out.exists() and json.loads(out.read_text())["status"] == "ok"
    assert planned(wd) == PAPER_JOBS
    snakemake(wd)
    assert planned(wd) == {}


def test_damaged_data_files_stop_their_jobs_by_name(smoke, tmp_path):
    """Finding 7 through Snakemake: a token file truncated in place, a tokenizer model truncated;
    the jobs that read them stop with memopt's message, no traceback."""
    wd = copy_study(smoke[0], tmp_path / "study")
    train = wd / "data/tokens/train.bin"
    size = train.stat().st_size
    train.write_bytes(train.read_bytes()[:2000])
    proc = snakemake(wd, SEARCH, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        f"memopt: error: data/tokens/train.bin: holds 2,000 bytes (1,000 uint16 tokens), meta.json says {size // 2:,} tokens"
        in said
    )
    assert "snakemake --forcerun tokens" in said and "Traceback" not in said
    model = wd / "data/tokenizer/spm.model"
    model.write_bytes(model.read_bytes()[:1000])
    proc = snakemake(wd, "data/tokens/meta.json", check=False)
    said = proc.stdout + proc.stderr
    assert "memopt: error: data/tokenizer/spm.model: its SHA-256 differs" in said
    assert "Traceback" not in said
