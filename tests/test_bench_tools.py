"""The GPU benchmark scripts build valid studies (they run only on a GPU machine, where a config
error would cost device time: tools/bench_techniques.py once did, after protocol v2)."""

import argparse
import importlib.util
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
