"""Divergence (issue 14): a cell or quality run whose training loss becomes non-finite stops at
once, is recorded as `status: diverged` with its step, and the paper says so, never NaN."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
from synthetic_study import md_table, render, write_study

import memopt.jobs.cell
import memopt.jobs.quality
import memopt.runtime.step
from memopt.config import technique_spec, validate_config
from memopt.jobs.cell import run_cell
from memopt.jobs.quality import CHECK_EVERY, run_quality
from memopt.report.figures import make_figures
from memopt.report.results import aggregate, read_json, read_summary, write_json
from memopt.report.verdicts import aggregate_quality
from memopt.runtime.functions import quality_spec
from memopt.runtime.step import prepare, train_step

# FP16 (CPU autocast) at learning rate 1 without clipping: the logits overflow FP16 within a few
# steps and the loss becomes NaN, as a real FP16 run at too high a learning rate does.
UNSTABLE = {"precision": "fp16", "attention": "math"}


def diverging_study(tiny_study, **overrides):
    cfg, data = tiny_study
    raw = {
        "device": "cpu",
        "model": cfg["model"],
        "train": {"lr": 1.0, "grad_clip": 0.0, "warmup_steps": 1, "eval_sequences": 4},
        # a precision no step time reaches: timing never stops before the loss turns non-finite
        # (at 1% a quiet CPU stopped after a few timed steps, before the divergence)
        "measure": {
            "warmup_steps": 2,
            "min_timed_steps": 4,
            "max_timed_steps": 200,
            "target_rel_ci": 1e-9,
            "max_timed_s": 600,
        },  # fmt: skip
        "search": {"cpu_memory_budget_gib": 8 / 1024, "max_batch": 512},
        "quality": {"tokens": 200 * 4 * 32, "batch": 4, "seeds": 1},
        "techniques": {"unstable": UNSTABLE},
        "baseline": "unstable",
    }
    return validate_config(raw | overrides), data


def first_nonfinite_step(cfg, spec, data, batch: int) -> int:
    """Train step by step, outside memopt's loops, until the loss is not finite; its step."""
    applied, opt, batches = prepare(cfg, spec, data, batch, "cpu", cfg["train"]["seed"])
    for step in range(200):
        x, y = batches.next()
        if not math.isfinite(float(train_step(applied, opt, x, y, step, cfg["train"]))):
            return step + 1
    raise AssertionError("the reference run did not diverge in 200 steps")


def count_steps(monkeypatch, *modules) -> list:
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return train_step(*args, **kwargs)

    for module in modules:
        monkeypatch.setattr(module, "train_step", counted)
    return calls


def test_a_diverging_cell_stops_at_once_and_records_its_step(tiny_study, monkeypatch):
    cfg, data = diverging_study(tiny_study)
    expected = first_nonfinite_step(cfg, technique_spec(cfg, "unstable"), data, 4)
    assert expected > cfg["measure"]["warmup_steps"] + cfg["measure"]["min_timed_steps"]
    calls = count_steps(monkeypatch, memopt.jobs.cell, memopt.runtime.step)
    cell = run_cell(cfg, "unstable", "4", 4, data, "cpu")
    assert cell["status"] == "diverged" and cell["diverged_step"] == expected
    assert len(calls) == expected  # past the minimum timed steps every step is checked
    assert cell["error"] == f"training loss became nan at step {expected}"
    assert len(cell["loss_curve"]) == expected - 1
    assert all(math.isfinite(v) for v in cell["loss_curve"])
    assert cell["tokens_per_s"] is None and cell["step_time_ms"] is None


def test_a_stable_run_is_not_flagged(tiny_study):
    cfg, data = diverging_study(tiny_study, train={"lr": 1e-3, "eval_sequences": 4})
    assert run_cell(cfg, "unstable", "4", 4, data, "cpu")["status"] == "ok"


