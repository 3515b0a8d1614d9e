"""The paper's conclusions (memopt.report.paper_analysis): HFU from the recomputation the knobs imply, and
the recommendation table, whose winners must follow from the data."""

import json

import pytest
from synthetic_study import md_table, render

from memopt.report.paper_analysis import add_hfu, recommendations
from memopt.report.verdicts import quality_table
from memopt.runtime.flops import flops_per_token, recompute_flops_per_token

MODEL = {"d_model": 8, "n_layers": 4, "d_ff": 16, "seq_len": 4}


def test_recompute_flops_by_hand():
    block = 2 * (4 * 64 + 2 * 8 * 16) + 4 * 8 * 2.5  # one block's forward: matmuls + attention
    spec = {"checkpointing": "none", "loss": "standard"}
    assert recompute_flops_per_token(MODEL, 10, spec) == 0
    assert recompute_flops_per_token(MODEL, 10, spec | {"checkpointing": "full"}) == 4 * block
    every2 = spec | {"checkpointing": "every_k", "checkpoint_every": 2}  # blocks 0 and 2
    assert recompute_flops_per_token(MODEL, 10, every2) == 2 * block
    assert recompute_flops_per_token(MODEL, 10, spec | {"checkpointing": "selective"}) == 0
    assert recompute_flops_per_token(MODEL, 10, spec | {"loss": "chunked"}) == 2 * 8 * 10
    assert recompute_flops_per_token(MODEL, 10, spec | {"loss": "liger"}) == 0
    budget = spec | {"compile": True, "compile_memory_budget": 0.5}
    assert recompute_flops_per_token(MODEL, 10, budget) is None


def test_hfu_counts_checkpointing_on_top_of_mfu():
    cells = [
        {"mfu": 0.3, "checkpointing": "full", "window": None, "loss": "standard"},
        {"mfu": 0.3, "checkpointing": "none", "window": None, "loss": "standard"},
        {"mfu": None, "checkpointing": "full", "window": None, "loss": "standard"},
    ]
    add_hfu(cells, MODEL, 10)
    full = recompute_flops_per_token(MODEL, 10, {"checkpointing": "full"})
    assert cells[0]["hfu"] == pytest.approx(0.3 * (1 + full / flops_per_token(MODEL, 10, None)))
    assert cells[0]["hfu"] > 0.3 and cells[1]["hfu"] == 0.3 and cells[2]["hfu"] is None


def cell(technique, entry, batch, tokens_per_s, peak, rel_ci=0.01, status="ok"):
    return {
        "technique": technique,
        "batch_entry": entry,
        "batch_size": batch,
        "tokens_per_s": tokens_per_s,
        "peak_allocated_mib": peak,
        "step_time_ms_rel_ci95": rel_ci,
        "status": status,
    }


TECHNIQUES = {
    "base": {"precision": "fp32", "window": None},
    "lean": {"precision": "fp32", "window": None, "checkpointing": "full"},
    "quick": {"precision": "bf16", "window": None},
    "local": {"precision": "bf16", "window": 64},
}


def quality_runs(losses: dict[str, tuple]) -> list[dict]:
    return [
        {"function": f, "seed": 1234 + i, "status": "ok", "val_loss": v, "val_ppl": 2.0,
         "kernel": "k", "tokens": 100}
        for f, values in losses.items()
        for i, v in enumerate(values)
    ]  # fmt: skip


def test_recommendations_follow_from_the_data():
    """A synthetic study whose winners are known: `lean` trains the largest batch and needs the
    least memory; `local` is fastest but its function is worse, so the fastest, quality not found worse
    is `quick`'s (bf16, as good as fp32); `quick` and `local` are within noise of each other."""
    cells = [
        cell("base", "same", 8, 1000, 20000),
        cell("base", "max", 8, 1000, 20000),
        cell("lean", "same", 8, 700, 9000),
        cell("lean", "max", 40, 750, 20000),
        cell("quick", "same", 8, 3000, 15000),
        cell("quick", "max", 12, 3050, 20000),
        cell("local", "same", 8, 3080, 14000),
        cell("local", "max", 44, 3100, 20000, status="oom"),  # a failed max is no evidence
    ]
    runs = quality_runs({"fp32": (5.40, 5.44), "bf16": (5.42, 5.46), "bf16_w64": (5.60, 5.62)})
    quality = quality_table(runs, TECHNIQUES, "base")
    rows = {r["goal"]: r for r in recommendations(cells, quality, "base")}
    assert list(rows) == [
        "largest batch",
        "fastest training",
        "least memory at the same batch",
        "fastest, quality not found worse",
    ]
    big = rows["largest batch"]
    assert (big["winner"], big["figure"], big["runner_up"]) == ("lean", "40 sequences", "quick")
    # lean's cost: at the same batch it runs at 700 tokens/s against local's 3,080
    assert big["cost"].startswith("0.23x the tokens/s of local at the same batch")
    fast = rows["fastest training"]
    assert (fast["winner"], fast["runner_up"], fast["within_noise"]) == ("local", "quick", True)
    assert "worse" in fast["cost"]  # its function's quality verdict comes with it
    low = rows["least memory at the same batch"]
    assert (low["winner"], low["figure"], low["runner_up"]) == (
        "lean",
        "9,000 MiB at batch 8",
        "local",
    )
    best = rows["fastest, quality not found worse"]
    assert (best["winner"], best["runner_up"]) == ("quick", "base")
    assert (
        best["figure"] == "3,050 tokens/s at batch 12, validation loss 5.4400 (seeds 5.4200–5.4600)"
    )


