"""Config validation: defaults, the study files, and errors that name the key, value and allowed."""

import os
import pickle
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from memopt import knobs
from memopt.config import (
    SCHEMA_PATH,
    Params,
    canonical,
    empty_overrides,
    load_config_file,
    load_schema,
    validate_config,
)
from memopt.errors import ConfigError

BASE = {"techniques": {"baseline": {}}}
ROOT = Path(__file__).resolve().parents[1]
ROOT_CONFIGS = [ROOT / "config.yaml", *sorted((ROOT / "config").glob("*.yaml"))]


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
        "arch": "gpt2",
        "n_kv_heads": None,
        "rope_theta": 10000.0,
    }
    assert cfg["tokenizer"]["vocab_size"] == 32000
    assert (cfg["train"]["lr"], cfg["train"]["grad_clip"]) == (5e-4, 1.0)
    # Protocol v2: adaptive timing, quality runs per function, exactness runs.
    assert (cfg["measure"]["target_rel_ci"], cfg["measure"]["min_timed_steps"]) == (0.01, 10)
    assert (cfg["measure"]["max_timed_steps"], cfg["measure"]["max_timed_s"]) == (100, 15)
    assert cfg["quality"] == {
        "tokens": 7_000_000,
        "batch": 32,
        "seeds": 2,
        "margin": 0.02,  # issue 35: the equivalence margin of the paired verdicts
        "position_buckets": [64, 128, 512],  # and the loss by position
    }  # docs/protocol.md, "Study time"
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
    # every knob at its default (memopt.knobs, written once there); a few spelled out
    assert cfg["techniques"]["baseline"] == knobs.defaults()
    assert knobs.defaults()["precision"] == "fp32" and knobs.defaults()["loss_chunk"] == 4096
    assert (
        list(knobs.defaults()) == [k.name for k in knobs.KNOBS]
        and knobs.defaults()["window"] is None
    )


def test_the_knob_registry_is_the_schemas_technique_part():
    """A knob's doc, values and default live in memopt.knobs; the schema file holds none of them,
    and every default is a value its own schema allows."""
    raw = yaml.safe_load(SCHEMA_PATH.read_text())
    assert raw["properties"]["techniques"]["additionalProperties"]["properties"] == {}
    technique = load_schema()["properties"]["techniques"]["additionalProperties"]
    assert list(technique["properties"]) == [k.name for k in knobs.KNOBS]
    for knob in knobs.KNOBS:
        jsonschema.validate(knob.default, knob.schema())
        assert knob.doc and knob.group
    assert knobs.function_knobs() == ("precision", "window", "optimizer", "lr_scale", "block")


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
        # Combinations (docs/configuration.md, "What is checked, and when"): both keys named.
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
        # Issue 31: what JSON Schema lets through. NaN and inf pass every range check...
        ({"train": {"lr": float("nan")}}, ["train.lr: nan is not allowed", "a finite number"]),
        ({"train": {"lr": ".nan"}}, ["train.lr: nan is not allowed", "a finite number"]),
        ({"search": {"memory_budget_gib": float("inf")}}, ["search.memory_budget_gib: inf"]),
        # ... 2.0 counts as an integer ...
        ({"model": {"n_layers": 2.0}}, ["model.n_layers: 2.0 is not allowed", "(write 2)"]),
        ({"quality": {"seeds": 2.0}}, ["quality.seeds: 2.0 is not allowed", "an integer"]),
        ({"batch_sizes": ["same", 8.0]}, ["batch_sizes[1]: 8.0 is not allowed", "(write 8)"]),
        # ... `$` matches before a trailing newline ...
        ({"corpus": {"dataset": "eltec\n"}}, ["corpus.dataset: 'eltec\\n' is not allowed"]),
        (
            {"techniques": {"flash\n": {}}, "baseline": "flash\n"},
            ["technique name 'flash\\n' is not allowed", "at most 64 characters"],
        ),
        # ... and a name becomes a file name (Snakemake: "File name too long").
        (
            {"techniques": {"t" * 300: {}}, "baseline": "t" * 300},
            ["technique name 'tttttttttttttttttttt'... (300 characters)", "at most 64"],
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


def test_one_message_per_bad_value():
    """A value our own check refuses is not refused a second time by the schema."""
    with pytest.raises(ConfigError) as err:
        validate_config({**BASE, "model": {"n_layers": float("nan")}})
    assert str(err.value) == "model.n_layers: nan is not allowed; allowed: a finite number"


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not UTF-8 text"),
        (b"- a\n- list\n", "holds a list; allowed: a YAML mapping"),
        (b"techniques: [\n", "cannot read config file"),
    ],
)
def test_a_config_file_that_is_not_a_mapping(tmp_path, content, fragment):
    path = tmp_path / "study.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_config_file(path)


