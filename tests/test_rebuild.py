"""Issue 31: the pipeline keeps its promises on the smoke study. What changed is rebuilt and nothing
else (every module's edit, an equivalent config); what an interruption or a user lost is rebuilt by
a plain rerun; a job does not outlive the Snakemake that started it; bad inputs stop a job by
name. Each test breaks its own copy of the finished study."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
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

from memopt.run.closure import closure, module_file
from memopt.run.processes import study_processes

pytestmark = pytest.mark.slow

PAPER_JOBS = {"aggregate": 1, "figures": 1, "render": 1, **PDF, "all": 1}


def importing_rules(wd: Path, module: Path) -> list[str]:
    """The study's rules whose script's import closure holds `module` (a rule is named as its
    script; a map study's rules exist only in a map study)."""
    package = wd / "src" / "memopt"
    scripts = sorted((wd / "workflow" / "scripts").glob("*.py"))
    defined = study_rules(wd)
    return [s.stem for s in scripts
            if s.stem in defined and module.resolve() in closure([s], package.resolve())]  # fmt: skip


@functools.lru_cache(maxsize=4)
def study_rules(wd: Path) -> set[str]:
    """The rules the study's workflow defines (snakemake --list-rules)."""
    proc = snakemake(wd, "--list-rules")  # as the study runs (its config and folder)
    return {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}


def dry_runs(wd: Path, requests: list[dict]) -> list[dict[str, int]]:
    """Many dry runs in one process (tests/plan_runner.py): the jobs each would run, per rule."""
    path = wd / "plan-requests.json"
    path.write_text(json.dumps(requests))
    runner = Path(__file__).with_name("plan_runner.py")
    proc = subprocess.run(
        [sys.executable, str(runner), str(path)], cwd=wd, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_module_edit_reruns_exactly_the_rules_that_import_it(smoke, tmp_path):
    """Finding 1: for each module of src/memopt, editing it plans what forcing the rules whose
    closure holds it plans (those rules and what depends on them), and nothing when none does."""
    wd = copy_study(smoke[0], tmp_path / "study")
    modules = sorted(p.name for p in (wd / "src" / "memopt").glob("*.py"))
    rules = {m: tuple(importing_rules(wd, wd / "src" / "memopt" / m)) for m in modules}
    forced = sorted({r for r in rules.values() if r})
    requests = [{"args": ["--forcerun", *r]} for r in forced]
    requests += [{"args": [], "append": f"src/memopt/{m}"} for m in modules]
    plans = dry_runs(wd, requests)
    expected = dict(zip(forced, plans)) | {(): {}}
    wrong = [
        f"{m}: planned {got}, expected {expected[rules[m]]} (rules {rules[m]})"
        for m, got in zip(modules, plans[len(forced) :])
        if got != expected[rules[m]]
    ]
    assert not wrong, "\n".join(wrong)
    assert expected[rules["config.py"]]["cell"] > 0  # forcing plans something
    assert planned(wd) == {}  # every module restored: nothing to do


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
    since = time.time() - 1
    proc = start_study(wd, "--forcerun", SEARCH)
    try:
        _, out = wait_for_job(proc, wd, since, [SEARCH_TRAINING])
        jobs = [pid for pid, _ in study_processes(wd) if pid != proc.pid]
        assert jobs  # the search's script (its warm worker is not listed: it is no job)
        proc.kill()  # Snakemake alone: nothing here signals its jobs
        proc.wait()
        deadline = time.monotonic() + 10
        while processes_in(wd) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_in(wd) == [] and study_processes(wd) == []
        assert not out.exists()
    finally:
        if processes_in(wd):  # only when the test failed: the jobs are gone by now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0 and "cannot be locked" in proc.stdout + proc.stderr
    assert "incomplete" not in (proc.stdout + proc.stderr).lower()
    assert "removed the Snakemake lock" in unlock(wd)
    assert planned(wd)["search"] == 1
    snakemake(wd, SEARCH)  # resumes: the search the kill stopped runs again
    search = json.loads(out.read_text())
    assert search["max_batch"] == json.loads((smoke[0] / SEARCH).read_text())["max_batch"]


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
    assert planned(wd) == PAPER_JOBS  # the rest, and only the rest


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


TRACER = """
import atexit, json, os, sys


def _dump():
    names = sorted(m for m in sys.modules if m == "memopt" or m.startswith("memopt."))
    with open(os.path.join(os.environ["MEMOPT_TEST_TRACE"], f"{os.getpid()}.json"), "w") as f:
        json.dump({"argv": sys.argv, "modules": names}, f)


if os.environ.get("MEMOPT_TEST_TRACE"):
    atexit.register(_dump)
"""


def test_the_modules_real_jobs_load_are_in_their_rules_closure(smoke, tmp_path, monkeypatch):
    """Finding 1, checked against what runs rather than against memopt.run.closure itself: every
    Python process of a job (its script; the warm worker, which runs only training jobs) writes
    the memopt modules it loaded when it exits (a sitecustomize.py on PYTHONPATH), and each
    must be in the closure its rule lists as inputs."""
    wd = copy_study(smoke[0], tmp_path / "study")
    site, trace = tmp_path / "site", tmp_path / "trace"
    site.mkdir(), trace.mkdir()
    (site / "sitecustomize.py").write_text(TRACER)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("MEMOPT_TEST_TRACE", str(trace))
    # A search and a quality run, then what depends on them (cells, summary, figures, paper);
    # the worker idles out a second after its last job; then the data rules on their own.
    snakemake(wd, "--forcerun", SEARCH, QUALITY, "--config", "worker={'idle_s': 1}")
    for path in ("data/corpus", "data/tokenizer", "data/tokens"):
        shutil.rmtree(wd / path)
    snakemake(wd, "data/tokens/meta.json")
    time.sleep(3)
    package = (wd / "src" / "memopt").resolve()
    scripts = wd / "workflow" / "scripts"
    code = {s.stem: {p.resolve() for p in closure([s], package)} for s in scripts.glob("*.py")}
    training = code["search"] & code["cell"] & code["quality"]
    seen, outside = set(), []
    for record in map(json.loads, (p.read_text() for p in trace.glob("*.json"))):
        first = record["argv"][0]
        if "/.snakemake/scripts/" in first:
            rule = first.rsplit(".", 2)[-2]  # .snakemake/scripts/tmpXXXX.<rule>.py
            allowed = code[rule]
        elif first.endswith("memopt/run/worker.py"):
            rule, allowed = "worker", training
        else:
            continue  # Snakemake itself
        seen.add(rule)
        for name in record["modules"]:
            path = module_file(name, package)
            if path is not None and path.resolve() not in allowed:
                outside.append(f"{rule} loaded {name}, not in its closure")
    assert not outside, "\n".join(outside)
    expected = {"corpus", "tokenizer", "tokens", "search", "cell", "quality", "aggregate"}
    assert expected | {"figures", "render", "worker"} | ({"pdf"} if PDF else set()) <= seen, seen