def test_two_searches_stopped_at_one_cap_tie_for_the_largest_batch():
    cells = [
        cell("base", "same", 8, 1000, 20000),
        cell("lean", "same", 8, 700, 9000),
        cell("lean", "max", 64, 750, 15000),
        cell("quick", "same", 8, 3000, 15000),
        cell("quick", "max", 64, 3050, 20000),
    ]
    quality = quality_table([], TECHNIQUES, "base")
    capped = recommendations(cells, quality, "base", frozenset({"lean", "quick"}))[0]
    assert (capped["winner"], capped["runner_up"], capped["tied"]) == ("quick", "lean", True)
    assert (capped["figure"], capped["runner_up_figure"]) == ("≥ 64 sequences", "≥ 64 sequences")
    proven = recommendations(cells, quality, "base", frozenset({"quick"}))[0]
    assert proven["tied"] is False  # lean's 64 is proven, quick's is at least 64: no tie


def test_no_quality_runs_no_quality_goal_and_one_seed_admits_only_the_best():
    cells = [cell("base", "same", 8, 1000, 20000), cell("quick", "same", 8, 3000, 15000)]
    goals = [
        r["goal"] for r in recommendations(cells, quality_table([], TECHNIQUES, "base"), "base")
    ]
    assert "fastest, quality not found worse" not in goals and "largest batch" not in goals
    one_seed = quality_table(quality_runs({"fp32": (5.40,), "bf16": (5.41,)}), TECHNIQUES, "base")
    best = recommendations(cells, one_seed, "base")[-1]
    assert (best["goal"], best["winner"], best["runner_up"]) == (
        "fastest, quality not found worse",
        "base",
        None,
    )


def test_the_paper_prints_the_recommendation_table(paper_study):
    text = render(paper_study)[0].read_text()
    rows = {r["goal"]: r for r in md_table(text, "what it costs")}
    # The synthetic study (tests/test_results.py): baseline's cells are the fastest, local128's the
    # leanest at `same`, and flash_gradcp's `max` ran out of memory.
    assert rows["largest batch"]["use"] == "**local128**"
    assert rows["fastest training"]["use"] == "**baseline**"
    assert rows["least memory at the same batch"]["use"] == "**local128**"
    assert rows["fastest, quality not found worse"]["use"] == "**baseline**"
    assert "HFU" in text


def breakdown_cell(technique, kernel, precision, weights, optimizer, activations, logits, peak,
                   tokens_per_s, **knobs):  # fmt: skip
    return {
        "technique": technique, "batch_entry": "same", "batch_size": 50, "status": "ok",
        "kernel": kernel, "attention": kernel, "precision": precision, "window": None,
        "checkpointing": "none",
        "loss": "standard", "optimizer": "adamw", "offload": "none", "compile": False,
        "weights_mib": weights, "gradients_mib": weights, "optimizer_state_mib": optimizer,
        "activations_mib": activations, "logits_mib": logits, "offloaded_mib": 0.0,
        "peak_allocated_mib": peak, "tokens_per_s": tokens_per_s, "mfu": 0.1, "hfu": None,
    } | knobs  # fmt: skip


