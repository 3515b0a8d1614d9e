"""Aggregation of cell JSONs into summary.csv, and the atomic JSON helpers."""

import json
import math

import pandas as pd
import pytest
from synthetic_study import QUALITY_LOSS, SEEDS, TECHNIQUES, make_cell, write_study

from memopt.errors import MemoptError
from memopt.report.results import aggregate, read_json, write_json

# ---------------------------------------------------------------- tests

BRIEF_COLUMNS = [
    "technique",
    "batch_entry",
    "batch_size",
    "status",
    "precision",
    "attention",
    "window",
    "checkpointing",
    "compile",
    "kernel",
    "device",
    "device_name",
    "steps",
    "timed_steps",
    "seq_len",
    "tokens_per_step",
    "step_time_ms_mean",
    "step_time_ms_median",
    "step_time_ms_std",
    "step_time_ms_p10",
    "step_time_ms_p90",
    "tokens_per_s",
    "wall_s",
    "peak_allocated_mib",
    "peak_reserved_mib",
    "function",
    "step_time_ms_ci95_half",
    "step_time_ms_rel_ci95",
    "timed_s",
    "allocator_alloc_retries",
    "allocator_ooms",
]


def test_aggregate_rows_columns_values(tmp_path):
    study = write_study(tmp_path)
    frame = aggregate(study["cells"], study["summary"])
    assert set(BRIEF_COLUMNS) <= set(frame.columns)
    order = [(t, e) for t in TECHNIQUES for e in ("same", "max")]
    assert list(zip(frame["technique"], frame["batch_entry"])) == order

    on_disk = pd.read_csv(study["summary"], dtype={"batch_entry": str})
    assert list(zip(on_disk["technique"], on_disk["batch_entry"])) == order
    for (technique, entry), row in zip(order, on_disk.to_dict(orient="records")):
        cell = json.loads((tmp_path / f"results/cells/{technique}/{entry}.json").read_text())
        assert row["batch_size"] == cell["batch_size"]
        assert row["status"] == cell["status"]
        assert row["attention"] == cell["spec"]["attention"]
        if cell["status"] == "ok":
            assert row["step_time_ms_std"] == pytest.approx(cell["step_time_ms"]["std"], rel=1e-12)
            assert row["peak_allocated_mib"] == pytest.approx(cell["peak_allocated_mib"], rel=1e-12)
            assert row["step_time_ms_ci95_half"] == pytest.approx(cell["step_time_ms"]["ci95_half"])
            assert row["timed_s"] == pytest.approx(cell["timed_s"], rel=1e-12)
            assert row["allocator_alloc_retries"] == cell["allocator_events"]["alloc_retries"]
            assert row["function"] == cell["function"]
        else:  # oom: no numbers, never zeros, and the message is kept
            assert math.isnan(row["peak_allocated_mib"]) and math.isnan(row["tokens_per_s"])
            assert "out of memory" in row["error"]
    assert on_disk.loc[on_disk["technique"] == "local128", "window"].tolist() == [128, 128]
    assert str(frame["batch_size"].dtype) == "Int64"  # 64, not 64.0, in the CSV
    raw = pd.read_csv(study["summary"], dtype=str)
    assert raw["batch_size"].tolist() == ["8", "8", "8", "64", "8", "24"]


@pytest.mark.parametrize("drop", ["peak_reserved_mib", "spec.window", "step_time_ms.p90"])
def test_missing_key_names_file_and_key(tmp_path, drop):
    study = write_study(tmp_path)
    bad = study["cells"][1]
    cell = json.loads(bad.read_text())
    parent, _, key = drop.rpartition(".")
    del (cell[parent] if parent else cell)[key]
    write_json(bad, cell)
    with pytest.raises(MemoptError) as err:
        aggregate(study["cells"], study["summary"])
    assert str(bad) in str(err.value) and f"'{drop}'" in str(err.value)
    assert not study["summary"].exists()


def test_duplicate_cell_is_an_error(tmp_path):
    study = write_study(tmp_path)
    with pytest.raises(MemoptError, match="two cell JSONs"):
        aggregate(study["cells"] + study["cells"][:1], study["summary"])


def test_json_helpers_roundtrip_atomically(tmp_path):
    path = tmp_path / "deep" / "x.json"
    obj = {"zażółć": "gęślą jaźń", "n": [1, 2.5, None]}
    write_json(path, obj)
    assert read_json(path) == obj
    assert "zażółć" in path.read_text(encoding="utf-8")  # ensure_ascii=False
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temp file left behind
    path.write_text("{not json")
    with pytest.raises(MemoptError, match="not valid JSON"):
        read_json(path)


def test_quality_csv_has_one_row_per_run(tmp_path):
    study = write_study(tmp_path)
    frame = pd.read_csv(study["quality_csv"])
    assert list(zip(frame["function"], frame["seed"])) == [
        (f, seed) for f in QUALITY_LOSS for seed in SEEDS
    ]
    assert frame["val_loss"].tolist() == [v for f in QUALITY_LOSS for v in QUALITY_LOSS[f]]
    assert frame.loc[frame["function"] == "bf16_w128", "window"].tolist() == [128, 128]
    assert frame["final_train_loss"].iloc[0] == pytest.approx(8.0 - 0.1 * 19)


