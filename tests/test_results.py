"""Aggregation of cell JSONs into summary.csv, and the atomic JSON helpers.

Also home of the synthetic-study builder that test_figures.py and test_paper.py import.
"""

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from memopt.errors import MemoptError
from memopt.functions import function_of
from memopt.results import aggregate, read_json, write_json
from memopt.verdicts import aggregate_quality

# Not alphabetical, so the tests see that rows keep the techniques' input order.
TECHNIQUES = {
    "baseline": {"precision": "fp32", "attention": "math", "window": None, "checkpointing": "none"},
    "flash_gradcp": {
        "precision": "bf16",
        "attention": "flash",
        "window": None,
        "checkpointing": "full",
    },
    "local128": {"precision": "bf16", "attention": "flex", "window": 128, "checkpointing": "none"},
}
SAME_BATCH = 8
MAX_BATCH = {"baseline": 8, "flash_gradcp": 64, "local128": 24}
OOM = {("flash_gradcp", "max")}  # the search's maximum did not survive the full run


def make_cell(technique: str, entry: str, batch_size: int, status: str = "ok") -> dict:
    """One cell JSON as the training step writes it, with distinct, awkward numbers per cell."""
    k = list(TECHNIQUES).index(technique) + 1 + (0.5 if entry == "max" else 0)
    ok = status == "ok"
    spec = {**TECHNIQUES[technique], "checkpoint_every": 2, "compile": False}
    step = {
        "mean": 101.234 * k,
        "median": 100.9 * k,
        "std": 3.456 * k,
        "p10": 98.0 * k,
        "p90": 104.5 * k,
        "ci95_half": 1.234 * k,
        "rel_ci95": 1.234 / 101.234,
    }
    return {
        "technique": technique,
        "batch_entry": entry,
        "batch_size": batch_size,
        "status": status,
        "spec": spec,
        "function": function_of(spec),
        "kernel": spec["attention"],
        "kernel_detail": spec["attention"] if ok else None,
        "device": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "steps": 12,
        "warmup_steps": 2,
        "timed_steps": 10,
        "seq_len": 64,
        "tokens_per_step": batch_size * 64,
        "step_time_ms": step if ok else None,
        # local128 at its maximum warms up: its first steps are slow (memopt.steady flags it).
        "step_times_ms": [
            100.9
            * k
            * (1.4 if technique == "local128" and entry == "max" and i < 3 else 1 + 0.001 * (i % 5))
            for i in range(30)
        ]
        if ok
        else None,  # fmt: skip
        "timed_s": 1.01234 * k if ok else None,
        "warmup_s": 0.25 * k if ok else None,
        "allocator_events": (
            {
                "alloc_retries": 2 if technique == "local128" else 0,
                "ooms": 0,
                "device_allocs": 3,
                "device_frees": 1,
            }
            if ok
            else None
        ),
        "tokens_per_s": 12345.678 / k if ok else None,
        "model_tflops": 123.4 / k if ok else None,
        "mfu": 0.1248 / k if ok else None,
        "phase_memory": {
            f"{w}_{p}_mib": 1000.0 * k + i
            for i, (w, p) in enumerate(
                (w, p) for p in ("forward", "backward", "optimizer") for w in ("after", "peak")
            )
        }
        if ok
        else None,
        "memory_breakdown": {
            f"{n}_mib": 10.5 * k + i
            for i, n in enumerate(
                ("weights", "gradients", "optimizer_state", "activations", "logits", "logits_grad")
            )
        }
        if ok
        else None,
        "wall_s": 3.21 * k if ok else None,
        "peak_allocated_mib": 23456.789 / k if ok else None,
        "peak_reserved_mib": 24000.5 / k if ok else None,
        "loss_curve": [8.0 - 0.2 * i - 0.05 * k for i in range(12)] if ok else [],
        "error": None if ok else "CUDA out of memory. Tried to allocate 2.00 GiB",
        "provenance": {
            "torch": "2.5.1",
            "python": "3.11.2",
            "cuda": "12.4",
            "gpu": "H100",
            "git_commit": "abc123",
            "config_hash": "cfg_0001",
            "memopt": "0.1.0",
        },
    }


