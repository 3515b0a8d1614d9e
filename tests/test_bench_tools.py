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