def test_params_compare_in_canonical_form():
    """Snakemake reruns a job when repr(param) changed (issue 31, finding 2)."""
    a = Params({"model": {"n_layers": 2, "d_model": 32}, "train": {"grad_clip": 1.0}})
    b = Params({"train": {"grad_clip": 1}, "model": {"d_model": 32, "n_layers": 2}})
    assert repr(a) == repr(b)
    assert repr(a) != repr(Params({"model": {"n_layers": 3, "d_model": 32}, "train": {}}))
    assert list(b["model"]) == ["d_model", "n_layers"] and b["train"]["grad_clip"] == 1
    # The job's script gets a plain dict (it unpickles without memopt on its path).
    assert type(pickle.loads(pickle.dumps(a))) is dict and pickle.loads(pickle.dumps(a)) == a
    assert canonical({"b": [{"y": 2.0, "x": 0.5}], "a": True}) == {
        "a": True,
        "b": [{"x": 0.5, "y": 2}],
    }
    # Snakemake keeps the repr in .snakemake/metadata and prints it: no password in it.
    secret = Params({"corpus": {"mirror": "https://reader:hunter2@example.org/sl/"}})
    assert "hunter2" not in repr(secret) and "hunter2@" in secret["corpus"]["mirror"]


def test_empty_config_overrides_are_named():
    assert empty_overrides({"techniques": {}}) == ["techniques"]
    assert empty_overrides({"model": {"n_layers": 2}, "search": {"x": {}}}) == ["search.x"]
    assert empty_overrides({"model": {"n_layers": 2}}) == []


def test_every_knob_undo_names_a_function():
    """The worker calls each knob's undo between jobs: each names a function that exists."""
    import importlib

    assert knobs.undo_calls(), "no knob undoes anything: the worker would restore nothing"
    for call in knobs.undo_calls():
        module, _, name = call.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), call


@pytest.mark.slow
def test_an_installed_package_validates_outside_the_checkout(tmp_path):
    """`pip install .` (a wheel, not editable): the schema ships inside it, so a config is
    validated and `memopt --help` runs from a folder that is not the checkout."""
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(root)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("memopt-*.whl")
    site, work = tmp_path / "site", tmp_path / "elsewhere"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "memopt" / "config.schema.yaml").is_file()
    work.mkdir()
    (work / "study.yaml").write_text((root / "config" / "smoke.yaml").read_text())
    env = dict(os.environ, PYTHONPATH=str(site))
    run = [sys.executable, "-c", "import memopt, sys; sys.argv[0] = 'memopt'; "
           "print(memopt.__file__); from memopt.run.cli import main; main()"]  # fmt: skip
    out = subprocess.run([*run, "validate", "--config", "study.yaml"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(site)) and "study.yaml: valid (study 'smoke'" in out.stdout
    help_ = subprocess.run([*run, "--help"], cwd=work, env=env, capture_output=True, text=True)
    assert help_.returncode == 0 and "validate" in help_.stdout


def test_the_long_quality_study_has_what_issue_35_asks():
    """config/quality.yaml: at least 4 seeds and 30M tokens per run, the functions the issue names
    (a TF32 reference, BF16, windows 128 and 32, 8-bit AdamW, FP16, FP8, the Llama block in BF16)
    and a positive control."""
    from memopt.runtime.functions import functions

    cfg = validate_config(load_config_file(ROOT / "config" / "quality.yaml"))
    assert cfg["quality"]["seeds"] >= 4 and cfg["quality"]["tokens"] >= 30_000_000
    assert cfg["train"]["eval_sequences"] >= 256 and cfg["quality"]["margin"] > 0
    assert list(functions(cfg["techniques"])) == [
        "tf32", "bf16", "bf16_w128", "bf16_w32", "bf16_adamw8bit", "fp16", "fp8", "bf16_lr0.5",
        "bf16_llama"]  # fmt: skip
    assert cfg["baseline"] == "tf32" and cfg["study"] == "quality"
