"""The `block` knob (memopt.runtime.blocks): a technique trains the study's shape with another
block, as another function, judged in the quality verdicts but never recommended."""

import math
from pathlib import Path

import pytest
import torch

from memopt.config import validate_config
from memopt.errors import ConfigError
from memopt.runtime.blocks import technique_model
from memopt.runtime.flops import param_count

GPT2 = {"arch": "gpt2", "n_layers": 12, "d_model": 768, "n_heads": 12, "n_kv_heads": None,
        "d_ff": 3072, "seq_len": 1024, "dropout": 0.1}  # fmt: skip


def test_the_other_block_keeps_the_shape_and_about_the_parameters():
    llama = technique_model(GPT2, {"block": "llama"})
    assert llama == {**GPT2, "arch": "llama", "d_ff": 2048}  # SwiGLU: 3 x 2,048 = 2 x 3,072
    # GPT-2's learned positions and biases are what differs: under 1% of 110M
    assert abs(param_count(llama, 32000) / param_count(GPT2, 32000) - 1) < 0.01
    back = technique_model({**llama, "n_kv_heads": 4}, {"block": "gpt2"})
    assert back == GPT2  # the grouped key/value heads stay with the Llama block
    for unset in ({}, {"block": None}, {"block": math.nan}, {"block": "gpt2"}):  # NaN: a CSV's
        assert technique_model(GPT2, unset) is GPT2


def test_a_llama_block_technique_trains_its_own_model_on_the_same_batches(tiny_study):
    from memopt.runtime.step import prepare, train_step

    cfg, data = tiny_study
    techniques = validate_config(
        {"techniques": {"gpt2": {}, "llama": {"block": "llama"}}, "baseline": "gpt2"}
    )["techniques"]
    made = {}
    for name, spec in techniques.items():
        applied, opt, batches = prepare(cfg, spec, data, 4, "cpu", 7)
        made[name] = applied.model, [batches.next()[0].clone() for _ in range(3)]
        loss = train_step(applied, opt, *batches.next(), 0, cfg["train"])
        assert math.isfinite(float(loss))
    gpt2, llama = made["gpt2"][0], made["llama"][0]
    assert not gpt2.llama and llama.llama and llama.pos is None
    assert llama.blocks[0].fc_proj.in_features == round(2 * 64 / 3)  # the tiny model's d_ff 64
    assert all(torch.equal(a, b) for a, b in zip(made["gpt2"][1], made["llama"][1]))


def test_a_block_the_rotary_embedding_cannot_turn_is_refused():
    with pytest.raises(ConfigError) as e:
        validate_config({"model": {"d_model": 30, "n_heads": 2}, "baseline": "x",
                         "techniques": {"x": {}, "odd": {"block": "llama"}}})  # fmt: skip
    assert "odd.block: 'llama'" in str(e.value) and "odd head dimension" in str(e.value)
    with pytest.raises(ConfigError, match="block"):
        validate_config({"techniques": {"x": {"block": "mamba"}}, "baseline": "x"})


def test_a_block_that_is_the_models_own_is_refused():
    """It would run the same model under another function's name (its own quality runs, its own
    exactness reference, out of the recommendations): null says 'the model's block'."""
    with pytest.raises(ConfigError, match=r"same.block: 'gpt2' is model's own block .*allowed: "
                                          r"null or 'llama'"):  # fmt: skip
        validate_config({"techniques": {"x": {}, "same": {"block": "gpt2"}}, "baseline": "x"})
    from memopt.config import load_config_file

    cfg = load_config_file(Path(__file__).resolve().parents[1] / "config" / "map.yaml")
    cfg["techniques"]["llama"] = {"precision": "bf16", "block": "llama"}  # gpt2 and llama points
    with pytest.raises(ConfigError, match=r"map.models \(llama_128m_1024\)'s own block"):
        validate_config(cfg)


def test_another_block_is_another_function_judged_but_never_recommended():
    from memopt.report.paper_analysis import _as_good_as_the_best
    from memopt.report.verdicts import quality_table
    from memopt.runtime.functions import function_of

    techniques = {
        "flash": {"precision": "bf16", "window": None, "attention": "flash"},
        "llama": {"precision": "bf16", "window": None, "attention": "flash", "block": "llama"},
    }
    assert function_of(techniques["llama"]) == "bf16_llama"
    runs = [{"function": f, "seed": s, "status": "ok", "val_loss": v, "val_ppl": 1.0,
             "kernel": "k", "tokens": 1}
            for f, vals in (("bf16", (5.00, 5.10, 5.05, 5.02)), ("bf16_llama", (4.90, 5.00, 4.94, 4.93)))
            for s, v in zip(range(4), vals)]  # fmt: skip
    q = quality_table(runs, techniques, "flash")
    rows = {r["function"]: r for r in q["rows"]}
    assert rows["bf16_llama"]["verdict"] == "better" and rows["bf16_llama"]["another_model"]
    assert not rows["bf16"]["another_model"]
    assert _as_good_as_the_best(q) == {"bf16"}  # better, but another model: not a technique


def test_the_plan_predicts_the_block_a_technique_trains():
    from memopt.plan.memory import terms
    from memopt.plan.speed import speed_key

    gpt2, llama = ({"precision": "bf16", "attention": "flash", "block": b} for b in (None, "llama"))
    a, b = terms(GPT2, 32000, gpt2), terms(GPT2, 32000, llama)
    assert (a["arch"], b["arch"]) == ("gpt2", "llama") and a["fixed"] != b["fixed"]
    assert speed_key(llama) == speed_key(gpt2)  # the block is in the model, not the knobs
