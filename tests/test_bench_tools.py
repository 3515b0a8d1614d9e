"""The GPU benchmark scripts build valid studies (they run only on a GPU machine, where a config
error would cost device time: tools/bench_techniques.py once did, after protocol v2)."""

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_techniques_study_is_valid_and_times_a_fixed_number_of_steps():
    bench = load("bench_techniques")
    cfg = bench.study(argparse.Namespace(warmup=2, steps=7))
    assert cfg["measure"]["warmup_steps"] == 2
    assert cfg["measure"]["min_timed_steps"] == cfg["measure"]["max_timed_steps"] == 7
    assert list(cfg["techniques"]) == list(bench.TECHNIQUES)
    assert cfg["techniques"]["flash_gradcp_chunked"]["loss"] == "chunked"


def test_every_bench_technique_validates_alone():
    bench = load("bench_techniques")
    args = argparse.Namespace(warmup=2, steps=7, cap=2048)
    for name in bench.TECHNIQUES:
        cfg = bench.study(args, name)
        assert list(cfg["techniques"]) == [name] and cfg["search"]["max_batch"] == 2048
    assert bench.study(args, "flash_in_backward")["train"]["grad_clip"] == 0.0
    assert bench.study(args, "flash")["train"]["grad_clip"] == 1.0


def test_bench_goals_count_only_exact_techniques():
    bench = load("bench_techniques")
    cfg = bench.study(argparse.Namespace(warmup=2, steps=7))

    def cell(name, batch, tflops):
        return {"status": "ok", "spec": cfg["techniques"][name], "batch_size": batch}, tflops

    results = {}
    for name, batch, tflops in [
        ("flash_gradcp_chunked", 1500, 250.0),
        ("adamw8bit", 3000, 200.0),  # larger, but a different function
        ("fp8_compiled", 64, 500.0),  # faster, but a different function
        ("compiled_chunked", 64, 380.0),
        ("flash_accum4", 400, 250.0),  # 1,600 per step, but 400 at once
    ]:
        r, t = cell(name, batch, tflops)
        results[name, "max"] = {**r, "model_tflops": t, "seq_len": 1024}
    lines = bench.goals(results)
    assert "flash_gradcp_chunked trains 1,500 sequences of 1,024 tokens at once" in lines[
        0
    ] and lines[0].endswith("ok")
    assert "compiled_chunked at batch 64: 380" in lines[1] and lines[1].endswith("BELOW")


def _benchmarks(root: Path, times: dict[str, float]) -> None:
    for job, s in times.items():
        f = root / "results" / "benchmarks" / f"{job}.tsv"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"s\th:m:s\n{s}\t0:00:00\n")


def test_study_critical_path_follows_the_workflow_dependencies(tmp_path, capsys):
    """Cells wait for their own and the baseline's search, `max` for `same`; quality runs only for
    the data. By hand: on 2 GPUs quality 0-12 and search/a 0-10, search/b 10-15, cell/a/same
    15-18, cell/a/max 18-22; the chain search/a, same, max is 17 s."""
    cp = load("study_critical_path")
    times = {"corpus": 1.0, "render": 2.0, "search/a": 10.0, "search/b": 5.0,
             "cell/a/same": 3.0, "cell/a/max": 4.0, "quality/x/1": 12.0}  # fmt: skip
    assert cp.critical_path(times, "b") == 17.0
    assert cp.schedule(times, "b", 1) == 34.0
    assert cp.schedule(times, "b", 2) == 22.0
    assert cp.schedule(times, "b", 8) == 17.0  # as many GPUs as jobs: the longest chain
    _benchmarks(tmp_path, times)
    sys.argv = ["study_critical_path", str(tmp_path), "--baseline", "b", "--gpus", "1", "2"]
    cp.main()
    out = capsys.readouterr().out
    assert "critical path of the training jobs 17 s" in out
    assert "| 2 | 25 | 1.48x |" in out  # 3 s of data and paper rules around 22 s


def _result(root: Path, job: str, gpu: str, start: int, end: int, **extra) -> None:
    f = root / "results" / f"{job}.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    stamp = "2026-11-23T10:00:{:02d}.000Z".format
    prov = {"gpu_uuid": gpu, "started": stamp(start), "finished": stamp(end)}
    f.write_text(json.dumps({"provenance": prov, **extra}))


def test_scaleout_report_finds_overlaps_and_refuses_sharing(tmp_path, capsys):
    report = load("scaleout_report")
    one, two = tmp_path / "one", tmp_path / "two"
    cell = {"batch_size": 8, "step_time_ms": {"median": 100.0}}
    for run in (one, two):
        _result(run, "search/a", "u0", 0, 5, max_batch=8)
        _benchmarks(run, {"search/a": 5.0})
    _result(one, "cells/a/same", "u0", 6, 9, **cell)
    _result(two, "cells/a/same", "u1", 2, 4, **(cell | {"step_time_ms": {"median": 101.0}}))
    _result(two, "quality/x/1", "u1", 5, 8)
    sys.argv = ["scaleout_report", str(one), str(two)]
    assert report.main() == 0
    out = capsys.readouterr().out
    assert "2 GPUs used: u0, u1." in out and "1 pairs of jobs ran at the same time" in out
    assert "| a/same (batch 8) | 100.0 | 101.0 | 1.010 |" in out and "| a | 8 | 8 |" in out
    _result(two, "quality/x/2", "u1", 7, 9)  # overlaps quality/x/1 on u1
    assert report.main() == 1
    assert (
        "OVERLAP ON ONE GPU: quality/x/1.json and quality/x/2.json (1.0 s)"
        in capsys.readouterr().out
    )


def test_committed_scaleout_check_shows_two_gpus_at_once_and_same_timings(capsys):
    """studies/h200x2-scaleout (docs/scale-out.md): two H200 UUIDs, jobs at once on both, none
    overlapping on one, each cell's median step time within 2% of the one-GPU run's."""
    runs = ROOT / "studies" / "h200x2-scaleout"
    sys.argv = ["scaleout_report", str(runs / "gpus1"), str(runs / "gpus2")]
    assert load("scaleout_report").main() == 0
    out = capsys.readouterr().out
    assert "2 GPUs used" in out and "10 pairs of jobs ran at the same time" in out
    ratios = [float(line.split("|")[-2]) for line in out.splitlines() if "(batch " in line]
    assert len(ratios) == 4 and all(0.98 <= r <= 1.02 for r in ratios), ratios


def test_parallel_study_table_is_the_readmes_and_sharding_divides_as_zero_says():
    """studies/h200x2-parallel (issue 17): the table in docs/scale-out.md is what tools/parallel_report.py
    prints from the committed results, and each GPU's weights, gradients and optimizer state are
    the one-GPU technique's divided as the ZeRO stage says."""
    out = subprocess.run(
        [sys.executable, "tools/parallel_report.py", "studies/h200x2-parallel/results"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    readme = (ROOT / "docs" / "scale-out.md").read_text()
    assert len(rows) == 6 and all(row in readme for row in rows[1:])
    for row in rows[2:]:  # measured (predicted) within 1%
        got, want = row.split(" | ")[3].removesuffix(")").split(" (")
        for g, w in zip(got.split(" / "), want.split(" / ")):
            assert abs(float(g.replace(",", "")) / float(w.replace(",", "")) - 1) < 0.01, row
