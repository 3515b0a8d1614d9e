"""Protocol v2: the adaptive stopping rule and the allocator counters (issue 11); the function
grouping and the exactness check: test_exactness.py."""

import random
import statistics

import pytest
from test_exactness import TECHNIQUES, _filled

from memopt.runtime.measure import ci95_half_width, counter_delta, enough_timed_steps, summarize

MEASURE = {"target_rel_ci": 0.01, "min_timed_steps": 10, "max_timed_steps": 100}


def steps_needed(series, cfg=MEASURE) -> int:
    """Feed a step-time series to the rule one step at a time, as a cell does."""
    for n in range(1, len(series) + 1):
        if enough_timed_steps(series[:n], cfg):
            return n
    return len(series)


def test_flat_series_stops_at_the_minimum():
    assert steps_needed([100.0] * 200) == 10
    assert steps_needed([100.0 + 0.01 * (i % 3) for i in range(200)]) == 10


def test_noisy_series_gets_more_steps_and_meets_the_target():
    rng = random.Random(0)
    noisy = [100.0 + rng.gauss(0, 3) for _ in range(200)]  # 3% sd: ~35 steps for a 1% interval
    n = steps_needed(noisy)
    assert 20 < n < 100
    assert ci95_half_width(noisy[:n]) <= 0.01 * sum(noisy[:n]) / n
    assert ci95_half_width(noisy[: n - 1]) > 0.01 * sum(noisy[: n - 1]) / (n - 1)


def test_very_noisy_series_stops_at_the_maximum():
    rng = random.Random(1)
    assert steps_needed([100.0 + rng.gauss(0, 50) for _ in range(300)]) == 100


def test_time_limit_stops_a_noisy_series_of_long_steps():
    """max_timed_s: steps of ~3 s with a 5% sd would need ~100 steps for a 1% interval; 20 s of
    timed steps stop them after the minimum, 60 s at about 20 steps; short steps are not affected."""
    rng = random.Random(2)
    slow = [3000.0 + rng.gauss(0, 150) for _ in range(300)]
    assert steps_needed(slow) == 100  # no limit in MEASURE: the step cap
    assert steps_needed(slow, {**MEASURE, "max_timed_s": None}) == 100
    assert steps_needed(slow, {**MEASURE, "max_timed_s": 20}) == 10  # the minimum comes first
    n = steps_needed(slow, {**MEASURE, "max_timed_s": 60})
    assert sum(slow[: n - 1]) < 60_000 <= sum(slow[:n])
    rng = random.Random(0)
    noisy = [100.0 + rng.gauss(0, 3) for _ in range(200)]  # ~35 steps of 0.1 s
    assert steps_needed(noisy, {**MEASURE, "max_timed_s": 30}) == steps_needed(noisy)


def test_paper_counts_cells_stopped_at_the_time_limit():
    from memopt.report.results import stopped_at_time_limit

    cfg = {**MEASURE, "max_timed_s": 30}
    cells = [
        {"timed_s": 34.4, "timed_steps": 10, "step_time_ms_rel_ci95": 0.03},  # the limit stopped it
        {"timed_s": 31.0, "timed_steps": 12, "step_time_ms_rel_ci95": 0.009},  # the interval did
        {"timed_s": 80.0, "timed_steps": 100, "step_time_ms_rel_ci95": 0.02},  # the step cap did
        {"timed_s": 3.0, "timed_steps": 10, "step_time_ms_rel_ci95": 0.002},
        # a `max` entry that is its `same` run: the same run, not counted twice
        {"timed_s": 34.4, "timed_steps": 10, "step_time_ms_rel_ci95": 0.03, "measured_as": "same"},
    ]
    assert stopped_at_time_limit(cells, cfg) == [cells[0]]
    assert stopped_at_time_limit(cells, {**MEASURE, "max_timed_s": None}) == []