def make_search(technique: str) -> dict:
    top = MAX_BATCH[technique]
    trials = [
        {"batch": b, "fits": True, "peak_mib": 100.0 * b, "seconds": 0.5} for b in (1, 2, 4, 8)
    ]
    trials = [t for t in trials if t["batch"] <= top] + [
        {"batch": top, "fits": True, "peak_mib": 100.0 * top, "seconds": 0.5},
        {"batch": top * 2, "fits": False, "peak_mib": None, "seconds": 0.2},
    ]
    return {
        "technique": technique,
        "status": "ok",
        "max_batch": top,
        "cap": 1024,
        "budget_mib": 81559.0,
        "device": "cuda",
        "seconds": 4.25,
        "trials": trials,
    }


STATS = {
    "dataset": "eltec_pol_mini",
    "source": "mirror",
    "documents_in": 5,
    "train": {"documents": 4, "characters": 480_000, "words": 80_000},
    "val": {"documents": 1, "characters": 120_000, "words": 20_000},
    "license": "public domain texts; ELTeC encoding CC BY 4.0",
    "description": (
        "ELTeC-pol v1.0.0 (COST Action CA16204), DOI 10.5281/zenodo.4662725; "
        "100% Polish & more: powieści, zażółć"
    ),
}
META = {
    "vocab_size": 512,
    "dtype": "uint16",
    "eos_id": 1,
    "train_tokens": 160_000,
    "val_tokens": 40_000,
    "tokenizer_sha256": "f" * 64,
}
CONFIG = {
    "device": "cuda",
    "model": {
        "n_layers": 2,
        "d_model": 64,
        "n_heads": 4,
        "d_ff": 256,
        "seq_len": 64,
        "dropout": 0.1,
    },
    "train": {
        "lr": 0.0005,
        "warmup_steps": 2,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "seed": 1234,
        "eval_sequences": 8,
        "eval_batch_size": 4,
    },
    "measure": {
        "warmup_steps": 2,
        "target_rel_ci": 0.01,
        "min_timed_steps": 10,
        "max_timed_steps": 100,
    },
    "quality": {"tokens": 40_960, "batch": 32, "seeds": 2},
    "worker": {"enabled": True, "idle_s": 60},
    "exactness": {"steps": 5, "batch": 4, "tolerance": {"fp32": 0.01, "tf32": 0.02, "bf16": 0.05}},
    "search": {
        "memory_budget_gib": None,
        "max_batch": 1024,
        "trial_steps": 2,
        "granularity": 1,
        "strategy": "fit",
    },
    "baseline": "baseline",
    "batch_sizes": ["same", "max"],
    "techniques": {
        name: {k: v for k, v in spec.items() if v is not None} for name, spec in TECHNIQUES.items()
    },
}


SEEDS = (1234, 1235)
# Validation loss per function and seed: bf16's range overlaps fp32's (not distinguishable),
# the window's lies above both (worse).
QUALITY_LOSS = {"fp32": (5.40, 5.44), "bf16": (5.42, 5.46), "bf16_w128": (5.60, 5.62)}


def make_quality(function: str, seed: int) -> dict:
    loss = QUALITY_LOSS[function][SEEDS.index(seed)]
    precision, _, window = function.partition("_w")
    spec = {
        "precision": precision,
        "attention": "auto",
        "window": int(window) if window else None,
        "checkpointing": "none",
        "checkpoint_every": 2,
        "compile": False,
    }
    return {
        "function": function,
        "seed": seed,
        "status": "ok",
        "spec": spec,
        "kernel": "efficient" if precision == "fp32" else ("flex" if window else "cudnn"),
        "batch_size": 32,
        "tokens_per_step": 2048,
        "steps": 20,
        "tokens": 40_960,
        "loss_curve": [8.0 - 0.1 * i - (seed - 1234) * 0.01 for i in range(20)],
        "train_s": 2.5 + (seed - 1234),
        "eval_s": 0.1,
        "wall_s": 3.0,
        "val_loss": loss,
        "val_ppl": math.exp(loss),
        "error": None,
        "provenance": {"gpu": "H100", "gpu_uuid": "GPU-1", "host": "h", "git_commit": "abc123"},
    }


