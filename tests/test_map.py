"""The map study (config key `map`): its points, their shapes checked at load, its DAG, its table,
and (pytest -m slow) a tiny map trained end to end on the CPU through Snakemake."""

from __future__ import annotations

import csv
import os
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
        ({"x": {}, "reference": "flash"}, "map.reference: 'flash' is not a technique; allowed: b"),
    ],
)
def test_impossible_points_are_refused_at_load(models, fragment):
    plan = {"models": models, "seq_lens": [64]}
    if "reference" in models:
        plan["reference"] = models.pop("reference")
    with pytest.raises(ConfigError) as err:
        validate_config({"map": plan, "techniques": {"b": {}}, "baseline": "b"})
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
    split = {"status": "ok", "memory_breakdown": {"activations_mib": 10.0, "logits_mib": 4.0}}
    row = map_row("p", "m", model, 100, search, split)  # the logits counted once, as logits
    assert (row["activations_mib"], row["logits_mib"]) == (6.0, 4.0)
    split["memory_breakdown"]["logits_mib"] = -1.0  # kept none
    assert map_row("p", "m", model, 100, search, split)["activations_mib"] == 10.0
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
    assert counts == {"map_search": "8", "map_cell": "8", "map_aggregate": "1", "map_figures": "1",
                      "map_render": "1"}  # fmt: skip


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
    figures = tmp_path / "run" / "paper" / "figures"
    assert sorted(p.name for p in figures.glob("map_*.png")) == [
        "map_memory_shares.png", "map_tokens_by_length.png", "map_tokens_by_size.png"]  # fmt: skip
    paper = (tmp_path / "run" / "paper" / "paper.md").read_text()  # the map's own paper
    assert "## 4 Findings" in paper and "Every job ran on the CPU." in paper


