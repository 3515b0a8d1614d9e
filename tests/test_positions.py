"""Loss by position (issue 35): the buckets, the evaluation that reports them beside the whole
validation loss, a quality run recording them, and their mean over seeds for the paper."""

from __future__ import annotations

import pytest
import torch

from memopt.jobs.quality import evaluate, position_buckets, run_quality
from memopt.report.paper_tables_quality import positions_table
from memopt.report.verdicts import quality_table


def test_buckets_split_the_positions_at_the_bounds():
    assert position_buckets([64, 128, 512], 1024) == [(1, 64), (65, 128), (129, 512), (513, 1024)]
    assert position_buckets([512, 64, 128], 100) == [(1, 64), (65, 100)]  # bounds past the end
    assert position_buckets([64], 64) == [(1, 64)]


def test_evaluation_reports_each_bucket_and_the_same_whole_loss(tiny_study):
    from memopt.data.tokens import eval_sequences
    from memopt.runtime.step import prepare

    cfg, data = tiny_study
    spec = cfg["techniques"]["baseline"]
    applied, _, _ = prepare(cfg, spec, data, 4, "cpu", 1234)
    model = applied.model
    seqs = eval_sequences(data.val, 32, 12)
    scored = evaluate(model, seqs, 5, "cpu", position_buckets([8, 16], 32))
    with torch.no_grad():
        model.eval()
        logits = model(seqs[:, :-1])
        tokens = torch.nn.functional.cross_entropy(
            logits.double().transpose(1, 2), seqs[:, 1:], reduction="none"
        )
        whole = model(seqs[:, :-1], seqs[:, 1:]).item()
    assert scored["loss"] == pytest.approx(whole, abs=1e-5)  # what evaluate returned before
    first = tokens[:, :8].mean(dim=1)
    assert [(p["first"], p["last"]) for p in scored["positions"]] == [(1, 8), (9, 16), (17, 32)]
    assert scored["positions"][0]["loss"] == pytest.approx(first.mean().item(), abs=1e-5)
    assert scored["positions"][0]["se"] == pytest.approx(first.std().item() / 12**0.5, rel=1e-4)
    weights = [8, 8, 16]  # the buckets' shares of the tokens: the whole loss is their blend
    blend = sum(w * p["loss"] for w, p in zip(weights, scored["positions"])) / 32
    assert blend == pytest.approx(scored["loss"], abs=1e-6)


@pytest.mark.parametrize("block", ["gpt2", "llama"])
def test_evaluation_runs_either_block_in_the_explicit_fp32_kernel(tiny_study, block):
    """Every function is scored alike: the training kernel (on a GPU the auto kernel, cuDNN or
    flash, which refuse FP32) is swapped for the explicit one in both blocks' attention."""
    from memopt.jobs.quality import _explicit_fp32
    from memopt.runtime.attention import math_attention
    from memopt.runtime.step import prepare

    cfg, data = tiny_study
    spec = {**cfg["techniques"]["baseline"], "block": None if block == "gpt2" else block}
    model = prepare(cfg, spec, data, 4, "cpu", 1234)[0].model
    attention = [m for m in model.modules() if hasattr(m, "attend")]
    assert len(attention) == cfg["model"]["n_layers"]

    def training_kernel(q, k, v, window=None):
        raise AssertionError("scored with the training kernel")

    for m in attention:
        m.attend = training_kernel
    with _explicit_fp32(model):
        assert all(m.attend is math_attention for m in attention)
    assert all(m.attend is training_kernel for m in attention)


def test_a_quality_run_records_loss_by_position(tiny_study):
    cfg, data = tiny_study
    cfg = {**cfg, "quality": {**cfg["quality"], "tokens": 32 * 32 * 3, "position_buckets": [4, 16]}}
    run = run_quality(cfg, "fp32", 1234, data, "cpu")
    assert run["status"] == "ok"
    assert [(p["first"], p["last"]) for p in run["val_positions"]] == [(1, 4), (5, 16), (17, 32)]
    assert all(p["se"] > 0 for p in run["val_positions"])


def run(function, seed, losses):
    """A quality run with its loss at positions 1-64 and 65-1,024."""
    pos = [{"first": f, "last": last, "loss": v, "se": 0.01}
           for (f, last), v in zip([(1, 64), (65, 1024)], losses)]  # fmt: skip
    return {"function": function, "seed": seed, "status": "ok", "val_loss": sum(losses) / 2,
            "val_ppl": 1.0, "kernel": "x", "tokens": 1, "val_positions": pos}  # fmt: skip