def test_summary_records_the_interval():
    values = [10.0, 12.0, 11.0, 13.0, 12.5, 11.5, 10.5, 12.0, 11.0, 11.5]
    s = summarize(values)
    sd = statistics.stdev(values)
    assert s["ci95_half"] == pytest.approx(2.262157 * sd / 10**0.5, rel=1e-3)  # t(9) = 2.262
    assert s["rel_ci95"] == pytest.approx(s["ci95_half"] / statistics.fmean(values))


def test_allocator_counters_are_differenced():
    before = {"alloc_retries": 1, "ooms": 0, "device_allocs": 10, "device_frees": None}
    after = {"alloc_retries": 4, "ooms": 0, "device_allocs": 12, "device_frees": None}
    assert counter_delta(before, after) == {
        "alloc_retries": 3,
        "ooms": 0,
        "device_allocs": 2,
        "device_frees": None,
    }
    assert counter_delta(None, None) is None


def test_cell_records_adaptive_timing_and_allocator_events(tiny_study):
    from memopt.jobs.cell import run_cell

    cfg, data = tiny_study
    cfg = {**cfg, "techniques": {"plain": _filled(TECHNIQUES["baseline"])}}
    cfg["measure"] = {
        **cfg["measure"],
        "min_timed_steps": 3,
        "max_timed_steps": 7,
        "target_rel_ci": 1e-9,
    }
    cell = run_cell(cfg, "plain", "4", 4, data, "cpu")
    assert cell["status"] == "ok" and cell["function"] == "fp32"
    assert cell["timed_steps"] == 7  # an unreachable target: stops at the maximum
    assert cell["steps"] == cfg["measure"]["warmup_steps"] + 7
    assert cell["step_time_ms"]["rel_ci95"] > 0 and cell["timed_s"] > 0
    assert "allocator_events" in cell and cell["allocator_events"] is None  # a CPU has none


def test_a_max_cell_at_the_same_batch_reuses_the_same_cell(tiny_study, tmp_path):
    import json

    from memopt.jobs.pipeline import cell_file

    cfg, _ = tiny_study
    searches = tmp_path / "search"
    searches.mkdir()
    (searches / "baseline.json").write_text(json.dumps({"max_batch": 4}))
    same = cell_file(cfg, "baseline", "same", tmp_path, searches, tmp_path / "same.json")
    kept = cell_file(cfg, "baseline", "max", tmp_path, searches, tmp_path / "max.json",
                     same_cell=tmp_path / "same.json")  # fmt: skip
    assert kept == {**same, "batch_entry": "max", "measured_as": "same"}
    # Another batch: measured in a run of its own.
    (searches / "baseline.json").write_text(json.dumps({"max_batch": 3}))
    cfg = {**cfg, "search": {**cfg["search"]}}
    own = cell_file(cfg, "baseline", "max", tmp_path, searches, tmp_path / "max.json",
                    same_cell=tmp_path / "same.json")  # fmt: skip
    assert own["batch_size"] == 3 and "measured_as" not in own


def test_median_interval_is_the_order_statistics_interval():
    from memopt.report.steady import median_interval

    assert median_interval([5.0] * 5) == (None, None)  # too few steps for 95%
    times = [float(v) for v in range(100, 0, -1)]  # order must not matter
    assert median_interval(times) == (40.0, 61.0)  # the textbook ranks for n = 100
    assert median_interval([float(v) for v in range(1, 11)]) == (1.0, 10.0)


def test_instability_names_a_warming_start_and_a_wide_spread():
    from memopt.report.steady import instability

    steady = [100.0 + (i % 3) * 0.5 for i in range(60)]
    assert instability(steady) is None
    warming = [135.0] * 6 + steady[6:]  # the first tenth ~35% slower than the median 100.5
    assert instability(warming) == "first 6 timed steps +34% off the rest"
    modes = [100.0, 130.0] * 30  # two modes, no warm-up
    assert instability(modes) == "10th-90th percentile spread 26% of the median"
    assert instability(steady[:7]) is None  # too few to judge