def synthetic_map():
    """A map table whose answers are known: the window pays from 4,096 tokens at every model;
    8-bit AdamW pays only on the largest model; FP32 fits no batch at 16,384 tokens on the
    largest model."""
    import pandas as pd

    rows = []
    for model, arch, params in (("gpt2", "gpt2", 110e6), ("small", "llama", 128e6),
                                ("big", "llama", 1.04e9)):  # fmt: skip
        for n in (1024, 4096, 16384):
            flash = int(2e6 / (1 + params / 1e9) / (1 + n / 8192))
            tokens = {
                "flash": flash,
                "window512": int(flash * (1.0 if n == 1024 else 1.5 * n / 4096)),
                "adamw8bit": int(flash * (1.3 if model == "big" else 1.02)),
                "fp32": 0 if (model == "big" and n == 16384) else flash // 3,
            }
            for t, v in tokens.items():
                row = {"point": f"{model}_{n}", "model": model, "arch": arch, "params": params,
                       "seq_len": n, "technique": t, "max_tokens": v, "max_batch": v // n,
                       "tokens_per_s": (v // n) * (1.5 if t == "window512" else 1.0) or None,
                       "alloc_retries": 2 if model == "big" else 0}  # fmt: skip
                share = {"weights": params * 2 / 2**20, "activations": v / 100}
                rows.append(row | {f"{k}_mib": share.get(k, 1.0) for k in
                                   ("weights", "gradients", "optimizer_state", "activations", "logits", "logits_grad")})  # fmt: skip
    return pd.DataFrame(rows)


def test_where_each_technique_starts_to_pay_is_computed():
    from memopt.report.map_results import map_findings, starts_to_pay

    table = synthetic_map()
    window = starts_to_pay(table, "window512", "flash")
    by_length = {f["at"]: f["from"] for f in window if f["axis"] == "length"}
    assert by_length == {"gpt2": 4096, "small": 4096, "big": 4096}
    adam = {
        f["at"]: f["from"]
        for f in starts_to_pay(table, "adamw8bit", "flash")
        if f["axis"] == "size"
    }
    assert adam == {1024: 1.04e9, 4096: 1.04e9, 16384: 1.04e9}
    fp32 = starts_to_pay(table, "fp32", "flash")
    assert all(f["from"] is None for f in fp32)
    big = next(f for f in fp32 if f["axis"] == "length" and f["at"] == "big")
    assert big["ratios"][16384] == 0.0  # FP32 fits nothing there: a ratio of 0, not left out
    import json

    found = json.loads(json.dumps(map_findings(table, "flash")))  # as the rule writes it
    assert set(found["techniques"]) == {"window512", "adamw8bit", "fp32"}
    # at 1,024 tokens the window's batch is flash's: its speed there (1.5x), nowhere else
    speed = {f["point"]: (f["ratio"], f["retried"]) for f in found["speed"]["window512"]}
    assert speed == {"gpt2_1024": (1.5, False), "small_1024": (1.5, False), "big_1024": (1.5, True)}
    adam = found["speed"]["adamw8bit"]  # one same-batch point (its batch rounds to flash's)
    assert [(f["point"], f["ratio"]) for f in adam] == [("small_16384", 1.0)]
    assert found["speed"]["fp32"] == [] and found["retry_noise"] == 0.14
    # each ratio's noise (memopt.report.noise): the cells' intervals, plus 0.14 where one retried
    noise = {f["point"]: f["noise"] for f in found["speed"]["window512"]}
    assert noise["big_1024"] >= 0.14 > noise["small_1024"]
    assert found["techniques"]["window512"][0] == {
        **found["techniques"]["window512"][0],
        "from": 4096,
    }


def test_map_figures_draw_every_technique_and_mark_none_fits():
    import io

    from memopt.report.map_figures import (
        DODGE,
        FLOOR,
        dodged,
        memory_shares,
        tokens_by_length,
        tokens_by_size,
    )

    table = synthetic_map()
    size = tokens_by_size(table)
    assert len(size.axes) == 3 and size.axes[0].get_title() == "1,024 tokens"
    length = tokens_by_length(table)
    assert [ax.get_title() for ax in length.axes] == ["gpt2", "small", "big"]
    big = length.axes[2]
    crosses = [line for line in big.lines if line.get_marker() == "x" and len(line.get_xdata())]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [16384]  # FP32 at 16,384
    # the cross sits on the x axis (the axes' floor), not at a made-up value of the log scale
    length.draw_without_rendering()
    at = crosses[0].get_transform().transform((16384, 0))[1]
    assert at == pytest.approx(big.transAxes.transform((0, 0))[1]) and not crosses[0].get_clip_on()
    # lines on each other are set apart sideways: at gpt2 flash and window512 train the same
    # maximum and adamw8bit 2% more (one group of three); at big adamw8bit trains 30% more
    order = ["flash", "window512", "adamw8bit", "fp32"]
    assert dodged(table[table["model"] == "gpt2"], "seq_len", order) == {
        "flash": -DODGE, "window512": 0.0, "adamw8bit": DODGE, "fp32": 0.0}  # fmt: skip
    assert dodged(table[table["model"] == "big"], "seq_len", order) == {
        "flash": -DODGE / 2, "window512": DODGE / 2, "adamw8bit": 0.0, "fp32": 0.0}  # fmt: skip
    # ... as drawn: flash's and window512's markers at gpt2's 1,024 tokens, DODGE points apart
    gpt2 = length.axes[0]
    drawn = {ln.get_label(): ln.get_transform().transform((1024, 1))[0] for ln in gpt2.lines
             if ln.get_label() in order}  # fmt: skip
    assert drawn["window512"] - drawn["flash"] == pytest.approx(DODGE * length.dpi / 72)
    # the y axis starts well below the lowest maximum, so a cross is not read as a value
    low = table.loc[table["max_tokens"] > 0, "max_tokens"].min()
    assert big.get_ylim()[0] == pytest.approx(low / FLOOR)
    # two techniques that fit nothing at one length: their crosses set apart too; a figure
    # where nothing fits still draws
    none = table.copy()
    none.loc[(none["point"] == "big_16384") & (none["technique"] == "flash"), "max_tokens"] = 0
    offsets = dodged(none[none["model"] == "big"], "seq_len", order)
    assert offsets["flash"] != offsets["fp32"]
    none["max_tokens"] = 0
    for draw in (tokens_by_length, tokens_by_size):
        draw(none).savefig(io.BytesIO(), format="png")
    # the legend sits below the panels, over no axis; each technique has its own line style,
    # so techniques with the same maxima (lines on each other) stay visible; the x ticks are
    # the measured lengths
    for fig in (size, length):
        fig.draw_without_rendering()
        (legend,) = fig.legends
        box = legend.get_window_extent()
        assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes)
        styles = {(ln.get_linestyle(), ln.get_marker()) for ln in fig.axes[0].lines
                  if ln.get_marker() != "x"}  # fmt: skip
        assert len(styles) == 4  # window512, flash, adamw8bit, fp32
    assert [t.get_text() for t in big.get_xticklabels()] == ["1,024", "4,096", "16,384"]
    assert [t.get_text() for t in size.axes[0].get_xticklabels()] == ["128M", "1.0B"]
    shares = memory_shares(table, "flash")
    heights = [p.get_height() for p in shares.axes[0].patches]
    assert len(heights) == 6 * 9 and all(0 <= h <= 1 for h in heights)