def test_a_diverging_quality_run_stops_within_its_check_interval(tiny_study, monkeypatch):
    cfg, data = diverging_study(tiny_study)
    spec = quality_spec(cfg["techniques"], "fp16")  # what a quality run trains
    expected = first_nonfinite_step(cfg, spec, data, cfg["quality"]["batch"])
    calls = count_steps(monkeypatch, memopt.jobs.quality)
    run = run_quality(cfg, "fp16", cfg["train"]["seed"], data, "cpu")
    assert run["status"] == "diverged" and run["diverged_step"] == expected
    assert expected <= len(calls) < expected + CHECK_EVERY < cfg["quality"]["tokens"] / 128
    assert run["val_loss"] is None and run["val_ppl"] is None
    assert len(run["loss_curve"]) == expected - 1
    assert all(math.isfinite(v) for v in run["loss_curve"])


def test_the_paper_shows_diverged_runs_as_such(tiny_study, tmp_path):
    """Real diverged results (a cell and a quality seed) in a study: the tables say `diverged`
    with the step, the quality verdict does not compare the function, no NaN or inf anywhere."""
    cfg, data = diverging_study(tiny_study)
    cell_run = run_cell(cfg, "unstable", "4", 4, data, "cpu")
    quality_run = run_quality(cfg, "fp16", cfg["train"]["seed"], data, "cpu")
    paths = write_study(tmp_path)
    # The synthetic study's local128 cell at `same` and bf16's second seed diverged.
    cell_path = paths["cells"][-1]
    cell = read_json(cell_path)
    assert (cell["technique"], cell["batch_entry"]) == ("local128", "same")
    keep = ("technique", "batch_entry", "batch_size", "spec", "function", "kernel", "device")
    write_json(cell_path, cell_run | {k: cell[k] for k in keep})
    q_path = next(p for p in paths["quality"] if p.parts[-2] == "bf16" and p.name != "1234.json")
    q = read_json(q_path)
    fields = ("status", "diverged_step", "error", "loss_curve", "val_loss", "val_ppl")
    write_json(q_path, q | {k: quality_run[k] for k in fields})
    aggregate(paths["cells"], paths["summary"])
    aggregate_quality(paths["quality"], paths["quality_csv"])
    row = (
        read_summary(paths["summary"])
        .set_index(["technique", "batch_entry"])
        .loc[("local128", "same")]
    )
    assert row["status"] == "diverged" and row["diverged_step"] == cell_run["diverged_step"]
    figures = tmp_path / "paper" / "figures"
    make_figures(
        paths["summary"],
        figures,
        search_paths=paths["searches"],
        quality_paths=paths["quality"],
        processes=2,
    )
    out_md, out_tex = render(paths | {"root": tmp_path, "figures": figures})
    text, tex = out_md.read_text(), out_tex.read_text()

    rows = md_table(text, "timed steps")
    [diverged] = [r for r in rows if r["technique"] == "local128" and r["entry"] == "same"]
    step = cell_run["diverged_step"]
    assert diverged["status"] == "**diverged**"  # the step in one cell across the measurements
    assert diverged["peak allocated (MiB)"] == f"training loss non-finite at step {step}"
    assert f"training loss non-finite at step {step}" in tex
    seed = int(q_path.stem)
    quality = {r["function"]: r for r in md_table(text, "verdict")}
    assert quality["bf16"]["verdict"] == f"diverged (seed {seed})"
    assert quality["bf16"]["Δ val loss (95% CI)"] == "n/a"
    step = quality_run["diverged_step"]
    sentence = f"its training loss became non-finite at step {step} (diverged)"
    assert f"Seed {seed} of `bf16` did not finish: {sentence}" in text
    assert f"Seed {seed} of \\texttt{{bf16}} did not finish: {sentence}" in tex
    for doc in (text, tex):
        assert not re.search(r"\b(nan|NaN|inf)\b", doc)


