"""The llama block (model.arch llama): its parameter count and FLOPs by hand, rotary positions,
grouped-query attention in every CPU kernel, impossible shapes refused, and every knob that
runs on a CPU exact on it as on the GPT-2 block (exactness runs against the plain technique)."""

from __future__ import annotations

import pytest
import torch
from conftest import write_random_tokens

from memopt.config import full_spec, validate_config
from memopt.errors import ConfigError
from memopt.report.verdicts import exactness
from memopt.runtime import attention
from memopt.runtime.flops import flops_per_token, param_count
from memopt.runtime.model import ModelConfig, build_model, n_params, rotary_tables, rotate

LLAMA = dict(vocab_size=97, n_layers=3, d_model=32, n_heads=4, d_ff=48, seq_len=16,
             dropout=0.1, arch="llama", n_kv_heads=2)  # fmt: skip


def test_param_count_by_hand():
    d, f, v, n, kv_dim = 32, 48, 97, 3, 2 * 8  # 2 key/value heads of dimension 32 / 4
    per_layer = d * d + 2 * d * kv_dim + d * d + 3 * d * f + 2 * d  # q, k v, out, SwiGLU, norms
    expected = v * d + n * per_layer + d  # tied head; a final RMSNorm; no biases, no positions
    assert n_params(build_model(ModelConfig(**LLAMA), 0, "cpu")) == expected
    assert param_count(LLAMA, 97) == expected
    gpt2 = {**LLAMA, "arch": "gpt2", "n_kv_heads": None}
    assert param_count(gpt2, 97) == n_params(build_model(ModelConfig(**gpt2), 0, "cpu"))


def test_flops_count_the_smaller_key_value_projections():
    d, f, L, v = 32, 48, 3, 97
    per_block = 2 * d * d + 2 * d * 16 + 3 * d * f
    attention_term = 12 * L * d * (16 + 1) / 2  # causal: (T + 1) / 2 keys per query
    assert flops_per_token(LLAMA, v, None) == 6 * (L * per_block + d * v) + attention_term
    mha = {**LLAMA, "n_kv_heads": None}
    assert flops_per_token(mha, v, None) - flops_per_token(LLAMA, v, None) == 6 * L * 2 * d * 16


def test_rotary_scores_depend_only_on_the_offset():
    cos, sin = rotary_tables(40, 8, 10000.0, "cpu")
    q, k = torch.randn(1, 1, 1, 8).double(), torch.randn(1, 1, 1, 8).double()

    def score(i, j):
        return (rotate(q, cos[i], sin[i]) * rotate(k, cos[j], sin[j])).sum().item()

    assert score(5, 2) == pytest.approx(score(30, 27), rel=1e-6)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)
    assert torch.equal(rotate(q, cos[0], sin[0]), q)  # position 0: no turn