def test_gpu_study_save_keeps_only_whole_points(tmp_path):
    """A machine that ends mid-point hands the next machine only whole points (every technique's
    search and cell), so each point's searches and cells come from one GPU: tools/gpu_study.sh
    save leaves a partial point's results, logs and benchmarks out of the state."""
    import tarfile

    (tmp_path / "tools").mkdir()
    for name in ("gpu_study.sh", "gpu_study_repeats.sh"):
        (tmp_path / "tools" / name).write_bytes((ROOT / "tools" / name).read_bytes())
    (tmp_path / "src").symlink_to(ROOT / "src")
    (tmp_path / "map.yaml").write_bytes((ROOT / "config" / "map.yaml").read_bytes())
    techniques = yaml.safe_load((ROOT / "config" / "map.yaml").read_text())["techniques"]
    files = {"gpt2_110m_1024": [f"{k}" for t in techniques
                                for k in (f"search/{t}", f"cells/{t}/max")],
             "llama_1b_16384": ["search/flash", "cells/flash/max", "search/ckpt_chunked"]}  # fmt: skip
    for point, names in files.items():
        for name in names:
            for path in (
                tmp_path / "results/map" / point / f"{name}.json",
                tmp_path / "logs/map" / point / f"{name}.log",
                tmp_path / "results/benchmarks/map" / point / f"{name}.tsv",
            ):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("{}")
    for name in ("data/study.sha256", "data/study.mtimes", "data/corpus/stats.json",
                 "data/tokens/meta.json", "data/tokenizer/spm.model", ".snakemake/metadata/x"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    env = dict(os.environ, OUT=str(tmp_path / "out"), STUDY_CONFIG="map.yaml",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # fmt: skip
    proc = subprocess.run(["bash", "tools/gpu_study.sh", "save"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    said = "map point llama_1b_16384 has 1/7 techniques done: left out of the state"
    assert said in proc.stdout, proc.stdout + proc.stderr
    names = tarfile.open(tmp_path / "out" / "state.tar.gz").getnames()
    assert (
        sum(n.startswith("results/map/gpt2_110m_1024/") and n.endswith(".json") for n in names)
        == 14
    )
    assert [n for n in names if "llama_1b_16384" in n] == []  # not even flash's finished pair


def test_kept_scores_extrapolate_where_no_batch_fits():
    """Per-token memory of 1 MiB at 1,024 and 1.5 MiB at 2,048 tokens (12 layers, 8 heads):
    512 KiB per 1,024 tokens of length, 2**19 / 1,024 / 96 = 5.33 bytes per layer, head and pair;
    at 4,096 tokens, where nothing fits, one sequence is 4,096 x 2.5 MiB = 10 GiB."""
    from memopt.report.map_analysis import kept_scores

    rows = [{"technique": "fp32", "model": "m", "point": f"m_{n}", "seq_len": n,
             "per_token_mib": mib, "search_status": status}
            for n, mib, status in ((1024, 1.0, "ok"), (2048, 1.5, "ok"), (4096, None, "none_fits"))]  # fmt: skip
    models = [{"name": "m", "n_heads": 8, "n_layers": 12}]
    specs = {"fp32": {"precision": "fp32", "attention": "math"}, "flash": {"attention": "flash"}}
    (q,) = kept_scores(rows, models, specs)
    assert q["bytes"] == pytest.approx(2**19 / 1024 / 96) and not q["about_one"]
    assert q["none_fits"] == [{"point": "m_4096", "gib": pytest.approx(10.0)}]
    assert q["score_bytes"] == 4 and q["lengths"] == [1024, 2048]


def test_a_one_sequence_gain_is_marked_as_the_batchs_granularity():
    """Where the reference fits one sequence and the technique two (llama_1b at 16,384 tokens on
    the H100: flash 1, adamw8bit 2), the 2x is one sequence: the finding says so; where the
    technique fits many more, it does not."""
    from memopt.report.map_results import starts_to_pay

    table = synthetic_map()
    at = table["point"] == "big_16384"
    for technique, batch in (("flash", 1), ("adamw8bit", 2)):
        row = at & (table["technique"] == technique)
        table.loc[row, ["max_batch", "max_tokens"]] = [batch, batch * 16384]
    adam = {f["at"]: f for f in starts_to_pay(table, "adamw8bit", "flash") if f["axis"] == "size"}
    assert adam[16384]["ratio"] == 2.0 and adam[16384]["one_more"] is True
    assert adam[1024]["from"] == 1.04e9 and adam[1024]["one_more"] is False
    never = starts_to_pay(table, "fp32", "flash")
    assert not any(f["one_more"] for f in never)  # it pays nowhere: nothing to mark


def test_map_figures_keep_every_label_on_the_figure():
    """With the map's long point names (llama_360m_16384), the memory-shares figure's rotated
    ticks leave its axis short: its y label must still fit, as every title, tick label and
    legend of the three figures must."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from memopt.report.map_figures import memory_shares, tokens_by_length, tokens_by_size

    table = synthetic_map()
    table["point"] = "llama_360m_" + table["point"]  # as long as the map's names
    for fig in (memory_shares(table, "flash"), tokens_by_length(table), tokens_by_size(table)):
        FigureCanvasAgg(fig).draw()  # as it is saved
        renderer = fig.canvas.get_renderer()
        texts = [*fig.legends]
        for ax in fig.axes:
            lo, hi = sorted(ax.get_ylim())  # a log axis keeps labels of ticks off its view
            ticks = [t for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi]
            texts += [t for t in (ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(),
                                  *ticks) if t.get_text()]  # fmt: skip
        page = fig.bbox
        for t in texts:
            box = t.get_window_extent(renderer)
            assert box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1, t
            assert box.y0 >= page.y0 - 1 and box.y1 <= page.y1 + 1, (t, box, page)


def test_a_fixed_saving_names_the_points_it_leaves_out():
    """llama_1b at 16,384 tokens: flash fits one batch, so its search has no slope and the
    fixed saving cannot be weighed there; the finding names that point."""
    from memopt.report.map_analysis import fixed_savings

    def row(point, technique, per_token, fixed):
        return {"point": point, "technique": technique, "per_token_mib": per_token,
                "fixed_mib": fixed, "seq_len": 10, "max_batch": 20,
                "optimizer_state_mib": 800.0 if technique == "flash" else 200.0}  # fmt: skip

    rows = [row("a", "flash", 1.0, 1000.0), row("a", "adam", 1.0, 400.0),
            row("b", "flash", None, None), row("b", "adam", 1.0, 400.0)]  # fmt: skip
    (found,) = fixed_savings(rows, "flash", 1.1)
    assert found["n"] == 1 and found["without"] == ["b"] and found["state"] is True
    assert found["sequences_min"] == 60.0 and found["needs_max"] == pytest.approx(2.0)