def make_exactness(technique: str) -> dict:
    # flash_gradcp is checked against nothing of its own function here: one member each, so each
    # technique is its own reference.
    return {
        "technique": technique,
        "function": function_of(TECHNIQUES[technique]),
        "batch_size": 4,
        "steps": 5,
        "losses": [7.0 - 0.1 * i for i in range(5)],
        "seconds": 0.5,
    }


def write_study(root: Path) -> dict:
    """Write a whole synthetic study under root; return its input paths (cells in config order,
    but `max` before `same`, so sorting entries is exercised)."""
    cells = []
    for technique in TECHNIQUES:
        for entry, batch in (("max", MAX_BATCH[technique]), ("same", SAME_BATCH)):
            status = "oom" if (technique, entry) in OOM else "ok"
            path = root / "results" / "cells" / technique / f"{entry}.json"
            write_json(path, make_cell(technique, entry, batch, status))
            cells.append(path)
    searches = []
    for technique in TECHNIQUES:
        path = root / "results" / "search" / f"{technique}.json"
        write_json(path, make_search(technique))
        searches.append(path)
    quality = []
    for function in QUALITY_LOSS:
        for seed in SEEDS:
            path = root / "results" / "quality" / function / f"{seed}.json"
            write_json(path, make_quality(function, seed))
            quality.append(path)
    aggregate_quality(quality, root / "results" / "quality.csv")
    exact = []
    for technique in TECHNIQUES:
        path = root / "results" / "exactness" / f"{technique}.json"
        write_json(path, make_exactness(technique))
        exact.append(path)
    write_json(root / "data" / "corpus" / "stats.json", STATS)
    write_json(root / "data" / "tokens" / "meta.json", META)
    return {
        "cells": cells,
        "searches": searches,
        "quality": quality,
        "quality_csv": root / "results" / "quality.csv",
        "exactness": exact,
        "stats": root / "data/corpus/stats.json",
        "meta": root / "data/tokens/meta.json",
        "summary": root / "results" / "summary.csv",
    }


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
    from memopt.results import incremental_effects, relative_to_baseline

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
    rel = {(r["technique"], r["batch_entry"]): r for r in relative_to_baseline(cells, "baseline")}
    assert rel[("bf16", "same")]["memory_reduction_pct"] == pytest.approx(10.0)
    assert rel[("flash", "max")]["speedup"] == pytest.approx(9.99)
    assert ("baseline", "same") not in rel


def test_analysis_names_the_best_and_says_when_it_is_within_noise():
    from memopt.results import analysis

    def cell(t, mean, std, mem, tps, entry="same"):
        return {
            "technique": t,
            "batch_entry": entry,
            "status": "ok",
            "step_time_ms_mean": mean,
            "step_time_ms_std": std,
            "peak_allocated_mib": mem,
            "tokens_per_s": tps,
        }

    cells = [
        cell("a", 10.0, 0.5, 100, 50),
        cell("b", 10.8, 0.4, 80, 45),
        cell("c", 12.0, 0.1, 90, 40),
        cell("d", 9.0, 0.1, 200, 60, entry="max"),
    ]
    result = analysis(cells)
    assert result["fastest"] == {"technique": "a", "within_noise": ["b"]}  # 0.8 <= 0.5 + 0.4
    assert result["lowest_memory"] == {"technique": "b", "peak_mib": 80}
    assert result["pareto"] == ["a (same)", "b (same)", "d (max)"]  # c: b uses less, is faster


def test_alias_cell_is_the_same_run_under_another_entry(tmp_path):
    from memopt.results import alias_cell

    write_json(tmp_path / "same.json", make_cell("baseline", "same", 8))
    alias_cell(tmp_path / "same.json", tmp_path / "max.json", "max")
    aggregate([tmp_path / "same.json", tmp_path / "max.json"], tmp_path / "summary.csv")
    frame = pd.read_csv(tmp_path / "summary.csv", dtype={"batch_entry": str})
    same, alias = frame.iloc[0], frame.iloc[1]
    assert (alias["batch_entry"], alias["measured_as"]) == ("max", "same")
    assert same["measured_as"] != same["measured_as"]  # NaN: measured in its own run
    numbers = frame.columns.difference(["batch_entry", "measured_as"])
    assert alias[numbers].equals(same[numbers])
