"""Paired quality verdicts (memopt.report.paired): the t quantiles, the four verdicts on paired
data with known answers, the rule's false-positive rate and power by simulation, and the pairing
itself (seed k of every function: the same initialization and the same batches)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from memopt.report.paired import paired_differences, paired_verdict, t_quantile


@pytest.mark.parametrize("p, df, t", [(0.975, 1, 12.7062), (0.975, 3, 3.1824), (0.975, 10, 2.2281),
                                      (0.975, 30, 2.0423), (0.80, 3, 0.9785), (0.025, 5, -2.5706)])  # fmt: skip
def test_t_quantiles_match_the_tables(p, df, t):
    assert t_quantile(p, df) == pytest.approx(t, abs=1e-4)


def test_verdicts_on_paired_data_with_known_answers():
    assert paired_verdict([0.101, 0.099, 0.102, 0.098], 0.02)["verdict"] == "worse"
    assert paired_verdict([-0.101, -0.099, -0.102, -0.098], 0.02)["verdict"] == "better"
    same = paired_verdict([0.001, -0.002, 0.0015, -0.0005], 0.02)
    assert same["verdict"] == "equivalent" and -0.02 < same["lo"] < same["hi"] < 0.02
    noisy = paired_verdict([0.05, -0.04, 0.03, -0.045], 0.02)  # holds 0, reaches past the margin
    assert noisy["verdict"] == "inconclusive" and noisy["mdd"] > 0.02
    # a significant difference inside the margin is equivalent, not worse
    assert paired_verdict([0.005, 0.006, 0.0055, 0.0052], 0.02)["verdict"] == "equivalent"
    one = paired_verdict([0.3], 0.02)
    assert one["verdict"] == "inconclusive" and one["lo"] is None and one["mean"] == 0.3
    with pytest.raises(ValueError, match="quality.margin"):
        paired_verdict([0.1, 0.2], 0.0)


def test_the_interval_and_detectable_difference_follow_the_formulas():
    d = [0.01, 0.03, 0.02, 0.04]
    v = paired_verdict(d, 0.05)
    se = 0.0129099444873580 / 2  # sd of d over sqrt(4)
    assert v["hi"] - v["mean"] == pytest.approx(3.1824 * se, rel=1e-4)
    assert v["mdd"] == pytest.approx((3.1824 + 0.9785) * se, rel=1e-4)


def test_a_family_level_widens_the_interval_and_can_undo_an_equivalence():
    """The quality paper's Bonferroni check (memopt.report.quality_paper._family): the same
    differences at 1 - 0.05 / 8 give a wider interval, and a narrow equivalence becomes
    inconclusive."""
    diffs = [0.010, -0.004, 0.006, -0.008]
    at95 = paired_verdict(diffs, 0.02)
    family = paired_verdict(diffs, 0.02, level=1 - 0.05 / 8)
    assert at95["verdict"] == "equivalent" and family["verdict"] == "inconclusive"
    se = at95["sd"] / 2
    assert family["hi"] - family["mean"] == pytest.approx(t_quantile(1 - 0.05 / 16, 3) * se)
    assert family["hi"] > at95["hi"] and family["lo"] < at95["lo"]


def test_a_null_is_flagged_at_most_at_the_nominal_rate_and_a_real_effect_is_found():
    rng = random.Random(0)
    trials, n, sd = 20000, 4, 0.03
    flagged = sum(
        paired_verdict([rng.gauss(0.0, sd) for _ in range(n)], 0.005)["verdict"]
        in ("worse", "better")
        for _ in range(trials)
    )
    nominal = 0.05
    assert flagged / trials <= nominal + 3 * math.sqrt(nominal * (1 - nominal) / trials)
    assert flagged / trials >= 0.04  # calibrated, not merely timid
    # a true difference at the minimum detectable size is found about 80% of the time
    effect = (t_quantile(0.975, n - 1) + t_quantile(0.8, n - 1)) * sd / math.sqrt(n)
    found = sum(
        paired_verdict([rng.gauss(effect, sd) for _ in range(n)], 0.005)["verdict"] == "worse"
        for _ in range(4000)
    )
    assert 0.65 <= found / 4000 <= 0.9


def test_only_paired_seeds_are_compared():
    runs = [{"function": f, "seed": s, "status": st, "val_loss": v} for f, s, st, v in [
        ("ref", 1, "ok", 5.0), ("ref", 2, "ok", 5.1), ("ref", 3, "ok", 5.2),
        ("w", 1, "ok", 5.05), ("w", 2, "diverged", None), ("w", 3, "ok", 5.3), ("w", 4, "ok", 9.0)]]  # fmt: skip
    assert paired_differences(runs, "w", "ref") == pytest.approx([0.05, 0.1])


def test_seed_k_of_every_function_starts_alike_and_sees_the_same_batches(tiny_study):
    """The pairing the verdicts rest on (memopt.runtime.step.prepare)."""
    from memopt.config import validate_config
    from memopt.runtime.step import prepare

    cfg, tiny_tokens = tiny_study
    specs = {"fp32": {"precision": "fp32", "attention": "math"},
             "window": {"precision": "fp32", "attention": "math", "window": 4}}  # fmt: skip
    made = {}
    for seed in (7, 8):
        for name, spec in specs.items():
            spec = validate_config({"techniques": {name: spec}, "baseline": name})["techniques"][
                name
            ]
            applied, _, batches = prepare(cfg, spec, tiny_tokens, 4, "cpu", seed)
            state = {k: v.clone() for k, v in applied.model.state_dict().items()}
            made[name, seed] = (state, [batches.next()[0].clone() for _ in range(3)])
    for seed in (7, 8):
        (a, xa), (b, xb) = made["fp32", seed], made["window", seed]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert all(torch.equal(p, q) for p, q in zip(xa, xb))
    assert not torch.equal(made["fp32", 7][1][0], made["fp32", 8][1][0])


def test_the_positive_control_is_its_own_function_with_a_scaled_learning_rate(tiny_study):
    """lr_scale (the quality verdicts' positive control): another function, named so, whose
    optimizer steps at the scaled learning rate through warm-up and schedule."""
    from memopt.config import validate_config
    from memopt.runtime.functions import function_of, functions, quality_spec
    from memopt.runtime.step import lr_at, prepare, train_step

    techniques = validate_config({"techniques": {"flash": {"precision": "bf16"},
                                                 "slow": {"precision": "bf16", "lr_scale": 0.5}},
                                  "baseline": "flash"})["techniques"]  # fmt: skip
    assert function_of(techniques["slow"]) == "bf16_lr0.5" and len(functions(techniques)) == 2
    assert quality_spec(techniques, "bf16_lr0.5")["lr_scale"] == 0.5
    cfg, data = tiny_study
    for name, scale in (("flash", 1.0), ("slow", 0.5)):
        spec = {**techniques[name], "precision": "fp32"}
        applied, opt, batches = prepare(cfg, spec, data, 4, "cpu", 1)
        for step in range(3):
            train_step(applied, opt, *batches.next(), step, cfg["train"])
            assert {g["lr"] for g in opt.param_groups} == {lr_at(step, cfg["train"]) * scale}
    from memopt.errors import ConfigError

    with pytest.raises(ConfigError, match="lr_scale"):
        validate_config({"techniques": {"x": {"lr_scale": 0}}, "baseline": "x"})


def test_a_positive_control_is_judged_but_never_recommended():
    from memopt.report.paper_analysis import _as_good_as_the_best
    from memopt.report.verdicts import quality_table

    techniques = {
        "flash": {"precision": "bf16", "window": None, "attention": "flash"},
        "slow": {"precision": "bf16", "window": None, "attention": "flash", "lr_scale": 0.5},
        "w": {"precision": "bf16", "window": 32, "attention": "flex"},
    }
    runs = [{"function": f, "seed": s, "status": "ok", "val_loss": v, "val_ppl": 1.0,
             "kernel": "k", "tokens": 1}
            for f, vals in (("bf16", (5.00, 5.10, 5.05, 5.02)), ("bf16_lr0.5", (5.20, 5.31, 5.24, 5.23)),
                            ("bf16_w32", (5.30, 5.41, 5.35, 5.31)))
            for s, v in zip(range(4), vals)]  # fmt: skip
    q = quality_table(runs, techniques, "flash")
    rows = {r["function"]: r for r in q["rows"]}
    assert rows["bf16_lr0.5"]["control"] and not rows["bf16_w32"]["control"]
    assert rows["bf16_lr0.5"]["verdict"] == "worse" and rows["bf16_w32"]["verdict"] == "worse"
    assert _as_good_as_the_best(q) == {"bf16"}  # the control is no technique to use
    rows["bf16_w32"]["verdict"] = "inconclusive"  # not detectably worse: eligible
    assert _as_good_as_the_best(q) == {"bf16", "bf16_w32"}


def test_the_family_check_names_a_verdict_that_stays_but_only_narrowly():
    """_family's `narrow`: a better verdict that survives the correction with its interval's
    nearer end within the margin of 0 is named (the H200 quality study's `bf16_w32`:
    -0.138 to -0.002); one far from 0, and verdicts that change, are not."""
    from memopt.report.quality_paper import _family

    losses = {"ref": [5.0, 5.1, 5.2, 5.3], "near": [4.95, 5.07, 5.14, 5.26],
              "far": [4.5, 4.61, 4.69, 4.8]}  # fmt: skip
    runs = [{"function": f, "seed": s, "val_loss": v, "status": "ok"}
            for f, vs in losses.items() for s, v in enumerate(vs)]  # fmt: skip
    rows = []
    for f in ("near", "far"):
        v = paired_verdict(paired_differences(runs, f, "ref"), 0.02)
        rows.append({"function": f, "verdict": v["verdict"], "paired": v})
    assert [r["verdict"] for r in rows] == ["better", "better"]
    ctx = {"quality": {"rows": rows, "reference_function": "ref", "margin": 0.02},
           "quality_runs": runs}  # fmt: skip
    family = _family(ctx)
    assert family["changed"] == [] and family["narrow"]["function"] == "near"
    assert -0.02 < family["narrow"]["hi"] < 0
    runs = [r for r in runs if r["function"] != "near"]
    ctx["quality"]["rows"], ctx["quality_runs"] = rows[1:], runs
    assert _family(ctx)["narrow"] is None
