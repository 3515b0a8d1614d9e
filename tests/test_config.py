"""Config validation: defaults, the study files, and errors that name the key, value and allowed."""

import pytest

from memopt.config import ROOT_CONFIGS, load_config_file, validate_config
from memopt.errors import ConfigError

BASE = {"techniques": {"baseline": {}}}


@pytest.mark.parametrize("name", ROOT_CONFIGS)
def test_shipped_studies_validate(name):
    cfg = validate_config(load_config_file(name))
    assert cfg["baseline"] in cfg["techniques"]


def test_default_study_matches_the_issue():
    cfg = validate_config(load_config_file(ROOT_CONFIGS[0]))
    assert cfg["corpus"]["dataset"] == "wolne_lektury_corpus"
    assert cfg["model"] == {
        "n_layers": 12,
        "d_model": 768,
        "n_heads": 12,
        "d_ff": 3072,
        "seq_len": 1024,
        "dropout": 0.1,
    }
    assert cfg["tokenizer"]["vocab_size"] == 32000
    assert (cfg["train"]["lr"], cfg["train"]["grad_clip"]) == (5e-4, 1.0)
    # Protocol v2: adaptive timing, quality runs per function, exactness runs.
    assert (cfg["measure"]["target_rel_ci"], cfg["measure"]["min_timed_steps"]) == (0.01, 10)
    assert (cfg["measure"]["max_timed_steps"], cfg["measure"]["max_timed_s"]) == (100, 15)
    assert cfg["quality"] == {"tokens": 7_000_000, "batch": 32, "seeds": 2}  # README, "Study time"
    assert (cfg["exactness"]["steps"], cfg["exactness"]["tolerance"]["bf16"]) == (50, 0.05)
    assert set(cfg["techniques"]) == {
        "baseline",
        "tf32",  # issue 15: the TF32 reference
        "flash",
        "local128",
        # Issue 12: the logits, the optimizer state, offloading, compilation.
        "flash_gradcp_chunked",
        "offload",
        "compiled",
        "adamw8bit",
    }
    assert cfg["techniques"]["flash_gradcp_chunked"]["loss"] == "chunked"
    assert cfg["techniques"]["offload"]["offload"] == "activations"
    assert cfg["techniques"]["offload"]["checkpointing"] == "full"  # only checkpoints go to host
    assert cfg["techniques"]["compiled"]["compile"] is True
    assert cfg["techniques"]["adamw8bit"]["optimizer"] == "adamw8bit"
    assert cfg["techniques"]["local128"]["window"] == 128
    assert cfg["batch_sizes"] == ["same", "max"]


def test_defaults_fill_nested_and_per_technique():
    cfg = validate_config(BASE)
    assert cfg["device"] == "cuda"
    assert cfg["measure"]["warmup_steps"] == 3 and cfg["quality"]["seeds"] == 2
    assert cfg["techniques"]["baseline"] == {
        "precision": "fp32",
        "attention": "math",
        "window": None,
        "checkpointing": "none",
        "checkpoint_every": 2,
        "compile": False,
        "loss": "standard",
        "loss_chunk": 4096,
        "optimizer": "adamw",
        "optimizer_in_backward": False,
        "offload": "none",
        "compile_memory_budget": None,
        "grad_accum": 1,
        "parallel": "none",
        "shard": "none",
        "gpus": 1,
    }


@pytest.mark.parametrize(
    "override, fragments",
    [
        (
            {"techniques": {"baseline": {"precison": "fp32"}}},
            ["unknown key 'precison'", "techniques.baseline", "allowed:", "precision"],
        ),
        (
            {"techniques": {"baseline": {"precision": "fp4"}}},
            ["techniques.baseline.precision", "'fp4'", "'bf16'"],
        ),
        (
            {"techniques": {"baseline": {"window": 4096}}},
            ["techniques.baseline.window", "4096", "model.seq_len", "1..1024"],
        ),
        ({"measure": {"min_timed_steps": -3}}, ["measure.min_timed_steps", "-3", ">= 2"]),
        ({"corpus": {"source": "ftp"}}, ["corpus.source", "'ftp'", "'mirror'"]),
        ({"corpus": {"source": "mirror"}}, ["corpus.mirror", "mirror"]),
        # Issue 14: a dataset name is never a path (the mirror lookup would build one from it).
        (
            {"corpus": {"dataset": "../../etc/passwd"}},
            ["corpus.dataset", "'../../etc/passwd'", "matching", "[A-Za-z0-9_-]"],
        ),
        ({"gpu_model": "h100 --x"}, ["gpu_model", "'h100 --x'", "matching"]),
        ({"batch_sizes": ["same", "huge"]}, ["batch_sizes[1]", "'huge'", "'max'"]),
        ({"model": {"n_heads": 5}}, ["model.n_heads", "5", "divisor of 768"]),
        ({"colour": "red"}, ["unknown key 'colour'", "allowed:", "techniques"]),
        ({"baseline": "nope"}, ["baseline", "'nope'"]),
        (
            {"techniques": {"baseline": {"attention": "flash", "window": 8}}},
            ["techniques.baseline.attention", "'flash'", "flex"],
        ),
        # Combinations (README, "What is checked, and when"): both keys named.
        (
            {"measure": {"min_timed_steps": 50, "max_timed_steps": 20}},
            ["measure.min_timed_steps: 50", "measure.max_timed_steps (20)", "<= 20"],
        ),
        (
            {"techniques": {"baseline": {"loss": "liger", "precision": "fp16"}}},
            ["techniques.baseline.loss: 'liger'", "techniques.baseline.precision 'fp16'", "cce"],
        ),
        (
            {"techniques": {"baseline": {"compile_memory_budget": 0.5}}},
            ["techniques.baseline.compile_memory_budget: 0.5", "compile true"],
        ),
        (
            {"techniques": {"baseline": {"grad_accum": 16}}},
            ["techniques.baseline.grad_accum: 16", "exactness.batch (8)", "allowed: 1..8"],
        ),
        (
            {
                "train": {"grad_clip": 0},
                "techniques": {"baseline": {"optimizer_in_backward": True, "grad_accum": 2}},
            },
            ["optimizer_in_backward: true", "techniques.baseline.grad_accum 2", "grad_accum 1"],
        ),
    ],
)
def test_bad_values_name_key_value_and_allowed(override, fragments):
    raw = {**BASE, **override}
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_strings_from_snakemake_config_overrides_are_coerced():
    # `--config "search={'memory_budget_gib': 0.5}"` reaches the Snakefile with '0.5' (BaseLoader).
    cfg = validate_config(
        {
            **BASE,
            "search": {"memory_budget_gib": "0.5", "max_batch": "64"},
            "corpus": {"mirror": "null"},
            "batch_sizes": ["same", "16"],
            "techniques": {"baseline": {"window": "8", "compile": "false"}},
        }
    )
    assert cfg["search"]["memory_budget_gib"] == 0.5 and cfg["search"]["max_batch"] == 64
    assert cfg["corpus"]["mirror"] is None and cfg["batch_sizes"] == ["same", 16]
    assert cfg["techniques"]["baseline"]["window"] == 8
    assert cfg["techniques"]["baseline"]["compile"] is False
    with pytest.raises(ConfigError, match="quality.seeds: 'many'"):
        validate_config({**BASE, "quality": {"seeds": "many"}})