# Run by torchrun on each rank: rank 1's slice goes non-finite at step 5, rank 0's never does.
RANKS_SCRIPT = """
import json, sys, torch, torch.distributed as dist
from memopt.runtime.divergence import Diverged, LossWatch
dist.init_process_group("gloo")
rank, watch, losses = dist.get_rank(), LossWatch(), []
out = None
for step in range(12):
    bad = rank == 1 and step == 4
    losses.append(torch.tensor(float("nan") if bad else 2.0 + rank))
    try:
        if step in (2, 7, 11):  # checks every few steps, as a quality run does
            watch.check(losses)
    except Diverged as err:
        out = {"rank": rank, "checked_at": step, "step": err.step, "loss": str(err.loss),
               "curve": err.curve}
        break
json.dump(out, open(sys.argv[1] + f".{rank}", "w"))
dist.destroy_process_group()
"""


@pytest.mark.slow  # torchrun-style ranks in processes of their own (pytest -m slow)
def test_ranks_agree_on_the_first_diverged_step(tmp_path):
    """Only rank 1's loss is NaN: both ranks stop at the same check with the same step (no rank
    is left waiting in a collective), the global loss is NaN, the curve the ranks' mean."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), str(tmp_path / "out")],
        check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120,
    )  # fmt: skip
    outs = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in (0, 1)]
    for rank, out in enumerate(outs):
        assert out == {"rank": rank, "checked_at": 7, "step": 5, "loss": "nan",
                       "curve": [2.5] * 4}  # fmt: skip


def test_a_reference_with_a_diverged_seed_is_no_yardstick():
    from memopt.report.verdicts import quality_table

    techniques = {"base": {"precision": "fp32", "window": None},
                  "quick": {"precision": "bf16", "window": None}}  # fmt: skip
    runs = [
        {"function": "fp32", "seed": 1, "status": "ok", "val_loss": 5.0, "val_ppl": 148.4,
         "kernel": "math", "tokens": 10},
        {"function": "fp32", "seed": 2, "status": "diverged", "diverged_step": 9,
         "val_loss": None, "val_ppl": None},
        {"function": "bf16", "seed": 1, "status": "ok", "val_loss": 5.5, "val_ppl": 244.7,
         "kernel": "flash", "tokens": 10},
        {"function": "bf16", "seed": 2, "status": "ok", "val_loss": 5.6, "val_ppl": 270.4,
         "kernel": "flash", "tokens": 10},
    ]  # fmt: skip
    rows = {r["function"]: r for r in quality_table(runs, techniques, "base")["rows"]}
    assert rows["fp32"]["verdict"] == "diverged (seed 2)"
    assert rows["bf16"]["verdict"] == "n/a: the reference diverged"
    assert rows["bf16"]["delta_val_loss"] is None


def test_a_non_finite_validation_loss_is_a_divergence_too(tiny_study, monkeypatch):
    """The last update can break the weights after the last training loss was read."""
    cfg, data = tiny_study
    cfg = cfg | {"quality": {**cfg["quality"], "tokens": 4 * 32 * 5, "batch": 4, "seeds": 1}}
    nan = {"loss": float("nan"), "positions": []}
    monkeypatch.setattr(memopt.jobs.quality, "evaluate", lambda *args: nan)
    run = run_quality(cfg, "fp32", 1234, data, "cpu")
    assert run["status"] == "diverged" and run["diverged_step"] == 6  # after the 5 steps
    assert run["error"] == "validation loss after the last update became nan at step 6"
    assert run["val_ppl"] is None and len(run["loss_curve"]) == 5


def test_a_quality_run_out_of_memory_is_a_result(tiny_study, monkeypatch):
    """(A CPU quality run has no memory budget: the GPU's error is raised by hand.)"""
    import torch

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    cfg, data = tiny_study
    monkeypatch.setattr(memopt.jobs.quality, "train_step", out_of_memory)
    run = run_quality(cfg | {"quality": {"tokens": 640, "batch": 4, "seeds": 1}}, "fp32", 1234,
                      data, "cpu")  # fmt: skip
    assert run["status"] == "oom" and run["error"].startswith("quality.batch 4 does not fit")
    assert run["val_loss"] is None and run["val_ppl"] is None
