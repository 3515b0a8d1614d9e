"""End to end through Snakemake: the smoke study, corpus to paper, on a fixture corpus served as a
mirror directory and over loopback HTTP (what a rerun rebuilds: test_reruns.py, test_rebuild.py)."""

from __future__ import annotations

import contextlib
import csv
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import DATASET
from smoke_workflow import ROOT, SNAKEMAKE, copy_study, snakemake, workdir

from memopt.report.paper_format import tex_engine

pytestmark = pytest.mark.slow


def check_outputs(wd: Path, techniques: list[str]) -> list[dict]:
    with open(wd / "results/summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["technique"], r["batch_entry"]) for r in rows] == [
        (t, b) for t in techniques for b in ("same", "max")
    ]
    base = {r["batch_entry"]: r for r in rows if r["technique"] == techniques[0]}
    # One run serves both entries of the baseline.
    assert base["max"] == {**base["same"], "batch_entry": "max", "measured_as": "same"}
    for r in rows:
        assert r["status"] == "ok", r
        assert float(r["peak_allocated_mib"]) > 0 and float(r["tokens_per_s"]) > 0
        assert 1 <= int(r["timed_steps"]) and float(r["step_time_ms_rel_ci95"]) >= 0
    with open(wd / "results/quality.csv") as f:
        quality = list(csv.DictReader(f))
    assert quality and {q["status"] for q in quality} == {"ok"}
    assert all(1 < float(q["val_ppl"]) < 1000 for q in quality)
    paper = (wd / "paper/paper.md").read_text()
    tex = (wd / "paper/paper.tex").read_text()
    assert "\\begin{document}" in tex and "\\end{document}" in tex
    for r in rows:
        assert r["technique"].replace("_", "\\_") in tex and r["technique"] in paper
    if tex_engine():
        assert (wd / "paper/paper.pdf").stat().st_size > 10_000
    for name in ("memory", "throughput", "loss"):
        assert (wd / f"paper/figures/{name}.png").stat().st_size > 1000
        assert (wd / f"paper/figures/{name}.pdf").stat().st_size > 1000
    return rows


def test_smoke_study_from_a_mirror_directory(smoke):
    wd, seconds = smoke
    techniques = list(yaml.safe_load((wd / "study.yaml").read_text())["techniques"])
    rows = check_outputs(wd, techniques)
    same = {r["technique"]: int(r["batch_size"]) for r in rows if r["batch_entry"] == "same"}
    assert len(set(same.values())) == 1  # `same` is the baseline's maximum for every technique
    assert seconds < 600