@pytest.mark.parametrize("window", [None, 5])
def test_grouped_query_attention_shares_each_key_value_head(window):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=g)
    k, v = torch.randn(2, 2, 16, 8, generator=g), torch.randn(2, 2, 16, 8, generator=g)
    out = attention.math_attention(q, k, v, window)
    for h in range(4):  # query heads 0, 1 use key/value head 0; 2, 3 use head 1
        one = attention.math_attention(q[:, h : h + 1], k[:, h // 2 : h // 2 + 1],
                                       v[:, h // 2 : h // 2 + 1], window)  # fmt: skip
        torch.testing.assert_close(out[:, h : h + 1], one)
    if window is None:  # PyTorch's SDPA on the CPU, with its own grouped-query path
        torch.testing.assert_close(attention.flash_attention(q, k, v), out, rtol=1e-5, atol=1e-6)


def test_flash_attn_gets_the_key_value_heads_as_they_are(monkeypatch):
    """The flash-attn adapter (FA2 path, a stand-in here) passes k and v with their own head
    count: flash-attn shares them itself."""
    import sys
    import types

    seen = {}

    def flash_attn_func(q, k, v, dropout_p, causal, window_size):
        seen.update(q=q.shape, k=k.shape, window=window_size)
        return q

    stand_in = types.ModuleType("flash_attn")
    stand_in.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", stand_in)
    monkeypatch.setattr(attention, "flash_attn_impl", lambda: "FA2")
    monkeypatch.setattr(attention, "_module_present", lambda name: True)
    q, k = torch.zeros(2, 4, 16, 8), torch.zeros(2, 2, 16, 8)
    attention.flash_attn_attention(q, k, k, 5)
    assert seen == {"q": (2, 16, 4, 8), "k": (2, 16, 2, 8), "window": (4, 0)}


@pytest.mark.parametrize(
    "model, fragment",
    [
        ({"n_kv_heads": 3}, "model.n_kv_heads: 3 does not divide model.n_heads (4)"),
        ({"n_heads": 8, "d_model": 24}, "odd head dimension (24 / 8 = 3)"),
        ({"arch": "gpt2", "n_kv_heads": 2}, "model.n_kv_heads: 2 is not allowed with model.arch 'gpt2'"),
    ],
)  # fmt: skip
def test_impossible_shapes_are_refused(model, fragment):
    base = {"arch": "llama", "n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "seq_len": 32}
    with pytest.raises(ConfigError) as err:
        validate_config({"model": {**base, **model}, "techniques": {"baseline": {}}})
    assert fragment in str(err.value)


# Every knob that runs on a CPU and keeps the function: its exactness run against the plain
# technique's, as the protocol checks them (FP32: at most 1e-4 nats apart at any step).
SAME_FUNCTION = {
    "flash": {"attention": "flash"},
    "ckpt_full": {"checkpointing": "full"},
    "ckpt_every_k": {"checkpointing": "every_k"},
    "ckpt_selective": {"checkpointing": "selective"},
    "chunked": {"loss": "chunked", "loss_chunk": 24},
    "in_backward": {"optimizer_in_backward": True},
}
# Exact without dropout only: micro-batches draw other dropout masks than one batch, and a
# compiled graph draws its own (inductor's random numbers).
WITHOUT_DROPOUT = {"accum": {"grad_accum": 2}}
COMPILED = {"compiled": {"compile": True, "checkpointing": "full"}}  # ~40 s on a CPU


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    from memopt.data.tokens import TokenData

    data = TokenData(write_random_tokens(tmp_path_factory.mktemp("tokens")))

    def study(arch: str, dropout: float, techniques: dict) -> dict:
        block = {"arch": "llama", "n_kv_heads": 1} if arch == "llama" else {}
        block["dropout"] = dropout
        return validate_config({
            "device": "cpu",
            "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 32, **block},
            "train": {"warmup_steps": 2, "grad_clip": 0.0},  # optimizer_in_backward needs none
            "search": {"cpu_memory_budget_gib": 8 / 1024},
            "exactness": {"steps": 4, "batch": 2, "tolerance": {"fp32": 1e-4, "tf32": 0.02, "bf16": 0.05}},
            "techniques": {"plain": {}, **techniques},
            "baseline": "plain",
        })  # fmt: skip

    # Dropout on: checkpointing must replay the masks.
    cfgs = {}
    for arch in ("gpt2", "llama"):
        cfgs[arch] = study(arch, 0.1, SAME_FUNCTION)
        cfgs[f"{arch}_no_dropout"] = study(arch, 0.0, WITHOUT_DROPOUT)
        cfgs[f"{arch}_compiled"] = study(arch, 0.0, COMPILED)
    return cfgs, data


@pytest.mark.parametrize(
    "arch",
    ["gpt2", "llama", "gpt2_no_dropout", "llama_no_dropout"]
    + [pytest.param(f"{a}_compiled", marks=pytest.mark.slow) for a in ("gpt2", "llama")],
)
def test_every_cpu_knob_is_exact_on_both_blocks(studies, arch):
    from memopt.jobs.quality import run_exactness

    cfgs, data = studies
    cfg = cfgs[arch]
    records = [run_exactness(cfg, name, data, "cpu") for name in cfg["techniques"]]
    check = exactness(records, cfg["techniques"], cfg["exactness"]["tolerance"])
    assert check["holds"], [(r["technique"], r["max_abs_diff"]) for r in check["rows"]][-3:]
    assert len(check["rows"]) == len(cfg["techniques"]) >= 2
    losses = {r["technique"]: r["losses"] for r in records}
    assert losses["plain"][0] != losses["plain"][-1]  # it trained


@pytest.mark.parametrize(
    "knobs",
    [{"precision": "bf16"}, {"window": 8}, {"optimizer": "adafactor"}, {"optimizer": "sgd"}],
)
def test_function_changing_knobs_train_the_llama_block(studies, knobs):
    from memopt.jobs.quality import run_exactness

    cfgs, data = studies
    cfg = {**cfgs["llama"], "techniques": {"t": full_spec(knobs)}}
    losses = run_exactness(cfg, "t", data, "cpu")["losses"]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] + 0.5
