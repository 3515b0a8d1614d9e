"""The map study (config key `map`): its points, their shapes checked at load, its DAG, its table,
and (pytest -m slow) a tiny map trained end to end on the CPU through Snakemake."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memopt.config import load_config_file, validate_config
from memopt.errors import ConfigError
from memopt.map_points import map_points, point_models, point_study
from memopt.report.map_results import map_row

ROOT = Path(__file__).resolve().parents[1]
TINY_MAP = {"models": {"gpt2_tiny": {}, "llama_tiny": {"arch": "llama", "n_kv_heads": 2}},
            "seq_lens": [32, 64]}  # fmt: skip


def test_the_map_study_has_twelve_points_of_the_intended_sizes():
    from memopt.runtime.flops import param_count

    cfg = validate_config(load_config_file(ROOT / "config" / "map.yaml"))
    points = map_points(cfg)
    assert len(points) == 12 and len(cfg["techniques"]) == 7
    sizes = {point_models(cfg)[p]: round(param_count(m, 32000) / 1e6) for p, m in points.items()}
    assert sizes == {"gpt2_110m": 122, "llama_128m": 128, "llama_360m": 360, "llama_1b": 1039}
    assert {m["seq_len"] for m in points.values()} == {1024, 4096, 16384}
    assert points["llama_1b_4096"]["n_kv_heads"] == 8 and points["gpt2_110m_1024"]["arch"] == "gpt2"
    assert point_study(cfg, "llama_360m_16384")["model"]["n_layers"] == 24


def test_a_point_is_the_study_model_with_its_keys():
    cfg = validate_config(
        {"model": {"dropout": 0.0}, "map": TINY_MAP, "techniques": {"baseline": {}}}
    )
    points = map_points(cfg)
    assert list(points) == ["gpt2_tiny_32", "gpt2_tiny_64", "llama_tiny_32", "llama_tiny_64"]
    assert points["llama_tiny_64"] == {
        **cfg["model"],
        "arch": "llama",
        "n_kv_heads": 2,
        "seq_len": 64,
    }
    assert map_points(validate_config({"techniques": {"baseline": {}}})) == {}


@pytest.mark.parametrize(
    "models, fragment",
    [
        ({"x": {"arch": "llama", "n_kv_heads": 5}}, "map.models (x_64): model.n_kv_heads: 5"),
        ({"x": {"seq_len": 128}}, "unknown key 'seq_len' in map.models.x"),
        ({"x": {"n_heads": 7}}, "map.models (x_64): model.n_heads: 7 does not divide"),
        ({"Big": {}}, "map.models"),
    ],
)
def test_impossible_points_are_refused_at_load(models, fragment):
    with pytest.raises(ConfigError) as err:
        validate_config({"map": {"models": models, "seq_lens": [64]}, "techniques": {"b": {}},
                         "baseline": "b"})  # fmt: skip
    assert fragment in str(err.value)


def test_the_row_names_what_limited_the_batch():
    model = {"arch": "llama", "n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2,
             "d_ff": 128, "seq_len": 64}  # fmt: skip
    host = "offload: activations: host memory for offloaded activations is out of memory"
    search = {"technique": "off", "status": "ok", "max_batch": 10, "first_failing_batch": 11,
              "seconds": 3.0, "fit": {"fixed_mib": 100.0, "per_sample_mib": 6.4},
              "trials": [{"batch": 10, "fits": True}, {"batch": 11, "fits": False, "error": host}]}  # fmt: skip
    cell = {"status": "ok", "tokens_per_s": 5.0, "memory_breakdown": {"weights_mib": 1.0}}
    row = map_row("p", "m", model, 100, search, cell)
    assert (row["limit"], row["max_tokens"], row["per_token_mib"]) == ("host", 640, 0.1)
    assert row["weights_mib"] == 1.0 and row["logits_mib"] is None
    search["trials"][1]["error"] = "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert map_row("p", "m", model, 100, search, {"status": "oom"})["limit"] == "memory"
    none = {**search, "status": "none_fits", "max_batch": 0, "first_failing_batch": 1,
            "fit": None, "trials": [{"batch": 1, "fits": False, "error": "CUDA out of memory"}]}  # fmt: skip
    row = map_row("p", "m", model, 100, none, {"status": "oom"})
    assert (row["max_tokens"], row["per_token_mib"], row["tokens_per_s"]) == (0, None, None)


def tiny_map_config(tmp_path: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    cfg["study"] = "mapcpu"
    cfg["corpus"]["mirror"] = str((ROOT / cfg["corpus"]["mirror"]).resolve())
    cfg["map"] = TINY_MAP
    cfg["techniques"] = {
        "baseline": {"precision": "fp32", "attention": "math"},
        "ckpt": {"precision": "fp32", "attention": "math", "checkpointing": "full",
                 "loss": "chunked", "loss_chunk": 256},
    }  # fmt: skip
    cfg["batch_sizes"] = ["max"]
    path = tmp_path / "map.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def snakemake(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=1500)  # fmt: skip


def test_the_map_dag_has_a_search_and_a_cell_per_point_and_technique(tmp_path):
    out = snakemake("-n", "--configfile", str(tiny_map_config(tmp_path)), "--directory",
                    str(tmp_path / "run"))  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = dict(line.split()[:2] for line in out.stdout.splitlines()
                  if line.startswith(("map_", "search ", "quality ")))  # fmt: skip
    assert counts == {"map_search": "8", "map_cell": "8", "map_aggregate": "1"}


@pytest.mark.slow  # a tiny map through Snakemake on the CPU (~2 minutes)
def test_a_tiny_map_runs_end_to_end(tmp_path):
    if not (ROOT / "../shared/corpus/speakleash").exists():
        pytest.skip("needs the speakleash mirror beside the checkout")
    out = snakemake("--cores", "2", "--resources", "gpu=1", "--configfile",
                    str(tiny_map_config(tmp_path)), "--directory", str(tmp_path / "run"))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "run" / "results" / "map.csv").open()))
    assert len(rows) == 8
    for row in rows:
        assert row["search_status"] in ("ok", "capped") and int(row["trials"]) <= 8, row
        assert row["cell_status"] == "ok" and float(row["tokens_per_s"]) > 0
        assert int(row["max_tokens"]) == int(row["max_batch"]) * int(row["seq_len"])
