"""The papers' one noise rule (memopt.report.noise): a cell's noise, the pair's, the verdicts at
and around the boundary, unknown inputs, the Method's wording, and that the rule is no input of a
training job (changing it reruns none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memopt.report.noise import (
    RETRY_NOISE,
    cell_noise,
    noise_rule,
    pair_noise,
    retries,
    speed_verdict,
    within_noise,
)
from memopt.run.closure import code_inputs

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


def test_a_cells_noise_is_its_interval_plus_the_allowance_where_it_retried():
    summary_row = {"step_time_ms_rel_ci95": 0.01, "allocator_alloc_retries": 0}
    assert cell_noise(summary_row) == 0.01
    assert cell_noise({**summary_row, "allocator_alloc_retries": 3}) == pytest.approx(
        0.01 + RETRY_NOISE
    )
    map_row = {"rel_ci95": 0.02, "alloc_retries": 1.0}
    assert cell_noise(map_row) == pytest.approx(0.02 + RETRY_NOISE)
    assert cell_noise(map_row, retry=0.03) == pytest.approx(0.05)  # a sensitivity check's
    cell_json = {"step_time_ms": {"rel_ci95": 0.004}, "allocator_events": {"alloc_retries": 2}}
    assert cell_noise(cell_json) == pytest.approx(0.004 + RETRY_NOISE)


def test_unknown_intervals_and_retries_count_as_none():
    # NaN (a pandas row of a cell that was not timed), None, and a later key that knows it
    assert cell_noise({"rel_ci95": NAN, "alloc_retries": NAN}) == 0.0
    assert cell_noise({"step_time_ms_rel_ci95": None, "rel_ci95": 0.02}) == 0.02
    assert retries({"alloc_retries": NAN, "allocator_alloc_retries": 4}) == 4
    assert retries({"allocator_events": NAN}) == 0 and retries({}) == 0


def test_within_noise_at_and_past_the_boundary():
    a = {"tokens_per_s": 100.0, "step_time_ms_rel_ci95": 0.05}
    assert within_noise(a, {"tokens_per_s": 90.0, "step_time_ms_rel_ci95": 0.05})  # 10% of 100
    assert not within_noise(a, {"tokens_per_s": 89.9, "step_time_ms_rel_ci95": 0.05})
    # a retry widens it: 20% apart is within 0.05 + 0.01 + 0.14
    retried = {"tokens_per_s": 80.0, "step_time_ms_rel_ci95": 0.01, "allocator_alloc_retries": 2}
    assert within_noise(a, retried) and not within_noise(
        a, {**retried, "allocator_alloc_retries": 0}
    )
    assert pair_noise(a, retried) == pytest.approx(0.2)
    # no throughput: within noise of none but another such cell, and no division by zero
    zero = {"tokens_per_s": 0.0}
    assert not within_noise(a, zero) and within_noise(zero, zero)


def test_a_verdict_is_faster_slower_or_none():
    assert speed_verdict(1.2, 0.1) == "faster" and speed_verdict(1 / 1.2, 0.1) == "slower"
    assert speed_verdict(1.1, 0.1) is None  # 1 - 1/1.1 = 0.091: within
    assert speed_verdict(NAN, 0.0) is None and speed_verdict(0.0, 0.0) is None


def test_methods_words_for_a_gpu_and_for_a_cpu():
    gpu, cpu = noise_rule(), noise_rule(gpu=False)
    assert "plus 14% where cudaMalloc retried in its timed steps" in gpu["md"]
    assert (
        "plus 14\\% where cudaMalloc retried" in gpu["tex"] and "\\emph{within noise}" in gpu["tex"]
    )
    assert (
        "cudaMalloc" not in cpu["md"]
        and "95% intervals of their mean step times added" in cpu["md"]
    )


@pytest.mark.parametrize("script", ["cell", "search", "quality", "aggregate"])
def test_the_rule_is_no_input_of_a_job(script):
    """The rule is the papers': editing memopt/report/noise.py reruns no training job."""
    inputs = {p.name for p in code_inputs(ROOT / "workflow" / "scripts" / f"{script}.py")}
    assert "noise.py" not in inputs and "effects.py" not in inputs
    assert "results.py" in inputs or script != "aggregate"  # the check sees the report modules