def test_the_paper_shows_each_functions_mean_over_seeds():
    techniques = {"base": {"precision": "fp32", "window": None, "attention": "math"}}
    runs = [run("fp32", 1, (5.4, 5.2)), run("fp32", 2, (5.6, 5.0))]
    quality = quality_table(runs, techniques, "base")
    assert quality["rows"][0]["positions"][0]["loss"] == pytest.approx(5.5)
    table = positions_table({"quality": quality})
    assert table.columns == ["function", "positions 1–64", "positions 65–1,024"]
    assert table.rows == [["fp32", "5.500 ± 0.010", "5.100 ± 0.010"]]
    runs[1]["val_positions"] = None  # a run from before positions were recorded: no table row
    assert quality_table(runs, techniques, "base")["rows"][0]["positions"] is None


def test_the_positions_figure_draws_each_function_or_says_why_not():
    from memopt.report.figures_quality import positions_figure

    def run(function, seed, losses):
        pos = [{"first": f, "last": last, "loss": v, "se": 0.02}
               for (f, last), v in zip([(1, 64), (65, 128), (129, 1024)], losses)]  # fmt: skip
        return {"function": function, "seed": seed, "status": "ok", "val_positions": pos}

    runs = [run("bf16", 1, (5.4, 5.2, 5.1)), run("bf16", 2, (5.6, 5.0, 5.1)),
            run("bf16_w32", 1, (5.3, 5.2, 5.3))]  # fmt: skip
    ax = positions_figure(runs, {}).axes[0]
    bars = ax.containers  # one error-bar plot per function
    assert [c.get_label() for c in bars] == ["bf16 (2 seeds)", "bf16_w32 (1 seed)"]
    line = bars[0].lines[0]
    assert list(line.get_ydata()) == pytest.approx([5.5, 5.1, 5.1])
    assert list(line.get_xdata()) == [32.5, 96.5, 576.5]
    empty = positions_figure([{**runs[0], "val_positions": None}], {}).axes[0]
    assert "not recorded" in empty.texts[0].get_text()


def test_what_a_function_gives_up_by_position_is_paired_with_the_reference():
    techniques = {"base": {"precision": "bf16", "window": None, "attention": "flash"},
                  "w": {"precision": "bf16", "window": 32, "attention": "flex"}}  # fmt: skip
    runs = [run("bf16", 1, (5.4, 5.2)), run("bf16", 2, (5.6, 5.0)),
            run("bf16_w32", 1, (5.4, 5.31)), run("bf16_w32", 2, (5.6, 5.112))]  # fmt: skip
    quality = quality_table(runs, techniques, "base")
    window = next(r for r in quality["rows"] if r["function"] == "bf16_w32")
    near, far = window["position_deltas"]
    assert near["mean"] == pytest.approx(0.0) and far["mean"] == pytest.approx(0.111)
    assert far["lo"] > 0  # 0.110 and 0.112: the window gives up the far positions
    table = positions_table({"quality": quality})
    assert table.rows[-1][0] == "Δ bf16_w32" and table.rows[-1][2].startswith("0.111 [")


def test_the_loss_figure_draws_the_reference_above_the_others():
    """Curves that lie on one another hid the reference under the functions drawn after it."""
    from memopt.report.figures_quality import loss_figure

    def run(function, seed):
        return {"function": function, "seed": seed, "status": "ok", "tokens_per_step": 64,
                "loss_curve": [5.0 - 0.01 * i for i in range(40)]}  # fmt: skip

    runs = [run(f, s) for f in ("tf32", "bf16", "fp16") for s in (1, 2)]
    fig = loss_figure(runs, {}, on_top="tf32")
    full, zoom = fig.axes
    z = {line.get_label(): line.get_zorder() for line in full.lines}
    assert list(z) == ["tf32 (2 seeds)", "bf16 (2 seeds)", "fp16 (2 seeds)"]  # legend order kept
    assert z["tf32 (2 seeds)"] > max(z["bf16 (2 seeds)"], z["fp16 (2 seeds)"])
    assert [line.get_zorder() for line in zoom.lines] == list(z.values())  # the zoom alike