def test_mechanisms_explain_each_part_that_moved_with_its_numbers():
    from memopt.report.paper_mechanisms import mechanisms

    model = {"n_layers": 12, "n_heads": 12, "seq_len": 1024}
    cells = [
        breakdown_cell("base", "math", "fp32", 421, 842, 65110, 6250, 78940, 44687),
        breakdown_cell(
            "ckpt",
            "math",
            "fp32",
            421,
            842,
            8388,
            6250,
            22219,
            35523,
            checkpointing="full",
            hfu=0.12,
        ),  # fmt: skip
        breakdown_cell("half", "math", "bf16", 421, 842, 70169, 3125, 77750, 108227),
        breakdown_cell("fused", "flash", "bf16", 421, 842, 26985, 3125, 34565, 390062),
        breakdown_cell("fused2", "flash", "bf16", 421, 842, 26985, 3125, 34565, 390062),
    ]
    exact = [{"technique": "ckpt", "reference": "base", "max_abs_diff": 0.0, "steps": 50}]
    text = {m["technique"]: m["text"] for m in mechanisms(cells, "base", exact, model)}
    assert list(text) == ["ckpt", "half", "fused", "fused2"]
    ckpt = text["ckpt"]
    assert "Peak 22,219 MiB against the baseline's 78,940 MiB (71.9% less)." in ckpt
    assert "58,860 MiB to 2,138 MiB (-56,722), because checkpointing keeps only" in ckpt
    assert "Logits kept" not in ckpt and "Working memory" not in ckpt  # they did not move
    assert "0.79x the baseline's tokens per second (MFU 10.0%; HFU 12.0%" in ckpt
    assert "bitwise identical to base's over the 50-step exactness run" in ckpt
    half = text["half"]
    assert (
        "(+8,184), because under bf16 autocast the explicit kernel runs its softmax in FP32" in half
    )
    assert "6,250 MiB to 3,125 MiB (-3,125), because the logits are bf16 instead of fp32" in half
    assert "bitwise" not in half
    fused = text["fused"]
    # 50 x 12 x 12 x 1024^2 FP32 values
    assert (
        "the fused flash attention kernel never stores" in fused and "28,800 MiB per FP32" in fused
    )
    # the arithmetic once; a speed cause only where one knob changed (here: precision alone)
    assert "keeps (28,800 MiB per FP32 copy, as above)" in text["fused2"]
    assert "changes precision and attention at once, so this ratio credits none" in fused
    assert "credits none" not in half and "credits none" not in ckpt
    assert mechanisms(cells[1:], "base", exact, model) == []  # no baseline cell: nothing to say


def test_the_tf32_reference_is_the_baseline_with_tf32_and_gets_its_own_speedups():
    from memopt.report.paper_analysis import add_tf32_speedups, tf32_reference
    from memopt.report.results import LATER_SPEC_KEYS, SPEC_KEYS

    knobs = dict.fromkeys(SPEC_KEYS, None) | LATER_SPEC_KEYS | {"attention": "math"}
    cells = [
        cell("base", "same", 8, 1000, 20000) | knobs | {"precision": "fp32"},
        cell("tf32ish", "same", 8, 2500, 20000) | knobs | {"precision": "tf32", "compile": True},
        cell("tf", "same", 8, 4000, 20000) | knobs | {"precision": "tf32"},
        cell("quick", "same", 8, 8000, 9000) | knobs | {"precision": "bf16"},
    ]
    ref = tf32_reference(cells, "base")
    assert ref["technique"] == "tf"  # tf32ish differs in another knob: not the reference
    relative = [{"technique": "quick", "batch_entry": "same"}]
    add_tf32_speedups(relative, cells, ref)
    assert relative[0]["speedup_tf32"] == 2.0
    assert tf32_reference(cells[:2] + cells[3:], "base") is None


def test_the_peak_parts_add_up_to_the_peak():
    from memopt.report.paper_mechanisms import peak_parts

    c = breakdown_cell("base", "math", "fp32", 421, 842, 65110, 6250, 78940, 44687)
    parts = peak_parts(c)
    drawn = ("weights", "optimizer", "activations", "logits", "working")
    assert sum(parts[k] for k in drawn) == pytest.approx(78940)
    assert parts["working"] == pytest.approx(78940 - 421 - 842 - 65110)
    assert peak_parts(c | {"activations_mib": float("nan")}) == {}  # not measured: nothing