def test_the_smoke_searches_start_from_the_plan(smoke):
    """On the CPU the search's first trial is memopt plan's maximum for the tracked tensors
    (memopt.plan.memory, device cpu): off by at most one sequence for every technique it
    models, so each search proves its maximum in at most 4 trials; `lean` (loss_chunk 16, no
    measured point) searches from batch 1. `memopt plan --cpu` prints the same maxima."""
    wd = smoke[0]
    searches = {p.stem: json.loads(p.read_text()) for p in (wd / "results/search").glob("*.json")}
    assert searches["lean"]["plan_batch"] is None
    for name, s in searches.items():
        if name != "lean":
            assert abs(s["plan_error"]) <= 1 and s["n_trials"] <= 4, (name, s["plan_error"])
    proc = subprocess.run([sys.executable, "-m", "memopt.run.cli", "plan", "--config", "study.yaml",
                           "--cpu"], cwd=wd, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for name, s in searches.items():
        row = next(r for r in proc.stdout.splitlines() if r.startswith(f"| {name} |"))
        assert (name == "lean") == ("not predicted" in row)
        assert name == "lean" or f"| {s['plan_batch']:,} |" in row


def test_bad_config_stops_before_the_dag(smoke):
    cases = [
        ("quality={'seeds': -5}", "quality.seeds: -5 is not allowed; allowed: a number >= 1"),
        # Issue 31: found only later (a crash in the optimizer), or never (merged into nothing).
        ("train={'lr': .nan}", "train.lr: nan is not allowed; allowed: a finite number"),
        ("model={'n_layers': 2.0}", "model.n_layers: 2.0 is not allowed; allowed: an integer"),
        ("techniques={}", "--config techniques={}: Snakemake merges --config into the config"),
    ]
    for override, message in cases:
        proc = snakemake(smoke[0], "-n", "--config", override, check=False)
        assert proc.returncode != 0, override
        assert message in proc.stderr + proc.stdout, override
        assert "Traceback" not in proc.stderr + proc.stdout, override


def test_broken_corpus_stops_the_corpus_rule_with_one_message(mirror, tmp_path):
    """Issue 14: a dataset file that is not zstd (a server's error page saved under its name) stops
    the `corpus` rule with memopt's message naming the file and the place, no traceback, and
    nothing left under data/. (tests/test_corpus.py covers every way a file can be broken.)"""
    broken = tmp_path / "mirror"
    shutil.copytree(mirror.path, broken)
    page = b"<html><body>502 Bad Gateway</body></html>\n" * 30
    (broken / f"{DATASET}.jsonl.zst").write_bytes(page)
    manifest = broken / f"{DATASET}.manifest"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"file_size": len(page)}))
    wd = workdir(tmp_path / "wd", {"source": "mirror", "mirror": str(broken), "dataset": DATASET})
    proc = snakemake(wd, "data/corpus/stats.json", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{DATASET}.jsonl.zst from {broken} is broken at its start: not zstd" in out, out[-3000:]
    assert "Traceback" not in out
    assert [p for p in (wd / "data").rglob("*") if p.is_file()] == []


@contextlib.contextmanager
def http_server(directory: Path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def test_smoke_study_from_a_mirror_over_http(mirror, tmp_path):
    with http_server(mirror.path) as url:
        wd = workdir(
            tmp_path,
            {"source": "mirror", "mirror": url, "dataset": DATASET},
            techniques=["baseline", "flash"],
        )
        snakemake(wd)
    check_outputs(wd, ["baseline", "flash"])
    assert url in (wd / "data/corpus/stats.json").read_text()


def test_default_study_dry_run_and_cpu_refusal(mirror, tmp_path):
    wd = workdir(tmp_path, {})
    default = SNAKEMAKE + ["--cores", "2", "--resources", "gpu=1"]
    proc = subprocess.run(default + ["-n"], cwd=wd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # Every technique x (same, max): 2 cell jobs each (a `max` one reuses its `same` run at one
    # batch), one search each.
    n = len(yaml.safe_load((ROOT / "config.yaml").read_text())["techniques"])
    for rule, jobs in (("cell", 2 * n), ("search", n)):
        assert re.search(rf"^{rule}\s+{jobs}$", proc.stdout, re.M), (rule, proc.stdout[-2000:])
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU is present: the CPU refusal cannot be shown here")
    corpus = f"corpus={{'source': 'mirror', 'mirror': '{mirror.path}', 'dataset': '{DATASET}'}}"
    target = SNAKEMAKE + ["results/search/baseline.json"] + default[len(SNAKEMAKE) :]
    proc = subprocess.run(
        target + ["--config", corpus, "tokenizer={'vocab_size': 400}"],
        cwd=wd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    # Before any work (no corpus built), once, with the command in use and the smoke study's
    assert out.count("no CUDA GPU") == 1 and "snakemake --profile profiles/smoke" in out
    assert "command: snakemake results/search/baseline.json --cores 2 --resources gpu=1" in out
    assert not (wd / "data").exists()
    assert not any((wd / ".snakemake/locks").glob("*"))


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for part in ("data", "results", "paper", "logs", ".memopt-study")
        for p in ([folder / part] if (folder / part).is_file() else (folder / part).rglob("*"))
        if p.is_file()
        and "templates" not in p.parts
        and p.name not in ("reference.yaml", "literature.yaml")
    }


def test_a_study_never_touches_another_studys_outputs(smoke, mirror, tmp_path):
    """The folder holds the (tiny) smoke study's finished outputs. The default study refuses to
    run there; another study run through its profile writes only to its own folder."""
    wd = copy_study(smoke[0], tmp_path / "study")
    before = _files(wd)
    assert before[".memopt-study"] == b"smoke\n" and "results/summary.csv" in before
    corpus = f"corpus={{'source': 'mirror', 'mirror': '{mirror.path}', 'dataset': '{DATASET}'}}"
    default = SNAKEMAKE + ["paper", "--cores", "1", "--resources", "gpu=1", "--config", corpus]
    proc = subprocess.run(default, cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "holds the outputs of study 'smoke'" in proc.stderr
    # Another study, one name: its profile names its config and its folder.
    other = yaml.safe_load((wd / "study.yaml").read_text()) | {"study": "other"}
    (wd / "other.yaml").write_text(yaml.safe_dump(other))
    (wd / "profiles/other").mkdir()
    (wd / "profiles/other/config.yaml").write_text(
        "configfile: other.yaml\ndirectory: runs/other\ncores: 2\nresources:\n  gpu: 1\n"
    )
    line = SNAKEMAKE + ["--profile", "profiles/other"]
    proc = subprocess.run(line + ["data/tokens/meta.json"], cwd=wd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (wd / "runs/other/data/tokens/meta.json").is_file()
    assert (wd / "runs/other/.memopt-study").read_text() == "other\n"
    assert _files(wd) == before  # byte for byte, nothing added or removed
    again = subprocess.run(line + ["data/tokens/meta.json"], cwd=wd, capture_output=True, text=True)
    assert "Nothing to be done" in again.stdout + again.stderr


def memopt(wd: Path, *args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "memopt.run.cli", *args]
    return subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=600)


def test_cli_reaches_the_same_functions_as_the_rules(smoke):
    wd = smoke[0]
    help_text = memopt(wd, "--help").stdout
    for sub in ("validate", "search", "cell", "paper"):
        assert sub in help_text
    # The search is deterministic on a CPU: the CLI finds what the rule found.
    proc = memopt(wd, "search", "gradcp", "--config", "study.yaml", "--out", "cli/search.json")
    assert proc.returncode == 0, proc.stderr
    rule = json.loads((wd / "results/search/gradcp.json").read_text())
    cli = json.loads((wd / "cli/search.json").read_text())
    assert (
        cli["max_batch"] == rule["max_batch"]
        and cli["trials"][-1]["batch"] == rule["trials"][-1]["batch"]
    )
    proc = memopt(wd, "cell", "gradcp", "same", "--config", "study.yaml", "--out", "cli/cell.json")
    assert proc.returncode == 0, proc.stderr
    cell = json.loads((wd / "cli/cell.json").read_text())
    rule_curve = json.loads((wd / "results/cells/gradcp/same.json").read_text())["loss_curve"]
    # The same training, step by step; how many steps are timed depends on the timings' noise
    # (they stop once the confidence interval is narrow enough), which differs between runs.
    n = min(len(cell["loss_curve"]), len(rule_curve))
    measure = yaml.safe_load((wd / "study.yaml").read_text())["measure"]
    assert n >= measure["warmup_steps"] + measure["min_timed_steps"]  # 3 + 3 in the smoke study
    assert cell["loss_curve"][:n] == rule_curve[:n]
    bad = memopt(wd, "cell", "nope", "same", "--config", "study.yaml")
    assert (
        bad.returncode == 1 and "technique 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    )


def test_paper_from_a_results_folder_without_snakemake(smoke, tmp_path):
    wd = smoke[0]
    shutil.copytree(wd / "results", tmp_path / "results")
    shutil.copytree(wd / "data", tmp_path / "data", ignore=shutil.ignore_patterns("*.bin", ".*"))
    proc = memopt(
        wd,
        "paper",
        "--config",
        "study.yaml",
        "--results",
        str(tmp_path / "results"),
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "paper"),
        "--templates",
        str(wd / "paper/templates"),
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "paper/paper.md").read_text() == (wd / "paper/paper.md").read_text()
    assert (tmp_path / "paper/figures/memory.pdf").exists()


def test_html_report_carries_the_figures_and_the_summary(smoke):
    wd = smoke[0]
    snakemake(wd, "--report", "report.html")
    html = (wd / "report.html").read_text(errors="replace")
    for name in ("memory.png", "throughput.png", "loss.png", "summary.csv"):
        assert name in html


def test_jobs_on_several_gpus_lease_distinct_ones(mirror, tmp_path):
    """`--resources gpu=2` with two (fake) GPUs: every training job records the GPU it leased, and
    both are used. A job leases the first free GPU, so one on the second means another job held
    the first at that moment: two ran at once, on different GPUs."""
    wd = workdir(tmp_path, {"source": "mirror", "mirror": str(mirror.path), "dataset": DATASET})
    study = yaml.safe_load((wd / "study.yaml").read_text())
    study["device"] = "auto"  # a GPU study's setting: the CPU here (fake GPUs are only names)
    study["techniques"] = {k: study["techniques"][k] for k in list(study["techniques"])[:3]}
    (wd / "study.yaml").write_text(yaml.safe_dump(study))
    # Training jobs take 4 threads each: 8 cores let two run at once (on 2 real ones).
    cmd = SNAKEMAKE + ["results/summary.csv", "--cores", "8", "--resources", "gpu=2"]
    env = dict(
        os.environ,
        MEMOPT_FAKE_GPUS="g0,g1",
        MEMOPT_GPU_LOCK_DIR=str(tmp_path / "locks"),
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.run(
        cmd + ["--configfile", "study.yaml"],
        cwd=wd,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = [
        json.loads(p.read_text())
        for sub in ("search", "cells", "quality")
        for p in sorted((wd / "results" / sub).rglob("*.json"))
    ]
    own = [j["provenance"] for j in jobs if not j.get("measured_as")]
    leases = [p["gpu_lease"] for p in own]
    assert len(leases) >= 8 and set(leases) == {"g0", "g1"}, leases
    assert all(j["provenance"]["gpu_index"] == j["provenance"]["gpu_lease"] for j in jobs)
    # Each result records when its job got the GPU and when it finished: on one GPU the spans never
    # overlap; across the two, some do (a job on g1 means g0 was held at that moment).
    spans = [(p["gpu_lease"], _when(p["started"]), _when(p["finished"])) for p in own]
    assert all(a < b for _, a, b in spans), spans
    overlaps = [
        (g1, g2)
        for i, (g1, a1, b1) in enumerate(spans)
        for g2, a2, b2 in spans[i + 1 :]
        if min(b1, b2) > max(a1, a2)
    ]
    assert overlaps and all(g1 != g2 for g1, g2 in overlaps), (overlaps, spans)


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_the_smoke_paper_reads_right_on_a_cpu(smoke):
    """The paper of a real CPU run (issue 32): no GPU words, a title that does not contradict
    itself, no size or count printed as zero."""
    text = (smoke[0] / "paper/paper.md").read_text()
    title, body = text.split("\n", 1)
    # (a size prints as "0 MiB" only when it is exactly zero, e.g. the logits the chunked loss
    # keeps; the facts below were a few KiB rounded to zero)
    zeros = ("0 MiB per", "0 MiB for this", "0 MiB in FP32", "0.0 M", "0.000 GFLOP")
    for word in ("GPU", "CUDA", "cudaMalloc", "card", "× TF32", *zeros):
        assert word not in text, (word, [ln for ln in text.splitlines() if word in ln][:3])
    assert "We answer for a CPU (" in body and "parameter transformer on CPU (" in title
    # "X runs N× faster than FP32" only when the baseline is not within noise of X
    if "faster than FP32" in title:
        assert "`baseline`" not in title.split("faster than FP32")[1].split(":")[0]