def _spec_cell(t, prec, att, win, ck, tps, mem, entry="same"):
    return dict(
        technique=t,
        batch_entry=entry,
        batch_size=8,
        status="ok",
        precision=prec,
        attention=att,
        window=win,
        checkpointing=ck,
        checkpoint_every=2,
        compile=False,
        loss="standard",
        loss_chunk=4096,
        optimizer="adamw",
        optimizer_in_backward=False,
        offload="none",
        compile_memory_budget=None,
        grad_accum=1,
        tokens_per_s=tps,
        peak_allocated_mib=mem,
    )


def test_incremental_effects_and_changes_against_the_baseline():
    from memopt.report.effects import incremental_effects
    from memopt.report.results import relative_to_baseline

    cells = [
        _spec_cell("baseline", "fp32", "math", None, "none", 100, 1000),
        _spec_cell("bf16", "bf16", "math", None, "none", 300, 900),
        _spec_cell("flash", "bf16", "flash", None, "none", 900, 450),
        _spec_cell("local128", "bf16", "flex", 128, "none", 950, 450),
        _spec_cell("gradcp", "fp32", "math", None, "full", 80, 300),
        _spec_cell("flash", "bf16", "flash", None, "none", 999, 999, entry="max"),
    ]
    pairs = {(r["technique"], r["over"]): r for r in incremental_effects(cells)}
    assert set(pairs) == {
        ("bf16", "baseline"),
        ("flash", "bf16"),
        ("local128", "bf16"),
        ("local128", "flash"),
        ("gradcp", "baseline"),
    }
    assert pairs[("flash", "bf16")]["speedup"] == 3.0
    assert pairs[("flash", "bf16")]["memory_reduction_pct"] == 50.0
    assert pairs[("local128", "flash")]["change"] == "flash → flex + window 128"
    assert pairs[("gradcp", "baseline")]["knob"] == "checkpointing"
    # no intervals: only equal throughputs are within noise; local128's 950 against flash's 900
    # is within 3% + 3%, not within 2% + 2%
    assert [
        pairs[("flash", "bf16")]["within_noise"],
        pairs[("local128", "flash")]["within_noise"],
    ] == [False, False]
    for c in cells:
        c["step_time_ms_rel_ci95"] = 0.03
    assert {
        (r["technique"], r["over"]) for r in incremental_effects(cells) if r["within_noise"]
    } == {("local128", "flash")}
    for c in cells:
        c["step_time_ms_rel_ci95"] = 0.02
    assert not any(r["within_noise"] for r in incremental_effects(cells))
    # a cell whose steps are not steady marks its pairs (the paper then draws no mechanism), with
    # the ratio of the medians beside the means'
    cells[2].update(unstable="10th-90th percentile spread 26% of the median",
                    step_time_ms_median=10.0)  # fmt: skip
    cells[1]["step_time_ms_median"] = 25.0
    pairs = {(r["technique"], r["over"]): r for r in incremental_effects(cells)}
    assert pairs[("flash", "bf16")]["unstable"] == ["flash"]
    assert pairs[("flash", "bf16")]["median_speedup"] == 2.5
    assert pairs[("local128", "flash")]["unstable"] == ["flash"]
    assert pairs[("bf16", "baseline")]["unstable"] == []
    assert pairs[("bf16", "baseline")]["median_speedup"] is None  # no medians there
    rel = {(r["technique"], r["batch_entry"]): r for r in relative_to_baseline(cells, "baseline")}
    assert rel[("bf16", "same")]["memory_reduction_pct"] == pytest.approx(10.0)
    assert rel[("flash", "max")]["speedup"] == pytest.approx(9.99)
    assert ("baseline", "same") not in rel


def test_analysis_names_the_best_and_says_when_it_is_within_noise():
    from memopt.report.effects import analysis

    def cell(t, mean, rel_ci, mem, entry="same"):
        return {
            "technique": t,
            "batch_entry": entry,
            "status": "ok",
            "step_time_ms_mean": mean,
            "step_time_ms_rel_ci95": rel_ci,
            "peak_allocated_mib": mem,
            "tokens_per_s": 500 / mean,
        }

    cells = [
        cell("a", 10.0, 0.05, 100),
        cell("b", 10.6, 0.02, 80),  # 50 against 47.2 tokens/s: within 7% of 50
        cell("c", 11.0, 0.03, 90),  # 45.5: not within 8%
        cell("d", 9.0, 0.01, 200, entry="max"),
    ]
    result = analysis(cells)
    # the paper's one noise rule (within_noise): the two cells' 95% intervals added
    assert result["fastest"] == {"technique": "a", "within_noise": ["b"]}
    assert result["lowest_memory"] == {"technique": "b", "peak_mib": 80}
    assert result["pareto"] == ["a (same)", "b (same)", "d (max)"]  # c: b uses less, is faster


def test_alias_cell_is_the_same_run_under_another_entry(tmp_path):
    from memopt.report.results import alias_cell

    write_json(tmp_path / "same.json", make_cell("baseline", "same", 8))
    alias_cell(tmp_path / "same.json", tmp_path / "max.json", "max")
    aggregate([tmp_path / "same.json", tmp_path / "max.json"], tmp_path / "summary.csv")
    frame = pd.read_csv(tmp_path / "summary.csv", dtype={"batch_entry": str})
    same, alias = frame.iloc[0], frame.iloc[1]
    assert (alias["batch_entry"], alias["measured_as"]) == ("max", "same")
    assert same["measured_as"] != same["measured_as"]  # NaN: measured in its own run
    numbers = frame.columns.difference(["batch_entry", "measured_as"])
    assert alias[numbers].equals(same[numbers])