def test_compilations_one_time_cost_and_when_it_is_repaid():
    """Issue 37: 'fastest, quality not found worse' named `compiled` without its compilation; the cost
    column now says when the faster technique's longer warm-up is repaid (h200-default's cells:
    compiled at 340 against local128 at 90)."""
    from memopt.report.paper_analysis import break_even_tokens, one_time_s

    compiled = {"warmup_s": 25.892491, "warmup_steps": 3, "step_time_ms_mean": 718.705151,
                "tokens_per_s": 484426.749439}  # fmt: skip
    local = {"warmup_s": 5.648034, "warmup_steps": 3, "step_time_ms_mean": 204.119695,
             "tokens_per_s": 451499.792082}  # fmt: skip
    assert one_time_s(compiled) == pytest.approx(25.892491 - 3 * 0.718705151)
    even = break_even_tokens(compiled, local)
    extra = one_time_s(compiled) - one_time_s(local)
    assert even["extra_s"] == pytest.approx(extra) and 18 < extra < 19
    assert even["tokens"] == pytest.approx(extra / (1 / 451499.792082 - 1 / 484426.749439))
    assert 120e6 < even["tokens"] < 130e6  # the 7M-token quality runs never repay it
    assert break_even_tokens(local, compiled) is None  # slower, and no longer warm-up
    assert break_even_tokens(compiled, {**local, "warmup_s": None}) is None


def test_the_logits_index_limit_is_named_where_a_compiled_cell_passes_it():
    """Issue 37: 2^31 logits elements (at 1,024 x 32,000 from 66 sequences): a compiled
    technique's cells across it or past it are named, with the uncompiled twin's change."""
    from memopt.report.paper_analysis import logits_step

    def cell(t, entry, batch, ms, compile_=False):  # the mean step 2% longer than the median
        return {"technique": t, "batch_entry": entry, "batch_size": batch, "status": "ok",
                "step_time_ms_median": ms, "compile": compile_,
                "tokens_per_s": batch * 1024 / (ms * (1.02 if entry == "max" else 1) / 1000)}  # fmt: skip

    pair = [{"technique": "compiled", "over": "flash", "knob": "compile"}]
    across = [cell("compiled", "same", 50, 100.0, True), cell("compiled", "max", 189, 390.0, True),
              cell("flash", "same", 50, 130.0), cell("flash", "max", 117, 290.0)]  # fmt: skip
    [step] = logits_step(across, 1024, 32000, pair)
    assert step["last_within"] == 65 and not step["both_past"]
    assert step["change"]["median"] == pytest.approx((189 / 390) / (50 / 100) - 1)
    assert step["change"]["mean"] == pytest.approx((189 / 390 / 1.02) / (50 / 100) - 1)
    assert step["twin"] == "flash"
    assert step["twin_step"]["change"]["median"] == pytest.approx((117 / 290) / (50 / 130) - 1)
    past = [cell("compiled", "same", 90, 180.0, True), cell("compiled", "max", 340, 650.0, True)]
    assert logits_step(past, 1024, 32000, [])[0]["both_past"]
    within = [cell("compiled", "same", 20, 50.0, True), cell("compiled", "max", 60, 140.0, True)]
    assert logits_step(within, 1024, 32000, []) == []
    uncompiled = [cell("flash", "same", 50, 130.0), cell("flash", "max", 117, 290.0)]
    assert logits_step(uncompiled, 1024, 32000, []) == []


def test_the_sweep_across_the_index_limit_is_read_from_its_cells(tmp_path):
    """The sweep (paper_analysis.SWEEP): `compiled` (the sweep's flash_compile) at the last batch
    within the limit and the first past it, and `flash`'s nearest cells either side, from the
    committed cells; a folder without them gives None."""
    from memopt.report.paper_analysis import SWEEP, sweep_step

    step = sweep_step(65)
    assert (step["below"]["batch"], step["above"]["batch"]) == (65, 66)
    assert step["change"] == pytest.approx(452284.1154 / 526649.9893 - 1)  # -14.1%
    assert step["gpu"] == "NVIDIA H200" and step["gpu_uuid"].startswith("6226fa31")
    assert (step["flash"]["below"]["batch"], step["flash"]["above"]["batch"]) == (64, 80)
    assert step["flash"]["change"] == pytest.approx(0.0220, abs=1e-4)  # no step of its own
    assert sweep_step(65, tmp_path) is None  # (no sweep there)
    (tmp_path / SWEEP).mkdir(parents=True)
    for b, tps in ((60, 500.0), (70, 400.0)):
        cell = {"technique": "flash_compile", "batch_size": b, "status": "ok", "tokens_per_s": tps,
                "provenance": {"gpu": "G", "gpu_uuid": "u", "git_commit": "c" * 40}}  # fmt: skip
        (tmp_path / SWEEP / f"cell_{b}.json").write_text(json.dumps(cell))
    got = sweep_step(65, tmp_path)
    assert got["change"] == pytest.approx(-0.2) and got["flash"] is None
