"""The refusal of every impossible combination of knobs before any training, and what each
is allowed with."""

import pytest
import torch
import torch.nn.functional as F

from memopt.config import ConfigError, validate_config


def _refused(knobs: dict, **config) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config({"techniques": {"t": knobs}, "baseline": "t", **config})
    return str(err.value)


@pytest.mark.parametrize(
    "knobs, config, fragments",
    [
        (
            {"compile_memory_budget": 0.5},
            {},
            ["techniques.t.compile_memory_budget: 0.5", "techniques.t.compile true"],
        ),
        ({"compile": True, "compile_memory_budget": 1.5}, {}, ["compile_memory_budget", "1.5"]),
        ({"precision": "fp8"}, {"device": "cpu"}, ["techniques.t.precision: 'fp8'", "'cpu'"]),
        ({"offload": "activations"}, {"device": "cpu"}, ["techniques.t.offload", "'cpu'"]),
        ({"loss": "liger"}, {"device": "cpu"}, ["techniques.t.loss: 'liger'", "Triton"]),
        ({"loss": "cce"}, {"device": "cpu"}, ["techniques.t.loss: 'cce'", "Triton"]),
        (
            {"optimizer_in_backward": True},
            {},
            ["techniques.t.optimizer_in_backward", "train.grad_clip 1.0", "global clipping"],
        ),
        (
            {"optimizer_in_backward": True, "grad_accum": 2},
            {"train": {"grad_clip": 0}},
            ["techniques.t.optimizer_in_backward", "techniques.t.grad_accum 2", "micro-batch"],
        ),
        (
            {"optimizer_in_backward": True, "precision": "fp16"},
            {"train": {"grad_clip": 0}},
            ["techniques.t.optimizer_in_backward", "techniques.t.precision 'fp16'", "scaling"],
        ),
        (
            {"grad_accum": 16},
            {},
            ["techniques.t.grad_accum: 16", "exactness.batch (8)", "allowed: 1..8"],
        ),
        ({"grad_accum": 0}, {}, ["techniques.t.grad_accum: 0 is not allowed", ">= 1"]),
        (
            {"loss": "liger", "precision": "fp16"},
            {},
            ["techniques.t.loss: 'liger'", "techniques.t.precision 'fp16'", "underflows"],
        ),
        ({"offload": "gpu"}, {}, ["techniques.t.offload", "'activations'"]),
        # Issue 14: kernels that cannot run on the configured device, refused before the DAG.
        (
            {"precision": "fp32", "attention": "flash"},
            {"device": "cuda"},
            ["techniques.t.attention: 'flash'", "precision 'fp32'", "'cuda'", "FP16/BF16"],
        ),
        (
            {"precision": "tf32", "attention": "cudnn"},
            {"device": "cuda"},
            ["techniques.t.attention: 'cudnn'", "precision 'tf32'", "allowed with tf32: math"],
        ),
        (
            {"precision": "fp32", "attention": "efficient"},
            {"device": "cpu"},
            ["techniques.t.attention: 'efficient'", "'cpu'", "allowed on a CPU: math, flash"],
        ),
        (
            {"attention": "flex", "window": 8},
            {"device": "cpu"},
            ["techniques.t.attention: 'flex'", "'cpu'"],
        ),
    ],
)
def test_impossible_combinations_are_refused_before_any_training(knobs, config, fragments):
    message = _refused(knobs, **config)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_the_same_knobs_are_allowed_where_they_can_run():
    validate_config(
        {
            "device": "cuda",
            "train": {"grad_clip": 0},
            "techniques": {
                "a": {"precision": "fp8", "offload": "activations", "loss": "cce"},
                "b": {"compile": True, "compile_memory_budget": 0.5, "loss": "liger"},
                "c": {"optimizer_in_backward": True, "precision": "bf16"},
                "d": {"grad_accum": 8, "precision": "fp16"},
            },
            "baseline": "a",
        }
    )


def test_config_knows_the_16bit_precisions_and_the_cpu_kernels():
    """memopt.config_rules and the knob registry state, without importing torch, what
    memopt.runtime.precision and the CPU's SDPA backends say: keep them in step."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from memopt import config_rules, knobs
    from memopt.runtime.precision import AUTOCAST_DTYPES

    assert set(config_rules._SIXTEEN_BIT) == set(AUTOCAST_DTYPES)
    q = torch.randn(1, 2, 8, 16)
    for name, backend in (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):  # fmt: skip
        assert name in knobs.BY_NAME["attention"].gpu_only
        with pytest.raises(RuntimeError), sdpa_kernel([backend]):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # allowed on a CPU, also in FP32
        F.scaled_dot_product_attention(q, q, q, is_causal=True)


@pytest.mark.parametrize(
    "other", [{"grad_accum": 2}, {"offload": "activations"}, {"parallel": "ddp", "gpus": 2}]
)
def test_cuda_graph_modes_are_refused_with_what_they_are_not_measured_with(other):
    techniques = {"a": {"compile": True, "compile_mode": "reduce-overhead", **other}}
    with pytest.raises(ConfigError, match=r"compile_mode: 'reduce-overhead' is not allowed with"):
        validate_config({"techniques": techniques, "baseline": "a"})
    techniques["a"]["compile_mode"] = "max-autotune-no-cudagraphs"  # no graphs: allowed
    validate_config({"techniques": techniques, "baseline": "a"})
